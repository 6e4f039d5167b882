"""Every view the app's tabs and the exporter draw, of the four bundled models on one photo, with the
options the tabs and the exporter pass, and a fingerprint of each drawing: the reference `test_views.py`
holds the views to. The fixture was recorded before the views moved out of `ModelRun` into
`vitviz/views.py`; remake it only when a view is meant to look different:

    python -m tests.make_view_fingerprints     # rewrites tests/fixtures/views_before_move.json

Per view the fixture keeps its shape, its caption where it has one, and a coarse fingerprint that another
machine's float rounding cannot move by much: the image area-averaged to 24x24x3, in tenths of a grey level.
No bytes: a drawing's bytes depend on the machine that drew it (its CPU, BLAS and vector code), not only on its
name and library versions, so nothing recorded on one machine is compared exactly on another.
"""
from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import cv2
import numpy as np
import torch

import vitviz
from vitviz import explain, views
from vitviz.explain import DEFAULT_MASS
from vitviz.image import read_image
from vitviz.render import per_uniform, shared_scale
from vitviz.session import ModelRun, decode_side

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "views_before_move.json"
PHOTO = ROOT / "assets" / "dog_terrier_puppy.jpg"
MODELS = ("vit-cifar10", "cvt-cifar10", "swin-cifar10", "resnet-cifar10")
SIDE = 24   # the fingerprint's lattice


def bundled_runs() -> list[ModelRun]:
    """The four bundled models, each traced once on the photo, as the app and the command line read it."""
    models = [vitviz.load(name) for name in MODELS]
    image = read_image(PHOTO, target_size=decode_side(models))
    return [ModelRun(loaded, image) for loaded in models]


def drawn_views(run: ModelRun) -> dict[str, tuple[np.ndarray | None, str | None]]:
    """Every view of `run` the tabs and the exporter draw, named by the call that drew it: {name: (image,
    caption)}, either None where a call returns none (a line of words alone: no image); a call that draws
    several views names each by its place in what it returns."""
    h, w = run.canvas.size
    point = (0.4 * w, 0.6 * h)   # a click on the input image, in the run's display frame
    last = len(run.trace.blocks) - 1
    drawn: dict[str, tuple[np.ndarray | None, str | None]] = {}

    def keep(name: str, drawing) -> None:
        if isinstance(drawing, np.ndarray):
            drawn[name] = (drawing, None)
        elif isinstance(drawing, str):   # what a call's views show together, in words
            drawn[name] = (None, drawing)
        elif isinstance(drawing, tuple) and isinstance(drawing[0], np.ndarray):   # (image, caption)
            drawn[name] = drawing
        else:
            for k, item in enumerate(drawing):
                keep(f"{name}[{k}]", item)

    # the first screen (page.render_maps): one colour scale or two, the colour map, upsampling and style
    overview = run.overview_method
    keep(f"map_view({overview})", views.map_view(run, overview))
    values = per_uniform(run.token_map(overview))
    keep(f"map_view({overview}, per uniform, shared scale, inferno, nearest, mask)",
         views.map_view(run, overview, values=values, scale=shared_scale(values), cmap="inferno", mode="nearest",
                        style="mask"))
    # Explain a class (classes.render_gradients, and the notice render_faithfulness shows for a CNN) and the
    # exporter (the map it computed, drawn): every method, a second class, the exporter's rollout knobs
    second = run.top(2)[1].index
    for method, m in explain.METHODS.items():
        keep(f"map_view({method})", views.map_view(run, method))
        if m.targeted and run.applies(method):
            keep(f"map_view({method}, target={second})", views.map_view(run, method, target=second))
    if run.applies("rollout"):
        keep("map_view(rollout, values: head_fusion=max, discard_ratio=0.5)",
             views.map_view(run, "rollout", values=run.token_map("rollout", head_fusion="max", discard_ratio=0.5)))
    # Attention: per layer and head, where a token looks or who looks at it
    keep("attention_view(last, mean)", views.attention_view(run, layer=last))
    keep("attention_view(0, head 1, point)", views.attention_view(run, layer=0, head=0, point=point))
    if run.attends:
        keep("attention_view(last, point, column)",
             views.attention_view(run, layer=last, point=point, direction="column"))
    keep("head_views(last)", views.head_views(run))
    keep(f"head_views(0, point, {DEFAULT_MASS}, outline)",
         views.head_views(run, layer=0, point=point, fraction=DEFAULT_MASS, style="outline"))
    keep(f"head_views(last, {DEFAULT_MASS}, mask)", views.head_views(run, fraction=DEFAULT_MASS, style="mask"))
    keep("model_view()", views.model_view(run))
    keep(f"model_view(point, {DEFAULT_MASS}, mask)",
         views.model_view(run, point=point, fraction=DEFAULT_MASS, style="mask"))
    for layer in sorted({0, min(1, last)}):   # Swin's second block is its first shifted one
        keep(f"window_views({layer}, point)", views.window_views(run, layer=layer, point=point))
    # Tokens: the grids (the exporter's files, the tab's gallery), the norms, the artefacts
    keep("grid_views()", views.grid_views(run))
    keep("grid_gallery()", views.grid_gallery(run))
    keep("grid_gallery(point)", views.grid_gallery(run, point=point))
    keep("norm_view(last)", views.norm_view(run, last))
    keep("norm_view(0)", views.norm_view(run, 0))
    keep("artefact_views()", views.artefact_views(run))
    # Features: per stage, the most active channels, the last layer's patch features
    keep("stage_views()", views.stage_views(run))
    keep("channel_view(last stage)", views.channel_view(run, len(run.trace.features) - 1))
    keep("feature_pca_view()", views.feature_pca_view(run))
    return drawn


def fingerprint(image: np.ndarray) -> np.ndarray:
    """The image area-averaged to 24x24x3, float, in grey levels rounded to 0.1."""
    small = cv2.resize(np.asarray(image, np.float32), (SIDE, SIDE), interpolation=cv2.INTER_AREA)
    return np.round(small, 1)


def encoded(print_: np.ndarray) -> str:
    """A fingerprint in the fixture: its tenths as int16, deflated, base64 (a JSON list would be 10x larger)."""
    return base64.b64encode(zlib.compress(np.round(print_ * 10).astype("<i2").tobytes(), 9)).decode()


def decoded(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), "<i2").reshape(SIDE, SIDE, 3) / 10


def record(run: ModelRun) -> dict:
    """{view name: its shape, fingerprint and caption, each where it has one}."""
    entries = {}
    for name, (image, caption) in drawn_views(run).items():
        entry = {} if image is None else {"shape": list(image.shape), "fingerprint": encoded(fingerprint(image))}
        entries[name] = entry | ({} if caption is None else {"caption": caption})
    return entries


def main() -> None:
    torch.set_num_threads(1)
    fixture = {"photo": PHOTO.name, "views": {run.name: record(run) for run in bundled_runs()}}
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    count = sum(len(v) for v in fixture["views"].values())
    print(f"{count} views of {len(MODELS)} models -> {FIXTURE} ({FIXTURE.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
