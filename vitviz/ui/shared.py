"""What every tab shares: the sessions, the page's common components, views sent as files of their own,
and the checks of a layer or head a person asked for."""
from __future__ import annotations

import functools
import itertools
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder
from PIL import Image

from ..gate import MODEL_GATE
from ..preprocess import prompts_from_text
from ..session import ModelRun
from .store import Session, SessionStore

SESSIONS = SessionStore(int(os.environ.get("VITVIZ_SESSIONS", "16")))
VIEW_QUALITY = 90   # JPEG quality of the drawn views the page shows
# a gallery showing every item whole: Gradio's height "auto" caps a gallery at 55 % of the window and scrolls the
# rest out of sight, and its default fit crops each item to a square
WHOLE = dict(height="fit-content", object_fit="contain")
# events that run a model queue for its slots; re-renders are answered at once, even while a queue waits
MODEL_EVENTS = dict(concurrency_id="model", concurrency_limit=MODEL_GATE.slots)
INSTANT = dict(concurrency_limit=None, show_progress="minimal")
HIDDEN = dict(api_visibility="undocumented")   # an event chain's copy of a documented endpoint
DEFAULT_PROMPTS = "dog, cat, ball, grass"   # what a CLIP model looks for until a person types otherwise


@dataclass
class Page:
    """The components every tab reads: the session key, the clicked point, the input image, the two model
    boxes and the top-level tabs."""
    key: gr.State
    point: gr.State
    image: gr.Image
    model_a: gr.Dropdown
    model_b: gr.Dropdown
    tabs: gr.Tabs


def prompts_of(text) -> list[str]:
    """What a person typed in the prompt box -> CLIP prompts ("dog, ball" -> "a photo of a dog", ...)."""
    try:
        return prompts_from_text(text or "")
    except ValueError as e:
        raise gr.Error(str(e)) from None


def session(key) -> Session:
    return SESSIONS.get(key)


def runs(key) -> list[ModelRun]:
    return SESSIONS.get(key).runs


def layer_slider(depth: int) -> gr.Slider:
    """A layer slider over a model's blocks, on its last one (Gradio has no slider over a single value:
    a one-block model gets 1..2, locked at 1)."""
    return gr.Slider(minimum=1, maximum=max(depth, 2), value=depth, step=1, interactive=depth > 1)


def block_index(run: ModelRun, layer) -> int:
    """A layer slider's 1-based number -> the block index, checked against this model's depth."""
    depth = len(run.trace.blocks)
    if not 1 <= int(layer) <= depth:
        raise gr.Error(f"{run.name} has {depth} layer{'s' * (depth > 1)}: choose a layer from 1 to {depth}.")
    return int(layer) - 1


def head_index(run: ModelRun, block: int, head) -> int | None:
    """A head slider's number (0 = the mean over heads) -> the head index, checked against the block."""
    heads = run.trace.blocks[block].heads
    if not heads:   # a convolutional network: its views say there is no attention
        return None
    if not 0 <= int(head) <= heads:
        raise gr.Error(f"Layer {block + 1} of {run.name} has {heads} head{'s' * (heads > 1)}: choose a head "
                       f"from 1 to {heads}, or 0 for their mean.")
    return None if int(head) == 0 else int(head) - 1


def run_point(run: ModelRun, point):
    """A click on the input image, in the pixels of the image the browser shows (the upload, upright) ->
    the run's display frame. A large JPEG was decoded reduced, so the run's image can be smaller."""
    if point is None:
        return None
    h, w = run.canvas.size
    shown_w, shown_h = run.image.info.get("full_size", run.image.size)
    return point[0] * w / shown_w, point[1] * h / shown_h


def pictures_and_words(items) -> tuple[list, str]:
    """(view, caption) pairs -> (the views for a gallery, their captions as page text, numbered in gallery order):
    a gallery shows a caption cut to its thumbnail's width, page text shows it whole."""
    if len(items) == 1:
        return [items[0][0]], items[0][1]
    return [view for view, _ in items], "\n".join(f"{k}. {caption}" for k, (_, caption) in enumerate(items, 1))


def cache_folder() -> Path:
    """A new folder of this request's own in Gradio's cache folder, which serves what is in it."""
    folder = Path(get_upload_folder()) / f"vitviz-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    return folder


def as_files(fn):
    """`fn` with the views it draws (arrays, alone, in a gallery's list, or as the values of a dict keyed by
    component) returned as JPEG files of their own in Gradio's cache folder, which the sweeper deletes after
    VITVIZ_FILE_TTL. Left to Gradio, an array is encoded as WebP (many times slower than JPEG) into a file
    named by its content and rewritten in place: two people given the same picture at once share that file,
    and one request rewrites it while the other's browser reads it."""
    @functools.wraps(fn)   # Gradio reads the signature for gr.Progress and gr.SelectData
    def with_files(*args, **kwargs):
        folder = functools.cache(cache_folder)   # made on the first view only
        numbers = itertools.count()

        def saved(value):
            if isinstance(value, np.ndarray):
                path = folder() / f"view-{next(numbers)}.jpg"
                Image.fromarray(value).save(path, quality=VIEW_QUALITY)
                return str(path)
            if isinstance(value, list):   # a gallery: views, or (view, caption) pairs
                return [(saved(v[0]), v[1]) if isinstance(v, tuple) else saved(v) for v in value]
            return value

        outputs = fn(*args, **kwargs)
        if isinstance(outputs, dict):
            return {component: saved(v) for component, v in outputs.items()}
        return tuple(saved(v) for v in outputs) if isinstance(outputs, tuple) else saved(outputs)
    return with_files
