"""One image, N models: preprocess and trace once per model, keep the traces, compute maps and
views on demand from them (cached), so a slider move never reruns a model.

    runs = explain_image(image, [vitviz.load("vit-cifar10"), vitviz.load("cvt-cifar10")])
    runs[0].top(5), runs[0].token_map("rollout"), runs[0].view("rollout")

Every model pass goes through `MODEL_GATE`, which bounds how many run at once (the app's GPU or
CPU is never oversubscribed, whoever calls).
"""
from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from . import explain, render
from .models.trace import Trace
from .render.geometry import MAX_SIDE
from .render.grid import KIND_NAMES

METHODS = {   # name -> what captions call it; the public names of the map methods
    "rollout": "attention rollout",
    "grad-rollout": "gradient rollout",
    "chefer": "Chefer relevance",
}


class ModelGate:
    """A bounded number of model passes at once, with a record of the most ever seen running."""

    def __init__(self, slots: int):
        self.slots = slots
        self._semaphore = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self.running = self.peak = self.passes = 0

    @contextmanager
    def __call__(self):
        with self._semaphore:
            with self._lock:
                self.running += 1
                self.passes += 1
                self.peak = max(self.peak, self.running)
            try:
                yield
            finally:
                with self._lock:
                    self.running -= 1


MODEL_GATE = ModelGate(int(os.environ.get("VITVIZ_MODEL_SLOTS", "1")))


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    prob: float


