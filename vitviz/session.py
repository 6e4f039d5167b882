"""One image, N models: preprocess and trace once per model, keep the traces, compute maps on demand
from them (cached), so a slider move never reruns a model; `vitviz.views` draws what a run keeps.

    runs = explain_image(image, [vitviz.load("vit-cifar10"), vitviz.load("cvt-cifar10")])
    runs[0].top(5), runs[0].token_map("rollout"), views.map_view(runs[0], "rollout")

A model without a classifier (DINO, DINOv2) has no predictions: `top()` is empty, and the methods
that explain a class explain instead the similarity of its pooled output to a reference direction
(`explain.SimilarityTarget`: its own pooled output, or the output of the token under a point).

Every model pass goes through `gate.MODEL_GATE`, which bounds how many run at once (the app's GPU or
CPU is never oversubscribed, whoever calls).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from . import explain, render
from .gate import MODEL_GATE
from .models.trace import BlockTrace, Trace
from .render.geometry import MAX_SIDE


@dataclass(frozen=True)
class Prediction:
    """One class of a model's top k: its index, its label and its probability."""
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


def centre_token(block: BlockTrace) -> tuple[int, int]:
    """The (row, column) of the token in the middle of a block's query grid: the query of a model without a
    class token."""
    return block.query_grid[0] // 2, block.query_grid[1] // 2


def overview_method(*, attends: bool) -> str:
    """The map a model's first screen shows: attention rollout (from the kept trace), or for a model without
    attention Grad-CAM of its top class."""
    return "rollout" if attends else "gradcam"


class ModelRun:
    """One model on one image: its pixels, its trace, its predictions, and every map asked of it so far (the
    views drawn from them are functions of a run, in `vitviz.views`)."""

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
        """The map the first screen shows (`overview_method`)."""
        return overview_method(attends=self.attends)

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

    def kept_value(self, key: tuple):
        """What this run keeps for `key` (`keep`'s, or a map it computed); a KeyError if nothing."""
        with self._lock:
            return self._maps[key]

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
        token = self.token_at(point, block) if point is not None else None
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
        token = self.token_at(point, block) if point is not None else None
        if direction == "column":
            if token is None or isinstance(token, str):
                raise ValueError("pick a point on the image to see who looks at it")
            values = explain.key_attention(self.trace, layer=layer, patch=token, head=head)
        else:
            if token is None:
                token = block.prefix_kinds[0] if block.prefix_kinds else centre_token(block)
            values = explain.query_attention(self.trace, layer=layer, query=token, head=head, on_query_grid=True)
        return values[0].numpy()

    def token_at(self, point: tuple[float, float], block: BlockTrace) -> tuple[int, int] | None:
        """The token (row, column) of `block`'s grid under a display point; None where the model never saw it."""
        return self.canvas.token_at(point, self.canvas.field(block.stage))

    def faithfulness_key(self, method: str, *, target: int | None = None, steps: int = 16) -> tuple:
        return ("faithfulness", method, self.target(target), int(steps))

    def faithfulness(self, method: str, *, target: int | None = None, steps: int = 16) -> dict:
        """Deletion and insertion curves of a method's map and of a random order, with their AUCs (kept)."""
        return faithfulness_curves([self], method, targets=[target], steps=steps)[0]


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
    return [run.kept_value(key) for run, key in zip(runs, keys)]


def faithfulness_scores(model, pixels: torch.Tensor, maps: Sequence[np.ndarray], targets: Sequence[int], *,
                        steps: int = 16) -> list[dict]:
    """Deletion and insertion curves of each image's map (b 3 h w pixels, one gh gw map and class each) and of
    a random order, with their AUCs, all in the same batched forwards: plain lists and floats."""
    maps = torch.stack([torch.as_tensor(m) for m in maps])
    orders = torch.stack([maps, torch.stack([explain.random_saliency(m) for m in maps])]).to(pixels.device)
    (fractions, deletion), (_, insertion) = (explain.faithfulness.deletion(pixels, orders, steps=steps),
                                             explain.faithfulness.insertion(pixels, orders, steps=steps))
    with MODEL_GATE():
        scores = explain.faithfulness.score(model, [deletion, insertion],
                                            torch.tensor(list(targets), device=pixels.device))
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
