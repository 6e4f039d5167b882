"""The boundary to the models: the only functions of the app that run a model, and the only ones
`spaces.GPU` decorates.

On a ZeroGPU Space each call runs in a forked worker process that holds a GPU: its arguments and its
result cross by pickle, and whatever it writes into module state stays in the worker. So every
function here takes plain arguments (model names, pixels, map requests) and *returns* what it
computed as detached fp32 CPU tensors or arrays, stacked per model; the app's process keeps them
(`store.py`). Models cross by name, never as objects: each process loads what it asks for into its
own cache (`hub.load`), and the page's default pair is placed on the device at start (`place`), which
is what ZeroGPU moves to each worker's GPU. A message a person must read is raised as `gr.Error`:
ZeroGPU relays only its words (any other exception reaches the page as its class name).

Elsewhere (a CPU machine, a GPU Space) `spaces.GPU` changes nothing and these are plain calls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr
import numpy as np
import torch
from PIL import Image

from .. import catalog, compare, explain, hub, render
from ..export import Decided, decide_reading
from ..gate import MODEL_GATE
from ..image import ImageError, read_image
from ..models.trace import Trace
from ..session import (
    MapRequest,
    ModelRun,
    autocast,
    class_map,
    decode_side,
    faithfulness_scores,
    trace_batch,
)

if TYPE_CHECKING:   # vitviz.concepts is imported where it is used: it brings scipy, a second of the server's start
    from ..concepts.exemplars import Exemplars
    from ..concepts.match import Matches
    from ..concepts.photo import PhotoConcepts, Reader

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
# work is a few passes of the two models (faithfulness: 4 x (steps + 1) forwards), a worker's start (it moves
# the models to its GPU) and, for a trace, loading a model that is not in memory, perhaps from the Hub.
TRACE_S, TRACE_LOADING_S, MAPS_S, FAITHFULNESS_S = 15, 60, 15, 30
# the Compare tab: the logit lens (a traced forward each); CKA over up to 256 uploads (decoding them, and a traced
# forward of each model per batch of 64)
LENS_S, CKA_S = 15, 90
# the Compare tab's receptive fields: a traced forward and one backward per block of each model
RECEPTIVE_S = 30
# the Video tab: the models' cards; a chunk of frames (a traced forward of each model per chunk, and a forward and a
# backward per frame for each targeted method)
CARDS_S, VIDEO_CHUNK_S, VIDEO_FRAME_S = 15, 10, 1.0
# the What decides tab: direct logit attribution (a traced forward each); patching, both sites of both models in
# batched forwards of PATCH_BATCH patched images (CvT-13 at 224 px, group 1: 6,674 images)
DECIDE_S, PATCH_S, PATCH_BATCH = 15, 120, 64
# the Concepts tab: a traced forward of each model and one forward of C + 1 rows (each shown concept removed), and
# a dictionary named by Hub id downloaded the first time
CONCEPTS_S = 30
# local folders of concept dictionaries the server owner allows (VITVIZ_DICTIONARIES, separated as PATH is), with
# every dictionary below them; visitors name the bundled and catalog ones, or Hub ids
LOCAL_DICTIONARIES: set[str] = set(filter(None, os.environ.get("VITVIZ_DICTIONARIES", "").split(os.pathsep)))


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
    return TRACE_S if set(names) <= set(hub.CACHE.names()) else TRACE_LOADING_S


def _models(names, progress=None, prompts: list[str] | None = None) -> list[hub.LoadedModel]:
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
    loaded = _models(names, lambda f, d: progress(0.6 * f, desc=d), prompts)
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


@gpu(duration=MAPS_S)
def class_maps(names: list[str], pixels: list[torch.Tensor], requests: list[list[MapRequest]],
               prompts: list[str] | None = None) -> list[np.ndarray]:
    """The maps each model is asked for (`requests[i]` of model `names[i]` on `pixels[i]`; a forward and a
    backward each; CLIP over `prompts`) -> per model one array, len(requests[i]) gh gw float32."""
    stacked = []
    for model, image, asked in zip(_models(names, prompts=prompts), pixels, requests):
        image = image.to(model.device)
        maps = [in_words(class_map, model.model, image, request) for request in asked]
        stacked.append(np.stack(maps) if maps else np.zeros((0, 0, 0), np.float32))
    return stacked


@gpu(duration=FAITHFULNESS_S)
def faithfulness(names: list[str], pixels: list[torch.Tensor], maps: list[np.ndarray], targets: list[int],
                 steps: int, prompts: list[str] | None = None) -> list[dict]:
    """Deletion and insertion curves of each model's map (and of a random order) for class `targets[i]`,
    their AUCs: plain lists and floats (`session.faithfulness_scores`; CLIP over `prompts`)."""
    curves = []
    for model, image, values, target in zip(_models(names, prompts=prompts), pixels, maps, targets):
        curves += in_words(faithfulness_scores, model.model, image.to(model.device), [values], [target], steps=steps)
    return curves


@dataclass(frozen=True)
class Lens:
    """One classifier's logit lens on the picture, as it crosses back (CPU; L: the blocks the lens reads,
    `explain.lens_layers`): the probability of its final class after each block (L, fp32), and each grid
    token's top class and its probability (L gh gw each)."""
    final_class: np.ndarray
    top_class: np.ndarray
    top_prob: np.ndarray