def autocast(device: torch.device):
    """bf16 autocast on CUDA (the maps are read in fp32 afterwards); plain fp32 elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def trace_batch(loaded, pixels: torch.Tensor) -> list[Trace]:
    """One traced forward for a batch, split into one trace per image (tensors on the CPU, fp32)."""
    with MODEL_GATE(), torch.inference_mode(), autocast(pixels.device):
        trace = loaded.model.trace(pixels)
    cpu = lambda t: t.float().cpu()
    return [Trace(logits=cpu(trace.logits[i:i + 1]),
                  blocks=[replace(b, attn=cpu(b.attn[i:i + 1]), tokens=cpu(b.tokens[i:i + 1])) for b in trace.blocks],
                  embeddings=trace.embeddings, features=[cpu(f[i:i + 1]) for f in trace.features],
                  input_size=trace.input_size)
            for i in range(pixels.shape[0])]


class ModelRun:
    """One model on one image: its pixels, its trace, and every map and view asked of it so far."""

    def __init__(self, loaded, image: Image.Image, *, pixels: torch.Tensor | None = None, trace: Trace | None = None):
        self.loaded = loaded
        self.image = image
        self.pixels = loaded.preprocess(image) if pixels is None else pixels   # 1 3 h w on the model's device
        self.trace = trace_batch(loaded, self.pixels)[0] if trace is None else trace
        self.probs = self.trace.logits[0].softmax(dim=-1)
        self.canvas = render.Canvas(image, loaded.transform, self.trace.embeddings)
        self._maps: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.loaded.name

    def top(self, k: int = 5) -> list[Prediction]:
        probs, indices = self.probs.topk(min(k, len(self.probs)))
        return [Prediction(int(i), self.loaded.labels[int(i)], float(p)) for p, i in zip(probs, indices)]

    def label(self, index: int) -> str:
        return self.loaded.labels[index]

    def target(self, target: int | None) -> int:
        if target is None:
            return int(self.probs.argmax())
        if not 0 <= target < len(self.probs):
            raise ValueError(f"target class {target} is not one of the model's {len(self.probs)} classes")
        return target

    def _cached(self, key: tuple, compute) -> np.ndarray:
        with self._lock:   # two re-renders of the same map wait for one computation
            if key not in self._maps:
                self._maps[key] = compute()
            return self._maps[key]

    def token_map(self, method: str, *, target: int | None = None, head_fusion: str = "mean",
                  discard_ratio: float = 0.0, start_layer: int = 0) -> np.ndarray:
        """gh gw float32 on the last token grid: 'rollout' (no target), 'grad-rollout' or 'chefer'."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        if method == "rollout":
            key = (method, head_fusion, discard_ratio, start_layer)
            return self._cached(key, lambda: explain.attention_rollout(
                self.trace, head_fusion=head_fusion, discard_ratio=discard_ratio, start_layer=start_layer)[0].numpy())
        target = self.target(target)
        if method == "grad-rollout":
            compute = lambda: explain.gradient_rollout(self.loaded.model, self.pixels, [target],
                                                       discard_ratio=discard_ratio, start_layer=start_layer)
        else:
            compute = lambda: explain.chefer_relevance(self.loaded.model, self.pixels, [target], start_layer=start_layer)

        def gated():
            with MODEL_GATE():
                return compute()[0].detach().float().cpu().numpy()
        return self._cached((method, target, discard_ratio, start_layer), gated)

    def attention_map(self, *, layer: int, head: int | None = None, point: tuple[float, float] | None = None,
                      direction: str = "row") -> np.ndarray:
        """One block's raw attention on its query grid: the class token's row (or, with a display
        `point`, that token's row: where it looks; direction='column': who looks at it)."""
        block = self.trace.blocks[layer]
        token = self._token_at(point, block) if point is not None else None
        if direction == "column":
            if token is None or isinstance(token, str):
                raise ValueError("pick a point on the image to see who looks at it")
            values = explain.key_attention(self.trace, layer=layer, patch=token, head=head)
        else:
            if token is None:
                token = block.prefix_kinds[0] if block.prefix_kinds else self._centre_token(block)
            values = explain.query_attention(self.trace, layer=layer, query=token, head=head, on_query_grid=True)
        return values[0].numpy()

    def _token_at(self, point, block):
        field = self.canvas.field(block.stage)
        return self.canvas.token_at(point, field)

    @staticmethod
    def _centre_token(block) -> tuple[int, int]:
        return block.query_grid[0] // 2, block.query_grid[1] // 2

    def faithfulness(self, method: str, *, target: int | None = None, steps: int = 16) -> dict:
        """Deletion and insertion curves of a method's map and of a random order, with their AUCs."""
        target = self.target(target)
        saliency = torch.from_numpy(self.token_map(method, target=target))[None]
        curves = {}
        with MODEL_GATE():
            for name, order in (("map", saliency), ("random", explain.random_saliency(saliency))):
                for kind, curve in (("deletion", explain.deletion_curve), ("insertion", explain.insertion_curve)):
                    c = curve(self.loaded.model, self.pixels, order.to(self.pixels.device), target=[target], steps=steps)
                    curves[f"{kind}/{name}"] = c
        fractions = next(iter(curves.values())).fractions
        return {"target": target, "fractions": fractions.tolist(),
                **{k: {"scores": c.scores[0].tolist(), "auc": float(c.auc[0])} for k, c in curves.items()}}

    # -- views: captioned h w 3 uint8 images in the original image's frame --------------------------------

    def map_view(self, method: str, *, values: np.ndarray | None = None, target: int | None = None,
                 scale: tuple[float, float] | None = None, mode: str = "bilinear", style: str = "heatmap",
                 cmap: str = render.DEFAULT_CMAP, **params) -> np.ndarray:
        """A method's map over the image with its colour bar; `values` (e.g. per-uniform units) and
        `scale` (vmin, vmax) let several panels share one colour scale."""
        if values is None:
            values = self.token_map(method, target=target, **params)
        vmin, vmax = scale if scale is not None else (float(values.min()), float(values.max()))
        view = render.overlay(self.canvas, values, mode=mode, style=style, cmap=cmap, vmin=vmin, vmax=vmax)
        view = render.with_colorbar(view, vmin=vmin, vmax=vmax, cmap=cmap)
        label = None if method == "rollout" else self.label(self.target(target))
        return render.caption(view, model=self.name, method=METHODS[method], target=label)

    def attention_view(self, *, layer: int, head: int | None = None, point: tuple[float, float] | None = None,
                       direction: str = "row", cmap: str = render.DEFAULT_CMAP) -> np.ndarray:
        values = self.attention_map(layer=layer, head=head, point=point, direction=direction)
        block = self.trace.blocks[layer]
        view = render.overlay(self.canvas, values, field=block.stage, cmap=cmap, point=point)
        what = ("who looks at the chosen token" if direction == "column" else
                "where the chosen token looks" if point is not None else
                f"where the {'class token' if block.prefix_kinds[:1] == ('cls',) else 'centre token'} looks")
        view = render.with_colorbar(view, vmin=float(values.min()), vmax=float(values.max()), cmap=cmap)
        return render.caption(view, model=self.name, method=f"attention: {what}", layer=layer + 1,
                              head="mean" if head is None else head + 1,
                              note=f"stage {block.stage + 1}" if len(self.trace.embeddings) > 1 else None)

    def grid_views(self, *, point: tuple[float, float] | None = None) -> list[np.ndarray]:
        """How the model cuts the image into tokens: ViT's patch grid, or each CvT stage's lattice."""
        fields = self.canvas.fields
        if len(fields) == 1 and fields[0].stride == fields[0].size:
            kinds = self.trace.blocks[0].prefix_kinds
            view = render.patch_grid(self.canvas, prefix_kinds=kinds, point=point)
            return [render.caption(view, model=self.name, method="patch grid",
                                   note=render.prefix_legend(kinds, fields[0].grid))]
        return [render.caption(view, model=self.name, method=f"stage {i + 1} tokens")
                for i, view in enumerate(render.stage_grids(self.canvas, point=point))]

    def stage_views(self) -> list[np.ndarray]:
        """Per stage: the features' first three principal components as RGB, and the per-token norms."""
        views = []
        for i, features in enumerate(self.trace.features):
            views.append(render.caption(render.stage_pca(self.canvas, features[0], stage=i), model=self.name,
                                        method=f"stage {i + 1} features: PCA as RGB"))
            views.append(render.caption(render.feature_norm(self.canvas, features[0], stage=i), model=self.name,
                                        method=f"stage {i + 1} features: token L2 norm"))
        return views

    def channel_view(self, stage: int) -> np.ndarray:
        return render.caption(render.channel_gallery(self.canvas, self.trace.features[stage][0], stage=stage),
                              model=self.name, method=f"stage {stage + 1}: most active channels")

    def norm_view(self, layer: int) -> np.ndarray:
        grids, prefixes = explain.token_norms(self.trace)
        block = self.trace.blocks[layer]
        names = [KIND_NAMES.get(k, k) for k in block.prefix_kinds]
        prefix = {f"{n} {i}" if names.count(n) > 1 else n: float(v)
                  for i, (n, v) in enumerate(zip(names, prefixes[layer][0]))}
        view = render.token_norm_map(self.canvas, grids[layer][0], field=block.stage, prefix_norms=prefix)
        return render.caption(view, model=self.name, method="token norms", layer=layer + 1)


