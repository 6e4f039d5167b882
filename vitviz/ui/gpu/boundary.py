"""The boundary's core: `spaces.GPU` as a decorator that changes nothing off ZeroGPU, loading the models a call
names (catalog names and Hub ids; local folders only where the owner named them), placing the page's default pair
at the start, and the trace every tab draws from. The package's docstring says why it is shaped so."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np
import torch
from PIL import Image

from ... import hub, render
from ...image import ImageError, read_image
from ...models.trace import Trace
from ...session import autocast, decode_side, trace_batch

try:   # on a ZeroGPU Space app.py imported it before torch; where it is not installed, nothing changes
    import spaces
except ImportError:
    spaces = None

ZERO_GPU = spaces is not None and spaces.config.Config.zero_gpu   # a ZeroGPU Space (SPACES_ZERO_GPU=true)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOCAL_ALLOWED: set[str] = set()   # local folders the server owner named on the command line (set before launch)
STARTING: set[str] = set()        # the default models while the server is still loading them
# Seconds each call may hold a ZeroGPU GPU (ZeroGPU's default: 60). A visitor is scheduled only with that
# much of their daily quota left, and shorter bounds queue first; the time used is what is charged. The GPU
# work is a few passes of the two models, a worker's start (it moves the models to its GPU) and, for a trace,
# loading a model that is not in memory, perhaps from the Hub. Each feature's module sets its own.
TRACE_S, TRACE_LOADING_S = 15, 60


def gpu(*, duration):
    """`spaces.GPU(duration=...)`: on ZeroGPU the call runs in a worker holding a GPU for at most `duration`
    seconds (a number, or a function of the call's arguments); elsewhere the function is returned as it is."""
    return spaces.GPU(duration=duration) if spaces is not None else lambda fn: fn


@dataclass(frozen=True)
class Traced:
    """One model's traced forward on the picture, as it crosses back: its card (`LoadedModel.card`: names,
    labels, preprocessing, no weights), its 1 3 h w pixels and trace (fp32, CPU), and what the Anatomy tab
    draws of its weights: the first pixel convolution's filters (d 3 k k), the position embeddings
    with their grid (None without: CvT, Swin, the CNNs) and each windowed block's relative position bias
    (None without: all but Swin)."""
    card: hub.LoadedModel
    pixels: torch.Tensor
    trace: Trace
    filters: np.ndarray
    positions: tuple[np.ndarray, tuple[int, int]] | None
    biases: list[np.ndarray] | None = None


def load_model(name: str, progress=None) -> hub.LoadedModel:
    """A model the page asked for: catalog names and Hub ids; local folders only if the owner named them.
    One the server is still loading since it started is waited for, never loaded a second time."""
    name = (name or "").strip()
    if not name:
        raise gr.Error("Choose a model for both columns.")
    if progress is not None and name in STARTING:
        progress(0.0, f"waiting for {name}, which the server has been loading since it started")
    try:
        return hub.load(name, device=DEVICE, progress=progress, allow_local=name in LOCAL_ALLOWED)
    except hub.LoadError as e:
        raise gr.Error(str(e)) from None


def place(names) -> None:
    """Load the page's default models onto the device, as the server starts (ZeroGPU moves what is on 'cuda'
    at launch to each worker's GPU), then, off ZeroGPU, `warm_up` them. A model that cannot be loaded is left
    for the first call to explain."""
    STARTING.update(names)
    models = []
    for name in names:
        try:
            models.append(hub.load(name, device=DEVICE, allow_local=name in LOCAL_ALLOWED))
        except hub.LoadError:
            pass   # the first Explain that asks for it tries again and says why
        finally:
            STARTING.discard(name)
    if not ZERO_GPU:   # there the models run in the GPU's workers, never in this process
        warm_up(models)


def warm_up(models: list[hub.LoadedModel]) -> None:
    """What the first answer after a start would pay for once, paid at the start instead: each model traced on a
    blank picture as `trace` traces it (torch's first calls choose kernels and allocate: 60 ms of CvT's 85 on the
    bundled model), and matplotlib imported (Gradio asks for its backend around every event). A warm-up is no
    visitor's pass, so it stays out of `MODEL_GATE`'s count (`bench.py --only coldstart` measures the gain)."""
    import matplotlib  # noqa: F401

    blank = Image.new("RGB", (64, 64))
    for model in models:
        with torch.inference_mode(), autocast(model.device):
            model.model.trace(model.preprocess(blank))


def trace_seconds(upload, names, prompts=None, progress=None) -> int:
    """A trace's GPU time: two traced forwards, and loading (perhaps downloading) a model not in memory."""
    return TRACE_S if not loading_seconds(names) else TRACE_LOADING_S


def models_of(names, progress=None, prompts: list[str] | None = None) -> list[hub.LoadedModel]:
    """The models `names` in this process; a CLIP model among them as a classifier over `prompts` (none: its
    image tower alone, a model without a classifier)."""
    return [prompted(load_model(name, progress), prompts) for name in names]


def prompted(model: hub.LoadedModel, prompts: list[str] | None) -> hub.LoadedModel:
    if not prompts or not model.takes_prompts:
        return model
    try:
        return model.with_prompts(prompts)
    except hub.LoadError as e:
        raise gr.Error(str(e)) from None


@gpu(duration=trace_seconds)
def trace(upload: str, names: list[str], prompts: list[str] | None = None, progress=gr.Progress()) -> tuple:
    """Read the uploaded file at `upload` (every check of `read_image`, decoded no larger than the models and
    views need) and trace each model once on it (a CLIP model as a classifier over `prompts`) -> (the
    picture, a `Traced` per model)."""
    loaded = models_of(names, lambda f, d: progress(0.6 * f, desc=d), prompts)
    progress(0.6, desc="reading the image")
    try:
        picture = read_image(upload, target_size=decode_side(loaded))
    except ImageError as e:
        raise gr.Error(str(e)) from None
    progress(0.7, desc="running both models")
    traced = []
    for model in loaded:
        pixels = model.preprocess(picture)
        traced.append(Traced(card=model.card(), pixels=pixels.cpu(), trace=trace_batch(model, pixels)[0],
                             filters=render.embedding_filters(model.model),
                             positions=render.position_embedding(model.model),
                             biases=render.relative_position_biases(model.model)))
    return picture, traced


def loading_seconds(names) -> int:
    """The GPU time a call adds for loading (perhaps downloading) a model that is not in memory."""
    return 0 if set(names) <= set(hub.CACHE.names()) else TRACE_LOADING_S


def in_words(fn, *args, **kwargs):
    """`fn`'s ValueError (a request a model cannot answer: a class it lacks, say) as the gr.Error whose words
    the page shows (and ZeroGPU relays)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise gr.Error(str(e)) from None