@gpu(duration=LENS_S)
def lens(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None) -> list[Lens]:
    """The logit lens of each model (a classifier) on its pixels: a traced forward, then every lens block through
    the model's own final norm and head (`explain.final_class_probability`, `explain.patch_top_class`)."""
    readings = []
    for model, image in zip(_models(names, prompts=prompts), pixels):
        with MODEL_GATE(), torch.inference_mode():
            trace = model.model.trace(image.to(model.device), attention=False)   # the lens reads only the tokens
            final = in_words(explain.final_class_probability, model.model, trace)[0]
            tops = [in_words(explain.patch_top_class, model.model, trace, block)
                    for block in explain.lens_layers(trace)]
        readings.append(Lens(final_class=final.float().cpu().numpy(),
                             top_class=torch.cat([top for top, _ in tops]).cpu().numpy(),
                             top_prob=torch.cat([prob for _, prob in tops]).float().cpu().numpy()))
    return readings


@gpu(duration=RECEPTIVE_S)
def receptive(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None
              ) -> list[explain.ReceptiveField]:
    """Every block's effective receptive field of each model on its pixels (`explain.receptive_field`: a traced
    forward, then one backward per block from its centre token), on the CPU, fp32."""
    found = []
    for model, image in zip(_models(names, prompts=prompts), pixels):
        with MODEL_GATE():
            field = in_words(explain.receptive_field, model.model, image.to(model.device))
        found.append(replace(field, maps=field.maps.float().cpu(), centres=field.centres.float().cpu()))
    return found


@gpu(duration=CARDS_S)
def cards(names: list[str], prompts: list[str] | None = None) -> list[hub.LoadedModel]:
    """The models' cards (names, labels, preprocessing; no weights): what the Video tab needs before its first
    frames, to decode them no larger than the models need and to draw them."""
    return [model.card() for model in _models(names, prompts=prompts)]


def video_seconds(names, pixels, methods, prompts=None) -> int:
    """A chunk's GPU time: a traced forward of each model, a backward per frame of each targeted method."""
    targeted = sum(explain.method(m).targeted for m in methods)
    return int(VIDEO_CHUNK_S + VIDEO_FRAME_S * len(pixels[0]) * (1 + targeted)) + (
        0 if set(names) <= set(hub.CACHE.names()) else TRACE_LOADING_S)


@gpu(duration=video_seconds)
def video_frames(names: list[str], pixels: list[torch.Tensor], methods: list[str],
                 prompts: list[str] | None = None) -> list:
    """One chunk of a video's frames through each model (`pixels[i]`: b 3 h w, model `names[i]`'s preprocessing):
    per model a `video.BatchReading` (each frame's top 5 and maps, plain arrays)."""
    from ..video import read_batch

    return [in_words(read_batch, model, image, methods)
            for model, image in zip(_models(names, prompts=prompts), pixels)]