def decode_side(models: Sequence) -> tuple[int, int]:
    """(h, w) a large JPEG may be reduced to while decoding (`read_image`'s target_size): every model's
    resize on the height, `MAX_SIDE` px on the width for the views, which are drawn at most MAX_SIDE px
    on the long side. Exact for landscape photos (a 12 MP 4:3 one decodes at 1/4, where a square
    target would force 1/2); portrait ones decode larger than needed, never smaller."""
    sides = [max(m.transform.resize) if isinstance(m.transform.resize, tuple) else m.transform.resize for m in models]
    return max(sides), max([MAX_SIDE, *sides])


def explain_image(image: Image.Image, models: Sequence) -> list[ModelRun]:
    """Run each loaded model once on `image` (traced): the ModelRuns every view is drawn from."""
    return [ModelRun(loaded, image) for loaded in models]


def explain_images(images: Sequence[Image.Image], loaded, *, batch_size: int = 8) -> list[ModelRun]:
    """One model over many images, `batch_size` images per traced forward."""
    runs = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        pixels = torch.cat([loaded.preprocess(image) for image in chunk])
        for i, (image, trace) in enumerate(zip(chunk, trace_batch(loaded, pixels))):
            runs.append(ModelRun(loaded, image, pixels=pixels[i:i + 1], trace=trace))
    return runs


def agreement(a: ModelRun, b: ModelRun, map_a: np.ndarray, map_b: np.ndarray, *, cells: int = 32) -> float | None:
    """Spearman rank correlation of two token maps over the image region both models saw, after
    resampling each onto the same `cells`-wide lattice of the original image (their grids differ)."""
    seen = a.canvas.seen(a.canvas.field(grid=map_a.shape)) & b.canvas.seen(b.canvas.field(grid=map_b.shape))
    if a.canvas.size != b.canvas.size or seen.sum() < 4:
        return None
    h, w = a.canvas.size
    step = max(1, max(h, w) // cells)
    ys, xs = np.mgrid[step // 2:h:step, step // 2:w:step]
    keep = seen[ys, xs]
    va = a.canvas.sample(map_a, a.canvas.field(grid=map_a.shape), at=(ys, xs))[keep]
    vb = b.canvas.sample(map_b, b.canvas.field(grid=map_b.shape), at=(ys, xs))[keep]
    return spearman(va, vb)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    def ranks(v):   # average ranks for ties
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
        sums = np.bincount(inverse, weights=r)
        return (sums / counts)[inverse]
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


class RunStore:
    """The app's sessions, server side: key -> the runs of one click, least recently used dropped first,
    so memory stays bounded however many browsers (or API clients) come and go."""

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self._runs: OrderedDict[str, list[ModelRun]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, runs: list[ModelRun]) -> str:
        key = uuid.uuid4().hex
        with self._lock:
            self._runs[key] = runs
            while len(self._runs) > self.capacity:
                self._runs.popitem(last=False)
        return key

    def get(self, key: str | None) -> list[ModelRun]:
        with self._lock:
            if key not in self._runs:
                raise KeyError("these results have expired: press Explain again")
            self._runs.move_to_end(key)
            return self._runs[key]

    def __len__(self) -> int:
        return len(self._runs)
