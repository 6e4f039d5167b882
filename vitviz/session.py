"""One image, N models: preprocess and trace once per model, keep the traces, compute maps and
views on demand from them (cached), so a slider move never reruns a model.

    runs = explain_image(image, [vitviz.load("vit-cifar10"), vitviz.load("cvt-cifar10")])
    runs[0].top(5), runs[0].token_map("rollout"), runs[0].view("rollout")

A model without a classifier (DINO, DINOv2) has no predictions: `top()` is empty, and the methods
that explain a class explain instead the similarity of its pooled output to a reference direction
(`explain.SimilarityTarget`: its own pooled output, or the output of the token under a point).

Every model pass goes through `MODEL_GATE`, which bounds how many run at once (the app's GPU or
CPU is never oversubscribed, whoever calls).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from einops import rearrange
from PIL import Image

from . import explain, render
from .models.trace import Trace
from .render.geometry import MAX_SIDE
from .render.grid import KIND_NAMES



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


@dataclass(frozen=True)
class MapRequest:
    """One map to compute: `method` with its knobs `params`; for a targeted method, explaining class `target`,
    or, for a model without a classifier, the similarity of its pooled output to `direction` (c, on the CPU).
    Plain data, so it crosses to a process that holds the model."""
    method: str
    target: int | None
    direction: torch.Tensor | None
    params: dict


def class_map(model, pixels: torch.Tensor, request: MapRequest) -> np.ndarray:
    """The gh gw float32 map a `MapRequest` asks of `model` on 1 3 h w `pixels` (a forward and a backward)."""
    explained = model if request.direction is None else \
        explain.SimilarityTarget(model, request.direction.to(pixels.device))
    with MODEL_GATE():
        maps = explain.method(request.method).maps(explained, pixels, [request.target], **request.params)
    return maps[0].detach().float().cpu().numpy()


def autocast(device: torch.device):
    """bf16 autocast on CUDA (the maps are read in fp32 afterwards); plain fp32 elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def trace_batch(loaded, pixels: torch.Tensor) -> list[Trace]:
    """One traced forward for a batch, split into one trace per image (tensors on the CPU, fp32)."""
    with MODEL_GATE(), torch.inference_mode(), autocast(pixels.device):
        trace = loaded.model.trace(pixels)
    cpu = lambda t: t.float().cpu()
    part = lambda t, i: None if t is None else cpu(t[i:i + 1])
    return [replace(trace, logits=cpu(trace.logits[i:i + 1]),
                    blocks=[replace(b, attn=part(b.attn, i), tokens=cpu(b.tokens[i:i + 1]), inputs=part(b.inputs, i))
                            for b in trace.blocks],
                    features=[cpu(f[i:i + 1]) for f in trace.features],
                    pooled=None if trace.pooled is None else cpu(trace.pooled[i:i + 1]),
                    final_tokens=None if trace.final_tokens is None else cpu(trace.final_tokens[i:i + 1]))
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

    @property
    def has_classifier(self) -> bool:
        return self.trace.has_classifier

    @property
    def attends(self) -> bool:
        """False for a convolutional network: no attention, so no attention views or attention methods."""
        return self.trace.blocks[-1].attends

    @property
    def overview_method(self) -> str:
        """The map the first screen shows: attention rollout (from the kept trace), or for a model without
        attention Grad-CAM of its top class."""
        return "rollout" if self.attends else "gradcam"

    def applies(self, method: str) -> bool:
        """Whether `method` can explain this model (a method that reads attention cannot explain a CNN)."""
        return self.attends or not explain.method(method).reads_attention

    def no_attention(self, what: str) -> str:
        """Why a view or method that reads attention shows nothing for this model, in words (for page text)."""
        return (f"{self.name} is a convolutional network: its layers have no attention, so there is no {what}. "
                f"Grad-CAM and AttnLRP explain it, and Compare > How far each layer looks shows its reach.")

    @property
    def no_classifier(self) -> str:
        """What a model without a classifier means for the views, in words (for page text)."""
        return (f"{self.name} has no classifier (it is a self-supervised feature extractor), so it predicts no "
                f"class. Its attention, features and token norms are all there; the gradient methods explain the "
                f"similarity of its pooled output to its own direction (or to the output of the token you click on "
                f"the image) instead of a class, and there are no deletion or insertion curves, which follow a "
                f"class's probability.")

    def top(self, k: int = 5) -> list[Prediction]:
        """The k most probable classes, most probable first; [] for a model without a classifier."""
        probs, indices = self.probs.topk(min(k, len(self.probs)))
        return [Prediction(int(i), self.loaded.labels[int(i)], float(p)) for p, i in zip(probs, indices)]

    def label(self, index: int) -> str:
        return self.loaded.labels[index]

    def target(self, target: int | None) -> int:
        if not self.has_classifier:
            raise ValueError(self.no_classifier)
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

    def map_request(self, method: str, *, target: int | None = None, head_fusion: str = "mean",
                    discard_ratio: float = 0.0, start_layer: int = 0,
                    point: tuple[float, float] | None = None) -> tuple[tuple, MapRequest]:
        """(the cache key of `token_map`'s map, what computing it takes: a model pass for a targeted method
        (`class_map`), the kept trace otherwise). The knobs a method does not read are dropped, so one call
        serves every method; a target is checked against the model's classes here, before any model pass."""
        m = explain.method(method)
        knobs = {"head_fusion": head_fusion, "discard_ratio": discard_ratio, "start_layer": start_layer}
        params = {k: v for k, v in knobs.items() if k in m.params}
        if not m.targeted:
            return (method, *params.values()), MapRequest(method, None, None, params)
        target, direction, key = self._explained(target, point)
        return (method, key, *params.values()), MapRequest(method, target, direction, params)

    def token_map(self, method: str, **options) -> np.ndarray:
        """gh gw float32 on the last token grid, for any of `explain.METHODS` (`target`: a class index,
        default the top prediction; methods that explain no class ignore it; the options are
        `map_request`'s). A model without a classifier takes no `target`: its targeted methods explain the
        similarity of its pooled output to the output of the token under the display `point`, or without
        one to its own direction (`explain.SimilarityTarget`). Kept: asking again costs nothing."""
        if not self.applies(method):
            raise ValueError(self.no_attention(explain.method(method).title))
        key, request = self.map_request(method, **options)
        if not explain.method(method).targeted:   # from the kept trace: no model pass
            return self._cached(key, lambda: explain.method(method).from_trace(self.trace, **request.params)[0].numpy())
        return self._cached(key, lambda: class_map(self.loaded.model, self.pixels, request))

    def keep(self, key: tuple, value) -> None:
        """Keep what a model pass elsewhere computed for `key` (a `map_request` or `faithfulness_key`), as if
        this run had computed it: the app fills its runs from what its GPU functions return."""
        with self._lock:
            self._maps.setdefault(key, value)

    def kept(self, key: tuple) -> bool:
        with self._lock:
            return key in self._maps

    def _explained(self, target: int | None, point) -> tuple[int, torch.Tensor | None, tuple | int]:
        """(the class index to explain, the similarity direction of a model without a classifier or None,
        a cache key for the two)."""
        if self.has_classifier:
            target = self.target(target)
            return target, None, target
        if target is not None:
            raise ValueError(f"{self.name} has no classifier, so it has no class {target} to explain: leave the "
                             f"target out (its pooled output is explained instead).")
        token = self.similarity_token(point)
        direction = self.trace.pooled[0] if token is None else self.trace.final_tokens[0, token]
        return 0, direction.detach().float().cpu(), ("similar", token)

    def similarity_token(self, point: tuple[float, float] | None) -> int | None:
        """The position in the token sequence of the grid token under a display point (None: no point, or
        one the model never saw): the reference of a model without a classifier."""
        block = self.trace.blocks[-1]
        token = self._token_at(point, block) if point is not None else None
        return None if token is None else block.prefix + token[0] * block.query_grid[1] + token[1]

    def explained_target(self, method: str, *, target: int | None = None,
                         point: tuple[float, float] | None = None) -> str | None:
        """What a method's map explains, in words: the class, or a headless model's similarity target."""
        if not explain.method(method).targeted:
            return None
        if self.has_classifier:
            return f"class {self.label(self.target(target))}"
        token = self.similarity_token(point)
        if token is None:
            return "the pooled output's length along its own direction"
        return f"the pooled output's similarity to token {token}'s output"

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

    def faithfulness_key(self, method: str, *, target: int | None = None, steps: int = 16) -> tuple:
        return ("faithfulness", method, self.target(target), int(steps))

    def faithfulness(self, method: str, *, target: int | None = None, steps: int = 16) -> dict:
        """Deletion and insertion curves of a method's map and of a random order, with their AUCs (kept)."""
        return faithfulness_curves([self], method, targets=[target], steps=steps)[0]

    # -- views: captioned h w 3 uint8 images in the original image's frame --------------------------------

    def map_view(self, method: str, *, values: np.ndarray | None = None, target: int | None = None,
                 scale: tuple[float, float] | None = None, mode: str = "bilinear", style: str = "heatmap",
                 cmap: str | None = None, **params) -> np.ndarray:
        """A method's map over the image with its colour bar; `values` (e.g. per-uniform units) and
        `scale` (vmin, vmax) let several panels share one colour scale. A signed map (relevance) is drawn
        on a scale symmetric about 0, in `render.SIGNED_CMAP` unless `cmap` says otherwise."""
        m = explain.method(method)
        if not self.applies(method):
            return render.caption(render.notice(self.canvas, self.no_attention(m.title)), model=self.name,
                                  method=m.title)
        if values is None:
            values = self.token_map(method, target=target, **params)
        if scale is not None:
            vmin, vmax = scale
        elif m.signed:
            vmax = max(float(np.abs(values).max()), np.finfo(np.float32).tiny)
            vmin = -vmax
        else:
            vmin, vmax = float(values.min()), float(values.max())
        cmap = cmap or (render.SIGNED_CMAP if m.signed else render.DEFAULT_CMAP)
        view = render.overlay(self.canvas, values, mode=mode, style=style, cmap=cmap, vmin=vmin, vmax=vmax)
        view = render.with_colorbar(view, vmin=vmin, vmax=vmax, cmap=cmap)
        if m.targeted and not self.has_classifier:
            explained = self.explained_target(method, point=params.get("point"))
            return render.caption(view, model=self.name, method=f"{m.title} of {explained}")
        label = self.label(self.target(target)) if m.targeted else None
        return render.caption(view, model=self.name, method=m.title, target=label)

    def attention_view(self, *, layer: int, head: int | None = None, point: tuple[float, float] | None = None,
                       direction: str = "row", cmap: str = render.DEFAULT_CMAP) -> np.ndarray:
        if not self.attends:
            return render.caption(render.notice(self.canvas, self.no_attention("attention map")), model=self.name,
                                  method="attention", layer=layer + 1)
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
        """How the model cuts the image into tokens: ViT's patch grid, or each CvT stage's lattice, with what
        they show written on them (files that travel alone)."""
        if self._patch_grid:
            kinds = self.trace.blocks[0].prefix_kinds
            view = render.patch_grid(self.canvas, prefix_kinds=kinds, point=point)
            return [render.caption(view, model=self.name, method="patch grid",
                                   note=render.prefix_legend(kinds, self.canvas.fields[0].grid))]
        return [render.caption(view, model=self.name, method=f"stage {i + 1} tokens")
                for i, view in enumerate(render.stage_grids(self.canvas, point=point))]

    def grid_gallery(self, *, point: tuple[float, float] | None = None) -> list[tuple[np.ndarray, str]]:
        """`grid_views` for a page: the drawings, with what they say as captions (page text) rather than pixels."""
        if self._patch_grid:
            kinds = self.trace.blocks[0].prefix_kinds
            return [(render.patch_grid(self.canvas, prefix_kinds=kinds, point=point),
                     f"{self.name} · patch grid · {render.prefix_legend(kinds, self.canvas.fields[0].grid)}")]
        return [(view, f"{self.name} · " + "; ".join(render.stage_lines(self.canvas, i, point=point)))
                for i, view in enumerate(render.stage_grids(self.canvas, point=point, legend=False))]

    @property
    def _patch_grid(self) -> bool:
        """Whether the model's tokens are one grid of non-overlapping patches (ViT), not overlapping stages."""
        fields = self.canvas.fields
        return len(fields) == 1 and fields[0].stride == fields[0].size

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
        prefix = {name: float(v) for name, v in zip(prefix_names(block.prefix_kinds), prefixes[layer][0])}
        view = render.token_norm_map(self.canvas, grids[layer][0], field=block.stage, prefix_norms=prefix)
        return render.caption(view, model=self.name, method="token norms", layer=layer + 1)

    # -- views that need no class, each (image, caption): the caption is what the app shows as page text ---------

    def _query(self, layer: int, point) -> explain.attention.Token:
        """The token whose attention a view shows: the one under the display `point`, else the class token
        (a model or CvT stage without one: the centre token)."""
        block = self.trace.blocks[layer]
        token = self._token_at(point, block) if point is not None else None
        if token is not None:
            return token
        return "cls" if "cls" in block.prefix_kinds else self._centre_token(block)

    @staticmethod
    def _token_words(token) -> str:
        return "the class token" if token == "cls" else f"the token at row {token[0]}, column {token[1]}"

    def head_views(self, *, layer: int = -1, point: tuple[float, float] | None = None, fraction: float | None = None,
                   style: str = "outline") -> tuple[list[tuple[np.ndarray, str]], str]:
        """Every head of block `layer` (default the last): where the class token (or the token under the display
        `point`) looks, each head on its own colour scale, their mean first. With `fraction`, each map's
        smallest token set holding that share of its attention (`explain.mass_threshold`), drawn as `style`:
        'outline' or 'mask'. -> (the views with short captions, one line that says what they all show)."""
        layer = range(len(self.trace.blocks))[layer]
        if not self.attends:
            return [(render.notice(self.canvas, self.no_attention("attention head")), "no attention")], \
                self.no_attention("attention head")
        block, token = self.trace.blocks[layer], self._query(layer, point)
        maps = explain.head_attention(self.trace, layer=layer, query=token, on_query_grid=True)[0]   # h gh gw
        maps = torch.cat([maps.mean(dim=0, keepdim=True), maps])
        masks = explain.mass_threshold(maps, fraction).numpy() if fraction else [None] * len(maps)
        views = []
        for k, (values, mask) in enumerate(zip(maps.numpy(), masks)):
            image = render.head_tile(self.canvas, values, field=block.stage, mask=mask, style=style, point=point)
            head = f"mean of the {len(maps) - 1} heads" if k == 0 else f"head {k}"
            views.append((image, head if mask is None else f"{head} · {int(mask.sum())} of {mask.size} tokens"))
        kept = "" if fraction is None else (f"; {'outlined' if style == 'outline' else 'unmasked'}: the fewest tokens "
                                            f"holding {fraction:.0%} of each map's attention")
        return views, (f"{self.name}, layer {layer + 1}: where {self._token_words(token)} looks, every head on its own "
                       f"colour scale{kept}")

    def model_view(self, *, point: tuple[float, float] | None = None, fraction: float | None = None,
                   style: str = "outline", side: int = 160) -> list[tuple[np.ndarray, str]]:
        """Every layer x head (the "model view"): per layer, its heads as `side`-px tiles in one row, head 1
        on the left, for the class token or the token under the display `point` (`head_views`' options)."""
        if not self.attends:
            return [(render.notice(self.canvas, self.no_attention("attention head")), "no attention")]
        views = []
        for layer, block in enumerate(self.trace.blocks):
            token = self._query(layer, point)
            maps = explain.head_attention(self.trace, layer=layer, query=token, on_query_grid=True)[0]
            masks = explain.mass_threshold(maps, fraction).numpy() if fraction else None
            strip = render.layer_strip(self.canvas, maps.numpy(), field=block.stage, masks=masks, style=style, side=side)
            views.append((strip, f"layer {layer + 1}: heads 1-{len(maps)}, left to right; {self._token_words(token)}"))
        return views

    def window_views(self, *, layer: int, point: tuple[float, float] | None = None) -> list[tuple[np.ndarray, str]]:
        """Block `layer`'s windows (`render.window_view`) and the grid as it partitions it after its roll
        (`render.rolled_view`), the token under the display `point` with the keys it sees; a model whose
        attention is global, or that has none, gets one view saying so."""
        block = self.trace.blocks[layer]
        part = block.windows
        if part is None:
            what = (self.no_attention("attention window") if not self.attends else
                    f"{self.name} attends globally: every token of a block sees every other one (one window "
                    f"of the whole {block.key_grid[0]}x{block.key_grid[1]} key grid).")
            return [(render.notice(self.canvas, what), what)]
        stride = self.canvas.fields[block.stage].stride
        shifted = (f"shifted by {part.shift} tokens ({part.shift * stride} px): the windows of the last row and "
                   f"column wrap around the edges, and the parts of one window (the same number) are kept apart by "
                   f"the mask" if part.shift else "regular windows (no shift)")
        return [(render.window_view(self.canvas, part, stage=block.stage, point=point),
                 f"{self.name} · layer {layer + 1}: {part.count[0] * part.count[1]} windows of {part.size}x{part.size} "
                 f"tokens ({part.size * stride} px), {shifted}"),
                (render.rolled_view(self.canvas, part, stage=block.stage, point=point),
                 f"{self.name} · layer {layer + 1}: the {part.grid[0]}x{part.grid[1]} grid as the block cuts it"
                 + (f", after rolling it by -{part.shift} tokens on both axes; dashed: where the rows and columns the "
                    f"roll wrapped around begin" if part.shift else " (this block does not roll it)"))]

    def feature_pca_view(self) -> tuple[np.ndarray, str]:
        """The DINOv2 paper's picture of the last layer's patch features (`render.foreground_pca`): a ViT's
        patch tokens through the final norm, as DINOv2 shows them; a CvT's stage-3 feature map."""
        stage = len(self.trace.features) - 1
        if self.trace.final_tokens is not None:
            block = self.trace.blocks[-1]
            h, w = block.query_grid
            features = rearrange(self.trace.final_tokens[0, block.prefix:], '(h w) c -> c h w', h=h, w=w)
        else:
            features = self.trace.features[stage][0]
        view, foreground = render.foreground_pca_view(self.canvas, features, stage=stage)
        return view, (f"{self.name} · last layer's patch features: the first three principal components of the "
                      f"{int(foreground.sum())} foreground tokens (of {foreground.size}) as red, green and blue; the "
                      f"background (black) is the side of the first component's mean that holds more of the border")

    def artefact_views(self, *, layer: int = -1) -> tuple[list[tuple[np.ndarray, str]], list[tuple[np.ndarray, str]], str]:
        """The high-norm artefact tokens of block `layer` (`explain.artefact_tokens`): (the token norms with them
        ringed and the class token's attention (head mean) with them ringed; each register's own attention,
        [] without registers; a summary in words: their count, the share of the class token's attention on them)."""
        layer = range(len(self.trace.blocks))[layer]
        block = self.trace.blocks[layer]
        field = self.canvas.fields[block.stage]
        grids, prefixes = explain.token_norms(self.trace)
        norms = grids[layer][0].numpy()
        artefacts = explain.artefact_tokens(self.trace, layer=layer)[0].numpy()
        count, median = int(artefacts.sum()), float(np.median(norms))
        found = {0: "no high-norm tokens", 1: "1 high-norm token"}.get(count, f"{count} high-norm tokens")
        prefix = ", ".join(f"{name} {float(v):.3g}" for name, v in zip(prefix_names(block.prefix_kinds),
                                                                       prefixes[layer][0]))
        views = [(render.token_norm_map(self.canvas, norms, field=field, legend=False),
                  f"{self.name} · token norms at layer {layer + 1}: median {median:.3g}, largest {norms.max():.3g}; "
                  f"{found}" + (" (ringed)" if count else "") + (f"; {prefix}" if prefix else ""))]
        summary = (f"**{self.name}**, layer {layer + 1}: **{found}** (a norm more than {explain.OUTLIER_Z:g} robust "
                   f"standard deviations above the median, {median:.3g})")
        if "cls" in block.prefix_kinds:
            attention = explain.query_attention(self.trace, layer=layer, query="cls", on_query_grid=True)[0].numpy()
            view = render.overlay(self.canvas, attention, field=field)
            render.ring_tokens(view, self.canvas, artefacts, field=field)
            share = float(attention[artefacts].sum() / attention.sum())
            on_them = f": {share:.0%} of it on the {found} (ringed)" if count else ""
            views.append((view, f"{self.name} · where the class token looks at layer {layer + 1} (head mean){on_them}"))
            summary += f", which draw {share:.0%} of the class token's attention" if count else ""
        registers = []
        for n, k in enumerate(k for k, kind in enumerate(block.prefix_kinds) if kind == "reg"):
            attention = explain.query_attention(self.trace, layer=layer, query=k, on_query_grid=True)[0].numpy()
            registers.append((render.overlay(self.canvas, attention, field=field),
                              f"{self.name} · where register {n + 1} looks at layer {layer + 1} (head mean)"))
        summary += f"; {len(registers)} register tokens" if registers else "; no register tokens"
        return views, registers, summary + "."


def prefix_names(kinds: Sequence[str]) -> list[str]:
    """'class token', 'register 1', 'register 2', ...: the prefix tokens by kind, numbered where a kind repeats."""
    names = [KIND_NAMES.get(k, k) for k in kinds]
    return [f"{name} {names[:i + 1].count(name)}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def faithfulness_curves(runs: Sequence[ModelRun], method: str, *, targets: Sequence[int | None] | None = None,
                        steps: int = 16) -> list[dict]:
    """`ModelRun.faithfulness` of several runs of one model at once: every step of both curves, of each
    run's map and of its random order, goes through the model in the same batched forwards. Each run
    keeps its result, so asking it again costs nothing."""
    targets = [run.target(t) for run, t in zip(runs, targets or [None] * len(runs))]
    keys = [run.faithfulness_key(method, target=t, steps=steps) for run, t in zip(runs, targets)]
    todo = [i for i, (run, key) in enumerate(zip(runs, keys)) if not run.kept(key)]
    if todo:
        maps = [runs[i].token_map(method, target=targets[i]) for i in todo]
        curves = faithfulness_scores(runs[0].loaded.model, torch.cat([runs[i].pixels for i in todo]), maps,
                                     [targets[i] for i in todo], steps=steps)
        for i, result in zip(todo, curves):
            runs[i].keep(keys[i], result)
    return [run._maps[key] for run, key in zip(runs, keys)]


def faithfulness_scores(model, pixels: torch.Tensor, maps: Sequence[np.ndarray], targets: Sequence[int], *,
                        steps: int = 16) -> list[dict]:
    """Deletion and insertion curves of each image's map (b 3 h w pixels, one gh gw map and class each) and of
    a random order, with their AUCs, all in the same batched forwards: plain lists and floats."""
    maps = torch.stack([torch.as_tensor(m) for m in maps])
    orders = torch.stack([maps, torch.stack([explain.random_saliency(m) for m in maps])]).to(pixels.device)
    (fractions, deletion), (_, insertion) = (explain.faithfulness.deletion(pixels, orders, steps=steps),
                                             explain.faithfulness.insertion(pixels, orders, steps=steps))
    with MODEL_GATE():
        scores = explain.faithfulness.score(model, [deletion, insertion], torch.tensor(list(targets), device=pixels.device))
    results = []
    for j, target in enumerate(targets):
        curves = {"target": int(target), "fractions": fractions.tolist()}
        for kind, s in zip(("deletion", "insertion"), scores):
            for k, name in enumerate(("map", "random")):
                y = s.probs[k, j]
                curves[f"{kind}/{name}"] = {"scores": y.tolist(), "auc": float(torch.trapezoid(y, fractions))}
        results.append(curves)
    return results


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


def explain_images(images: Sequence[Image.Image], loaded, *, batch_size: int = 8,
                   preprocessed: dict | None = None) -> list[ModelRun]:
    """One model over many images, `batch_size` images per traced forward. `preprocessed`: a dict the caller
    keeps while it passes the same images to several models, so that models that preprocess alike (the same
    `Transform`) resize each image once."""
    runs = []
    preprocessed = {} if preprocessed is None else preprocessed
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        key = (loaded.transform, start, batch_size)
        if key not in preprocessed:
            preprocessed[key] = torch.cat([loaded.preprocess(image) for image in chunk])
        pixels = preprocessed[key].to(loaded.device)
        for i, (image, trace) in enumerate(zip(chunk, trace_batch(loaded, pixels))):
            runs.append(ModelRun(loaded, image, pixels=pixels[i:i + 1], trace=trace))
    return runs


def agreement(a: render.Canvas, b: render.Canvas, map_a: np.ndarray, map_b: np.ndarray, *,
              cells: int = 32) -> float | None:
    """Spearman rank correlation of two models' token maps (each on its model's canvas of the same image) over
    the image region both models saw, after resampling each onto the same `cells`-wide lattice of the original
    image (their grids differ)."""
    seen = a.seen(a.field(grid=map_a.shape)) & b.seen(b.field(grid=map_b.shape))
    if a.size != b.size or seen.sum() < 4:
        return None
    h, w = a.size
    step = max(1, max(h, w) // cells)
    ys, xs = np.mgrid[step // 2:h:step, step // 2:w:step]
    keep = seen[ys, xs]
    va = a.sample(map_a, a.field(grid=map_a.shape), at=(ys, xs))[keep]
    vb = b.sample(map_b, b.field(grid=map_b.shape), at=(ys, xs))[keep]
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