def cka_seconds(names, uploads, tokens, progress=None) -> int:
    """CKA's GPU time: decoding the uploads and both models over them, and loading a model not in memory."""
    return CKA_S + (0 if set(names) <= set(hub.CACHE.names()) else TRACE_LOADING_S)


@gpu(duration=cka_seconds)
def cka(names: list[str], uploads: list[str], tokens: str, progress=gr.Progress()) -> compare.CKAResult:
    """Read each uploaded file (every check of `read_image`; a file that fails is named) and compute minibatch
    CKA between every layer of both models over them (`compare.cka_of_images`): float64 matrices."""
    loaded = _models(names, lambda f, d: progress(0.1 * f, desc=d))
    side = decode_side(loaded)
    images = []
    for k, upload in enumerate(uploads):
        progress(0.1 + 0.2 * k / len(uploads), desc=f"reading image {k + 1} of {len(uploads)}")
        try:
            images.append(read_image(upload, target_size=side))
        except ImageError as e:
            raise gr.Error(f"{Path(upload).name}: {e}") from None
    with MODEL_GATE():
        return in_words(compare.cka_of_images, loaded, images, tokens=tokens,
                        progress=lambda f, d: progress(0.3 + 0.7 * f, desc=d))


@gpu(duration=DECIDE_S)
def decide(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None) -> list[Decided]:
    """Each model's (a classifier's) direct logit attribution of its top class on its pixels: a traced forward
    that keeps how the heads write, read through the frozen final norm (`export.decide_reading`: the table
    decide.json holds and every head's token effects, as the exporter writes them)."""
    readings = []
    for model, image in zip(_models(names, prompts=prompts), pixels):
        with MODEL_GATE():
            readings.append(in_words(decide_reading, model.model, image.to(model.device), model.labels))
    return readings


def patch_seconds(names, pixels, against, upload, group, prompts=None, progress=None) -> int:
    """Patching's GPU time: the batched forwards of both sites of both models, and loading a model not in
    memory."""
    return PATCH_S + (0 if set(names) <= set(hub.CACHE.names()) else TRACE_LOADING_S)


@gpu(duration=patch_seconds)
def patch(names: list[str], pixels: list[torch.Tensor], against: str, upload: str | None, group: int,
          prompts: list[str] | None = None, progress=gr.Progress()) -> list[tuple[explain.Patching, explain.Patching]]:
    """Activation patching of each model (a classifier) from a second image towards its pixels: `against` one
    of `explain.CORRUPTIONS` (the same pixels blurred or with noise) or 'upload' (the file at `upload`, read
    with every check of `read_image` and preprocessed by each model's own transform). Per model the residual
    stream in `group` x `group` squares and every head's output (`explain.patch_activations`, `PATCH_BATCH`
    patched images per forward) -> (resid, head) `Patching`s on the CPU, fp32 (head: None for a model without
    attention)."""
    loaded = _models(names, lambda f, d: progress(0.1 * f, desc=d), prompts)
    picture = None
    if against == "upload":
        try:
            picture = read_image(upload, target_size=decode_side(loaded))
        except ImageError as e:
            raise gr.Error(f"The second image: {e}") from None
    found, runs = [], [(model, site) for model in loaded for site in explain.SITES]
    for k, (model, site) in enumerate(runs):
        clean = pixels[k // len(explain.SITES)].to(model.device)
        corrupted = model.preprocess(picture) if picture is not None else explain.corrupt(clean, against)
        words = "the residual stream" if site == "resid" else "each head's output"

        def step(done, total, k=k, name=model.name, words=words):
            progress(0.1 + 0.9 * (k + done / total) / len(runs), desc=f"{name}: {words}, forward {done} of {total}")
        with MODEL_GATE():
            try:
                result = explain.patch_activations(model.model, clean, corrupted, site=site, group=group,
                                                   batch_size=PATCH_BATCH, progress=step)
            except explain.NoAttention:   # a convolutional network has no heads to patch
                found.append(None)
                continue
            except ValueError as e:   # what `in_words` says, for the other requests a model cannot answer
                raise gr.Error(str(e)) from None
        cpu = lambda values: [v.float().cpu() for v in values]
        found.append(replace(result, grid=cpu(result.grid), prefix=cpu(result.prefix),
                             heads=None if result.heads is None else result.heads.float().cpu()))
    return list(zip(found[::2], found[1::2]))


# ---- the Concepts tab ---------------------------------------------------------------------------------------

Region = tuple[float, float, float, float]   # (y0, x0, y1, x1): a map's extent, in fractions of its photo's h and w


def dictionary_source(text) -> str:
    """What a person typed in a dictionary box -> the source `concepts.load` reads ('' for none): a bundled or
    catalog dictionary, a Hub id (`owner/name[@revision]`), or a path below a folder the server owner allows
    (`LOCAL_DICTIONARIES`); any other path on the server is refused in words."""
    text = (text or "").strip()
    if not text or text in catalog.BUNDLED_DICTIONARIES or text in catalog.DICTIONARIES:
        return text
    path = Path(text).expanduser()
    if (path.exists() or text.startswith(("/", ".", "~"))) and not allowed_path(path):
        raise gr.Error(f"{text} is a path on the server, and the app reads local dictionaries only below the folders "
                       f"its owner allows (VITVIZ_DICTIONARIES). Name a bundled dictionary "
                       f"({', '.join(catalog.BUNDLED_DICTIONARIES)}) or a Hub id (owner/name).")
    return text


def allowed_path(path: Path) -> bool:
    """Whether `path` (symbolic links resolved) is one of `LOCAL_DICTIONARIES` or below one."""
    resolved = path.expanduser().resolve()
    return any(resolved.is_relative_to(Path(folder).expanduser().resolve()) for folder in LOCAL_DICTIONARIES)


def dictionary_folder(source: str) -> Path | None:
    """The folder a dictionary is read from, which holds its exemplar index: a bundled one's or an allowed local
    one's; None for one fetched from the Hub."""
    if source in catalog.BUNDLED_DICTIONARIES:
        return catalog.BUNDLED_DICTIONARIES[source].path
    path = Path(source).expanduser()
    if source and source not in catalog.DICTIONARIES and path.exists() and allowed_path(path):
        return path if path.is_dir() else path.parent
    return None


def map_region(trace: Trace, block: int, transform, image_size: tuple[int, int]) -> Region:
    """Where block `block`'s grid lies on a photo of `image_size` (h, w) through the model's `transform`: its tokens'
    tiles (`align.token_rectangles`) in fractions of the photo, clipped to it. The cells of a dictionary across
    models cut the same region (`photo.photo_codes` aligns the tiles with the whole photo)."""
    from ..concepts.align import in_photo, token_rectangles

    tiles = in_photo(token_rectangles(trace, block), transform, image_size)
    low, high = tiles[:, :2].min(0).values.clamp(0, 1), tiles[:, 2:].max(0).values.clamp(0, 1)
    return tuple(float(v) for v in (*low, *high))


@dataclass(frozen=True, eq=False)
class ConceptImage:
    """One of a concept's top images from its exemplar index, as it crosses back: the thumbnail (h w 3 uint8), the
    concept's code on its grid (gh gw float32) and where that grid lies on it, its value (the largest code) and
    its class (None where the data set has no labels). Equal by content, its arrays' bytes included, so what is
    drawn of it can be kept (`ui.concepts.exemplar_tiles`) on ZeroGPU too, where it crosses as a copy."""
    thumbnail: np.ndarray
    map: np.ndarray
    region: Region
    value: float
    label: str | None

    def _content(self) -> tuple:
        return (self.thumbnail.shape, self.thumbnail.tobytes(), self.map.shape, self.map.tobytes(), self.region,
                self.value, self.label)

    def __eq__(self, other) -> bool:
        return isinstance(other, ConceptImage) and self._content() == other._content()

    def __hash__(self) -> int:
        return hash(self._content())


@dataclass(frozen=True)
class Removal:
    """What removing a concept from the block's output does to the model's top class on the photo (`Reader.read`,
    through `splice.concept_effects`): its probability with nothing removed, and per concept removed its
    probability and the top class without it."""
    target: str
    probability: float
    without: dict[int, tuple[float, str]]


@dataclass(frozen=True)
class ConceptReading:
    """One model's dictionary on the photo, as it crosses back (plain arrays, CPU). `concepts` are the C shown, in
    order: the photo's most active on the grid (`top`) and those most active at the class token (`class_top`, for
    a dictionary that reads it), or, with one dictionary across both models, those both fire first; for each its
    mean code over the grid, the share of the grid's cells it fires on, its map, its top images and how often it
    fires over the data set of its exemplar index (None without an index: `exemplar_words` says why). `removal`:
    the prediction with each removed (None: `removal_words` says why). `at_cells`: the concepts active at each
    cell (row-major), strongest first, as `PhotoConcepts.at` gives them. `partners`: with two separate
    dictionaries and their match, each shown concept's matched concept of the other model, their correlation and
    its mean code there on this photo (None: no partner)."""
    source: str
    model: str
    block: int                     # counted from 0
    tokens: str
    n_concepts: int
    grid: tuple[int, int]
    region: Region
    top: np.ndarray
    class_top: list[tuple[int, float]] | None   # the class token's strongest concepts and their codes
    concepts: np.ndarray
    activation: np.ndarray
    on_photo: np.ndarray
    maps: np.ndarray               # C gh gw
    at_cells: list[list[tuple[int, float]]]
    exemplars: list[list[ConceptImage]] | None
    exemplar_words: str
    frequency: np.ndarray | None   # C: the share of the data set's grid tokens each fires on
    data: str | None               # the exemplar index's data set
    removal: Removal | None
    removal_words: str
    partners: list[tuple[int, float, float] | None] | None = None


@dataclass(frozen=True)
class Concepts:
    """`concepts`' answer: per model its reading, or why it has none in words; with one dictionary across both
    models the photo's concepts both fire (`both`) and those only each one does (`only`); with two separate
    dictionaries, why there are no matched pairs (`match_words`, '' where their match was found)."""
    columns: list[ConceptReading | str]
    both: list[int] | None = None
    only: tuple[list[int], list[int]] | None = None
    match_words: str = ""


def bound_dictionaries(loaded: list[hub.LoadedModel], sources: list[str]) -> list[Reader | str]:
    """Each model's dictionary (`photo.readers`), or why it has none, in words. One source named for both models
    is bound to both at once: a dictionary across models serves each of them."""
    from ..concepts import ConceptsError
    from ..concepts.photo import readers

    groups = [(list(range(len(loaded))), sources[0])] if len(set(sources)) == 1 else \
        [([i], source) for i, source in enumerate(sources)]
    bound: list[Reader | str] = [""] * len(loaded)
    for positions, source in groups:
        if not source:
            for i in positions:
                bound[i] = f"No dictionary is chosen for {loaded[i].name}: name one in its box."
            continue
        try:
            found = readers([loaded[i] for i in positions], [source])
        except ConceptsError as e:
            found = [str(e)] * len(positions)
        for i, reader in zip(positions, found):
            bound[i] = f"{source} holds no dictionary of {loaded[i].name}." if reader is None else reader
    return bound


@lru_cache(maxsize=16)   # a process loads and binds each pair of dictionaries once; the readers are not changed
def bound_dictionaries_of(names: tuple[str, ...], sources: tuple[str, ...],
                          prompts: tuple[str, ...] | None) -> tuple[Reader | str, ...]:
    """`bound_dictionaries` of the models `names` (with `prompts` for CLIP), kept."""
    return tuple(bound_dictionaries(_models(list(names), prompts=None if prompts is None else list(prompts)),
                                    list(sources)))


@lru_cache(maxsize=32)   # a process reads each dictionary's index once (its checksum alone costs a pass)
def exemplar_index(reader: Reader) -> tuple[Exemplars | None, str]:
    """The exemplar index of `reader`'s dictionary in its folder (`exemplars.file_name`'s files: a dictionary across
    models has one per model; the one built from these weights), or None and why not, in words."""
    from ..concepts import ConceptsError
    from ..concepts.exemplars import file_name as exemplar_file, load_exemplars

    folder = dictionary_folder(reader.source)
    if folder is None:
        return None, f"{reader.source} comes from the Hub, where vitviz finds no exemplar index."
    refused = []
    for path in sorted(folder.glob(f"{Path(exemplar_file()).stem}*.safetensors")):
        try:
            return load_exemplars(path, dictionary=reader.dictionary), ""
        except ConceptsError as e:
            refused.append(str(e))
    if len(refused) == 1:
        return None, refused[0]
    if refused:
        return None, (f"None of the {len(refused)} exemplar indexes in {folder} was built from {reader.model}'s "
                      f"dictionary.")
    return None, f"{reader.source} has no exemplar index ({exemplar_file()} in its folder) yet."


@lru_cache(maxsize=4096)   # the thumbnails of the concepts shown, decoded once a process
def top_images(index: Exemplars, concept: int) -> list:
    """`index.of(concept)`, kept."""
    return index.of(concept)


def exemplar_images(index: Exemplars, concept: int, run: ModelRun, block: int) -> list[ConceptImage]:
    """Concept `concept`'s top images from `index`, each with where its map lies on the thumbnail (the model's grid
    over the thumbnail's size; an index across models was built on the cells of the region every model saw,
    which is each model's own where all of them read the whole image, as the bundled ones do)."""
    regions: dict[tuple[int, int], Region] = {}
    shown = []
    for exemplar in top_images(index, concept):
        thumbnail = np.asarray(exemplar.image)
        size = thumbnail.shape[:2]
        if size not in regions:
            regions[size] = map_region(run.trace, block, run.loaded.transform, size)
        shown.append(ConceptImage(thumbnail=thumbnail, map=np.asarray(exemplar.map, np.float32), region=regions[size],
                                  value=float(exemplar.value), label=exemplar.label))
    return shown


def removal(run: ModelRun, photo: PhotoConcepts) -> Removal | None:
    """What `Reader.read` measured of removing the photo's concepts, keyed by concept (None where it measured none:
    `photo.no_removal` says why)."""
    if photo.without is None:
        return None
    return Removal(target=run.label(photo.target), probability=photo.probability,
                   without={int(c): (float(p), run.label(int(top)))
                            for c, p, top in zip(photo.removed, photo.without, photo.top_without)})


def matched(bound: list[Reader]) -> tuple[Matches | None, bool, str]:
    """The match of two separate dictionaries (`concepts.match`), read from the folder `match-<left>-<right>` (or
    `match-<right>-<left>`: then `swapped`) beside their folders: (matches, swapped, ''), or (None, False, why
    not, in words)."""
    from ..concepts import ConceptsError
    from ..concepts.match import Matches, folder_name

    folders = [dictionary_folder(reader.source) for reader in bound]
    if None in folders:
        return None, False, ("Matched pairs are read from a match folder beside both dictionaries' folders; a "
                             "dictionary from the Hub has none.")
    for (a, b), swapped in (((folders[0], folders[1]), False), ((folders[1], folders[0]), True)):
        folder = a.parent / folder_name(a.name, b.name)
        if not folder.is_dir():
            continue
        try:
            found = Matches.load(folder)
        except ConceptsError as e:
            return None, False, str(e)
        sides = found.sides[::-1] if swapped else found.sides
        if any(side["model"] != reader.model or side["dictionary"]["n_concepts"] != reader.dictionary.n_concepts
               for side, reader in zip(sides, bound)):
            return None, False, (f"{folder} matches dictionaries of {sides[0]['model']} and {sides[1]['model']}, not "
                                 f"these: match the two again.")
        return found, swapped, ""
    return None, False, (f"no match of {bound[0].source} with {bound[1].source} is at hand (`python -m vitviz "
                         f"concepts match {bound[0].source} {bound[1].source} --data DATA --out "
                         f"{folder_name(folders[0].name, folders[1].name)}`, run in the folder that holds both, makes "
                         f"one; "
                         f"then its pairs are shown here).")


def own_concepts(photo: PhotoConcepts) -> np.ndarray:
    """The concepts a column shows for a dictionary of its model alone: the photo's most active on the grid, then
    those most active at the class token that are not among them."""
    at_class = [] if photo.class_top is None else photo.class_top.tolist()
    return np.array(list(dict.fromkeys([*photo.top.tolist(), *at_class])), dtype=np.int64)


def column_reading(run: ModelRun, reader: Reader, photo: PhotoConcepts, shown: np.ndarray,
                   partners: list | None) -> ConceptReading:
    """One model's `ConceptReading` of the concepts `shown`, from its photo's codes."""
    index, exemplar_words = exemplar_index(reader)
    codes = photo.codes[:, shown]
    class_top = None if photo.class_top is None else [(int(c), float(photo.class_codes[c])) for c in photo.class_top]
    return ConceptReading(
        source=reader.source, model=reader.model, block=reader.block, tokens=reader.tokens,
        n_concepts=reader.dictionary.n_concepts, grid=photo.grid,
        region=map_region(run.trace, reader.block, run.loaded.transform, (run.image.height, run.image.width)),
        top=photo.top, class_top=class_top, concepts=shown, activation=codes.mean(0), on_photo=(codes > 0).mean(0),
        maps=codes.T.reshape(len(shown), *photo.grid), at_cells=[photo.at(cell) for cell in range(len(photo.codes))],
        exemplars=None if index is None else [exemplar_images(index, int(c), run, reader.block) for c in shown],
        exemplar_words=exemplar_words, frequency=None if index is None else index.frequency[shown].numpy(),
        data=None if index is None else index.data, removal=removal(run, photo),
        removal_words=photo.no_removal or "", partners=partners)


@gpu(duration=CONCEPTS_S)
def concepts(names: list[str], picture: Image.Image, pixels: list[torch.Tensor], sources: list[str],
             prompts: list[str] | None = None) -> Concepts:
    """The two models' concepts on their `pixels` of `picture`, through the dictionaries `sources[i]`
    (`dictionary_source`'s; one source for both: one concept space, read as a dictionary across models where it
    is one): a traced forward each, the codes and each top concept removed (`photo.Reader.read`), each shown
    concept's top images from its exemplar index and, for two separate dictionaries, their matched pairs where a
    match is at hand. Plain arrays, CPU."""
    from ..concepts.photo import Reader, shared_concepts

    loaded = _models(names, prompts=prompts)
    bound = bound_dictionaries_of(tuple(names), tuple(sources), None if prompts is None else tuple(prompts))
    runs, photos = [], []
    for model, image, reader in zip(loaded, pixels, bound):
        image = image.to(model.device)
        with MODEL_GATE(), torch.inference_mode():
            run = ModelRun(model, picture, pixels=image, trace=model.model.trace(image, attention=False))
            if isinstance(reader, Reader):
                reader.dictionary.to(model.device)
                photos.append(reader.read(run))
            else:
                photos.append(None)
        runs.append(run)
    shown = [None if photo is None else own_concepts(photo) for photo in photos]
    both = only = None
    found, swapped, match_words = None, False, ""
    if None not in photos and len(set(sources)) == 1:   # one concept space: the same concept in both columns
        both, *only = shared_concepts(*photos)
        only = tuple(only)
        shown = [np.array(both + mine, dtype=np.int64) for mine in only]
    elif None not in photos:
        found, swapped, match_words = matched(bound)
    columns: list[ConceptReading | str] = []
    for i, (run, reader, photo) in enumerate(zip(runs, bound, photos)):
        if photo is None:
            columns.append(reader)
            continue
        partners = None
        if found is not None:
            other = photos[1 - i].codes
            pairs = [found.partner(int(c), side=i ^ swapped) for c in shown[i]]
            partners = [None if pair is None else (*pair, float(other[:, pair[0]].mean())) for pair in pairs]
        columns.append(column_reading(run, reader, photo, shown[i], partners))
    return Concepts(columns=columns, both=both, only=only, match_words=match_words)


def in_words(fn, *args, **kwargs):
    """`fn`'s ValueError (a request a model cannot answer: a class it lacks, say) as the gr.Error whose words
    the page shows (and ZeroGPU relays)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise gr.Error(str(e)) from None

