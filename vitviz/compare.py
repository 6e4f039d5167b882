"""Does CvT see like ViT? Centered kernel alignment (CKA) between every layer of two models over a data set.

    python -m vitviz compare --models vit-cifar10 cvt-cifar10 --data cifar10 --limit 1000 --out compare/
    torchrun --nproc_per_node=2 -m vitviz compare ...     (the same matrices, the batches split over the ranks)

Linear CKA (Kornblith et al., ICML 2019). X (n p) and Y (n q) hold two representations of the same n
images, one row per image; K = X Xᵀ and L = Y Yᵀ are their Gram matrices (n n), and

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))

Biased estimator (HSIC_0, Gretton et al. 2005), H = I - 11ᵀ/n the centring matrix:

    HSIC_0(K, L) = tr(K H L H) / (n - 1)²

It is inflated when features outnumber images: two independent Gaussian X and Y with 2,000 features
score 0.98 at 32 images, 0.89 at 256, which is the regime of flattened tokens. The debiased estimator
(HSIC_1, Song et al. 2012) has expectation HSIC; with K̃, L̃ the Gram matrices with their diagonals zeroed,

    HSIC_1(K, L) = [tr(K̃ L̃) + (1ᵀK̃1)(1ᵀL̃1) / ((n-1)(n-2)) - 2/(n-2) 1ᵀK̃L̃1] / (n(n-3))     n >= 4
                 = <U(K), U(L)> / (n(n-3))

U the U-centring of Székely & Rizzo (2014), Kornblith's `center_gram(unbiased=True)`: for i != j

    U(K)_ij = K̃_ij - Σ_l K̃_il / (n-2) - Σ_k K̃_kj / (n-2) + Σ_kl K̃_kl / ((n-1)(n-2)),     U(K)_ii = 0

Debiased CKA can be slightly negative (two unrelated representations score about 0 either side): the
value is kept; only a heatmap's colours clamp it to [0, 1].

Minibatch CKA (Nguyen, Raghu & Kornblith, ICLR 2021). Over batches b of images,

    CKA = Σ_b HSIC_1(K_b, L_b) / sqrt(Σ_b HSIC_1(K_b, K_b) · Σ_b HSIC_1(L_b, L_b))

each HSIC_1 an unbiased estimate, summed and normalised once at the end: never a mean of per-batch
CKA values (a ratio of means, not a mean of ratios). One batch is debiased CKA. `LayerCKA` keeps
these sums for every pair of layers of both models as one symmetric matrix (A's layers, then B's):
per batch, G stacks every layer's flattened U(K) and the sums grow by G Gᵀ / (n(n-3)).

Numerics. Each batch's features are centred (their column means subtracted, which U-centring cannot
see: it changes K by terms a_i + b_j, which U removes exactly), their Gram matrices formed in float32
and everything after in float64. Centring is what makes float32 enough: over 256 CIFAR-10 test images
of the bundled pair the matrices stay within 1.3e-8 of float64 Gram matrices (every token, the means
and the class tokens; a third of the time), where float32 Gram matrices of uncentred features lose
about 2 %.

Features per block (`tokens`), from each block's output tokens in the trace (no hooks):
"mean" (the mean of the grid tokens; the default), "cls" (the class token: CvT has one only in its
last stage, so only those blocks get a row) and "flat" (every token, prefix included, flattened).
Layers of different widths and token counts compare fine: CKA compares n n Gram matrices.

The data. The images `--limit` picks (spread over the data as `evaluate` does: a class-sorted file
gives every class its share) are cut into consecutive batches of `batch_size`; a last batch of fewer
than 4 (HSIC_1 needs n >= 4) joins the one before. Each image is decoded once and read by each model
through its own preprocessing, so the rows are aligned. An image that will not decode is skipped for
both models (listed in the summary), and so are the rest of a batch left with fewer than 4 images.

Under torchrun batch k goes to rank k % world (`vitviz.distributed`); each rank sums its batches'
HSIC_1 matrices, the sums are all-reduced through the process group and normalised once: the same
matrices as one process up to the order of the float64 additions (about 1e-15 relative).
"""
from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import Tensor
from tqdm import tqdm

from . import __version__, catalog, hub
from .data import Dataset, open_data, spread
from .distributed import ranks as process_ranks
from .explain.receptive import ReceptiveFieldSum, reach_curves, receptive_field, receptive_npz
from .files import png_bytes, write_atomic
from .image import ImageError
from .models.trace import Trace

TOKENS = ("mean", "cls", "flat")
MIN_BATCH = 4                 # HSIC_1 divides by n(n-3)
CKA_FILE = "cka.npz"
RECEPTIVE_FILE, RECEPTIVE_PLOT = "receptive-field.npz", "receptive-field.png"   # --receptive-field
SUMMARY = "summary.json"
MATRICES = ("a_vs_b", "a_vs_a", "b_vs_b")    # cka.npz's arrays and the heatmaps' file stems
# the shipped results, `compare`'s output over 1,000 CIFAR-10 test images (<folder>/<tokens>/),
# by pair of bundled models
PUBLISHED = {pair: catalog.CHECKPOINTS / f"compare-{pair[0].split('-')[0]}-{pair[1].split('-')[0]}-cifar10"
             for pair in (catalog.BUNDLED_PAIR, ("vit-cifar10", "swin-cifar10"), ("cvt-cifar10", "swin-cifar10"),
                          ("vit-cifar10", "resnet-cifar10"), ("cvt-cifar10", "resnet-cifar10"))}
Progress = Callable[[float, str], None]


# ---- the estimators ---------------------------------------------------------------------------------

def gram(x: Tensor | np.ndarray) -> Tensor:
    """n p features -> the n n linear Gram matrix of the features centred over the rows: the products in the
    features' precision (at least float32), float64 from there on."""
    x = torch.as_tensor(x).flatten(1)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    x = x - x.mean(dim=0, keepdim=True)
    return (x @ x.T).double()


def u_centre(k: Tensor) -> Tensor:
    """U(K) of the module docstring (Kornblith's `center_gram(unbiased=True)`)."""
    n = k.shape[0]
    k = k.clone()
    k.fill_diagonal_(0)
    means = k.sum(dim=0) / (n - 2)
    means = means - means.sum() / (2 * (n - 1))
    k = k - means[:, None] - means[None, :]
    return k.fill_diagonal_(0)


def centre(k: Tensor) -> Tensor:
    """H K H."""
    k = k - k.mean(dim=0, keepdim=True)
    return k - k.mean(dim=1, keepdim=True)


def hsic(gram_x: Tensor, gram_y: Tensor, *, debiased: bool = True) -> Tensor:
    """HSIC_1 (debiased) or HSIC_0 of two n n Gram matrices."""
    n = gram_x.shape[0]
    if debiased:
        return (u_centre(gram_x) * u_centre(gram_y)).sum() / (n * (n - 3))
    return (centre(gram_x) * centre(gram_y)).sum() / (n - 1) ** 2


def cka(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, debiased: bool = True) -> float:
    """Linear CKA of two (n, p) and (n, q) representations of the same n images (rows aligned)."""
    n = len(x)
    if len(y) != n:
        raise ValueError(f"CKA needs the same images on both sides: {n} rows against {len(y)}")
    if n < (MIN_BATCH if debiased else 2):
        raise ValueError(f"{'debiased ' if debiased else ''}CKA needs at least {MIN_BATCH if debiased else 2} "
                         f"rows, not {n}")
    gram_x, gram_y = gram(x), gram(y)
    return float(hsic(gram_x, gram_y, debiased=debiased)
                 / (hsic(gram_x, gram_x, debiased=debiased) * hsic(gram_y, gram_y, debiased=debiased)).sqrt())


# ---- layers of a trace ----------------------------------------------------------------------------------

def block_names(trace: Trace) -> list[str]:
    """'block 3' for a one-stage model, 'stage 3 block 2' (counted within the stage) for CvT."""
    if len(trace.embeddings) == 1:
        return [f"block {i + 1}" for i in range(len(trace.blocks))]
    counts, names = {}, []
    for block in trace.blocks:
        counts[block.stage] = counts.get(block.stage, 0) + 1
        names.append(f"stage {block.stage + 1} block {counts[block.stage]}")
    return names


def block_features(trace: Trace, tokens: str = "mean") -> dict[str, Tensor]:
    """Layer name -> n p features of each traced block that has them, in forward order (see the module docstring)."""
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {', '.join(TOKENS)}, not {tokens!r}")
    features = {}
    for name, block in zip(block_names(trace), trace.blocks):
        x = block.tokens
        if tokens == "mean":
            features[name] = x[:, block.prefix:].mean(dim=1)
        elif tokens == "flat":
            features[name] = x.flatten(1)
        elif "cls" in block.prefix_kinds:
            features[name] = x[:, block.prefix_kinds.index("cls")]
    if not features:
        raise ValueError("tokens='cls': this model has no class token (use 'mean' or 'flat')")
    return features


# ---- minibatch CKA over every pair of layers --------------------------------------------------------------

@dataclass(frozen=True)
class CKAResult:
    """CKA between every layer of two models over `images` images: `a_vs_b` (layers_a x layers_b) and each
    model against itself, with the layers' names; what cka.npz holds."""
    a_vs_b: np.ndarray            # layers_a x layers_b
    a_vs_a: np.ndarray
    b_vs_b: np.ndarray
    layers_a: tuple[str, ...]
    layers_b: tuple[str, ...]
    images: int

    def npz_bytes(self) -> bytes:
        """cka.npz: the three matrices, the layer names as string arrays (np.load needs no pickle), images."""
        buffer = io.BytesIO()
        np.savez(buffer, **{m: getattr(self, m) for m in MATRICES}, layers_a=np.array(self.layers_a, dtype=str),
                 layers_b=np.array(self.layers_b, dtype=str), images=np.array(self.images))
        return buffer.getvalue()

    @classmethod
    def load(cls, path: str | Path) -> "CKAResult":
        with np.load(path, allow_pickle=False) as f:
            return cls(**{m: f[m] for m in MATRICES}, layers_a=tuple(f["layers_a"].tolist()),
                       layers_b=tuple(f["layers_b"].tolist()), images=int(f["images"]))


class LayerCKA:
    """Minibatch debiased CKA of every layer of model A against every layer of model B (and of each
    model's layers against its own), accumulated over batches (see the module docstring)."""

    def __init__(self):
        self.layers_a: tuple[str, ...] | None = None
        self.layers_b: tuple[str, ...] | None = None
        self.sums: Tensor | None = None   # (La + Lb)²: Σ_b HSIC_1, A's layers first
        self.images = 0

    def add(self, features_a: dict[str, Tensor], features_b: dict[str, Tensor]) -> None:
        """One batch: layer name -> n p features for each model, the same n images in the same order."""
        if self.sums is None:
            self.layers_a, self.layers_b = tuple(features_a), tuple(features_b)
        elif (tuple(features_a), tuple(features_b)) != (self.layers_a, self.layers_b):
            raise ValueError("every batch must come with the same layers")
        rows = {len(f) for f in (*features_a.values(), *features_b.values())}
        if len(rows) != 1:
            raise ValueError(f"the layers' features hold different numbers of images: {sorted(rows)}")
        (n,) = rows
        if n < MIN_BATCH:
            raise ValueError(f"a batch needs at least {MIN_BATCH} images (HSIC_1 divides by n(n-3)), not {n}")
        grams = torch.stack([u_centre(gram(f)).flatten() for f in (*features_a.values(), *features_b.values())])
        batch = grams @ grams.T / (n * (n - 3))
        self.sums = batch if self.sums is None else self.sums + batch
        self.images += n

    def add_traces(self, trace_a: Trace, trace_b: Trace, *, tokens: str = "mean") -> None:
        self.add(block_features(trace_a, tokens), block_features(trace_b, tokens))

    def all_reduce(self) -> None:
        """Sum every rank's HSIC sums and image counts through the process group (every rank ends with all)."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        if self.sums is None:
            raise ValueError("this rank has no batch: use fewer ranks than batches")
        images = torch.tensor([self.images], dtype=torch.float64, device=self.sums.device)
        dist.all_reduce(self.sums)
        dist.all_reduce(images)
        self.images = int(images.item())

    def result(self) -> CKAResult:
        if self.sums is None:
            raise ValueError("no batch was added")
        s = self.sums.cpu()
        scale = s.diagonal().sqrt()
        joint = (s / scale[:, None] / scale[None, :]).numpy()
        a = len(self.layers_a)
        return CKAResult(a_vs_b=joint[:a, a:], a_vs_a=joint[:a, :a], b_vs_b=joint[a:, a:], layers_a=self.layers_a,
                         layers_b=self.layers_b, images=self.images)


def batches(indices: Sequence[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of `batch_size`; a last one of fewer than 4 joins the one before."""
    if len(indices) < MIN_BATCH:
        raise ValueError(f"CKA needs at least {MIN_BATCH} images, not {len(indices)}")
    if batch_size < MIN_BATCH:
        raise ValueError(f"batch-size must be at least {MIN_BATCH} (HSIC_1 needs n >= 4), not {batch_size}")
    cut = [list(indices[i:i + batch_size]) for i in range(0, len(indices), batch_size)]
    if len(cut) > 1 and len(cut[-1]) < MIN_BATCH:
        last = cut.pop()
        cut[-1] += last
    return cut


def traced_pair(models: Sequence, images: Sequence[Image.Image]) -> list[Trace]:
    """Each model's trace of the images, each through its own preprocessing (rows aligned)."""
    traces = []
    with torch.inference_mode():
        for loaded in models:
            pixels = torch.cat([loaded.preprocess(image) for image in images])
            traces.append(loaded.model.trace(pixels, attention=False))   # CKA reads the tokens only
    return traces


def cka_of_images(models: Sequence, images: Sequence[Image.Image], *, tokens: str = "mean", batch_size: int = 64,
                  progress: Progress | None = None) -> CKAResult:
    """Minibatch CKA of two loaded models over a list of images (the app's uploads): consecutive batches,
    a last one of fewer than 4 joined to the one before."""
    acc = LayerCKA()
    cut = batches(range(len(images)), batch_size)
    for k, batch in enumerate(cut):
        acc.add_traces(*traced_pair(models, [images[i] for i in batch]), tokens=tokens)
        if progress is not None:
            progress((k + 1) / len(cut), f"CKA: {acc.images} of {len(images)} images")
    return acc.result()


def published(models: Sequence[str], *, tokens: str = "mean") -> CKAResult | None:
    """The shipped result for a pair of `PUBLISHED` (either way round: the matrices transposed), None for any
    other pair or where those tokens were not compared (a class token that one of the models lacks)."""
    a, b = models
    folder, swapped = PUBLISHED.get((a, b)), False
    if folder is None and (b, a) in PUBLISHED:
        folder, swapped = PUBLISHED[(b, a)], True
    if folder is None or not (folder / tokens / CKA_FILE).is_file():
        return None
    result = CKAResult.load(folder / tokens / CKA_FILE)
    if not swapped:
        return result
    return CKAResult(a_vs_b=result.a_vs_b.T, a_vs_a=result.b_vs_b, b_vs_b=result.a_vs_a, layers_a=result.layers_b,
                     layers_b=result.layers_a, images=result.images)


# ---- what a run writes ------------------------------------------------------------------------------------

def heatmap(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], *, row_title: str, col_title: str,
            title: str) -> np.ndarray:
    """A CKA matrix as an RGB image, layer names on the axes; colours clamped to [0, 1] (the values are not)."""
    from matplotlib.figure import Figure

    from .render.plots import figure_to_rgb

    fig = Figure(figsize=(max(5.0, 1.8 + 0.38 * len(cols)), max(3.2, 1.6 + 0.3 * len(rows))), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(np.clip(matrix, 0, 1), cmap="magma", vmin=0, vmax=1, origin="lower", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel(col_title, fontsize=8)
    ax.set_ylabel(row_title, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03).ax.tick_params(labelsize=7)
    fig.tight_layout()
    return figure_to_rgb(fig)


def heatmaps(result: CKAResult, names: tuple[str, str], *, tokens: str) -> dict[str, np.ndarray]:
    """The three heatmaps, by matrix name."""
    a, b = names
    what = f"debiased CKA, tokens={tokens}, {result.images} images"
    return {"a_vs_b": heatmap(result.a_vs_b, result.layers_a, result.layers_b, row_title=a, col_title=b,
                              title=f"{a} x {b}: {what}"),
            "a_vs_a": heatmap(result.a_vs_a, result.layers_a, result.layers_a, row_title=a, col_title=a,
                              title=f"{a} x {a}: {what}"),
            "b_vs_b": heatmap(result.b_vs_b, result.layers_b, result.layers_b, row_title=b, col_title=b,
                              title=f"{b} x {b}: {what}")}


def markdown(result: CKAResult, names: tuple[str, str]) -> str:
    """Per layer of A, the layer of B most like it and their CKA: a table of the heatmap's row maxima."""
    a, b = names
    lines = [f"| {a} | most similar layer of {b} | CKA |", "|---|---|---|"]
    for name, row in zip(result.layers_a, result.a_vs_b):
        best = int(np.argmax(row))
        lines.append(f"| {name} | {result.layers_b[best]} | {row[best]:.3f} |")
    return "\n".join(lines) + "\n"


def write_result(out: Path, result: CKAResult, summary: dict) -> None:
    """A CKA run written into `out`: cka.npz, one heatmap PNG per matrix and summary.json, each file
    whole or not at all (`write_atomic`)."""
    names = tuple(m["name"] for m in summary["models"])
    write_atomic(out / CKA_FILE, result.npz_bytes())
    for matrix, image in heatmaps(result, names, tokens=summary["tokens"]).items():
        write_atomic(out / f"{matrix}.png", png_bytes(image))
    write_atomic(out / SUMMARY, (json.dumps(summary, indent=1) + "\n").encode())


# ---- a data set, batch by batch -------------------------------------------------------------------------

def compare(*, models: Sequence[str], data: str | Path | Dataset, out: str | Path, limit: int | None = None,
            tokens: str = "mean", batch_size: int = 64, device: str | None = None, progress: bool = True,
            receptive: bool = False) -> CKAResult | None:
    """CKA of every layer of two models over the data (see the module docstring); writes OUT/cka.npz, the three
    heatmaps and summary.json. `receptive`: also every block's effective receptive field of both models averaged
    over the same images (`explain.receptive`), in OUT/receptive-field.npz with its plot. Under torchrun rank 0
    returns the result (the other ranks None)."""
    if len(models) != 2:
        raise ValueError(f"compare takes two models, not {len(models)}")
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {', '.join(TOKENS)}, not {tokens!r}")
    out = Path(out)
    with process_ranks(device) as ranks:
        dataset = data if isinstance(data, Dataset) else open_data(data)
        cut = batches(spread(len(dataset), limit), batch_size)
        if ranks.world > len(cut):
            raise ValueError(f"{len(cut)} batch(es) for {ranks.world} ranks: use fewer ranks or a smaller batch-size")
        loaded = [hub.load(name, device=ranks.device) for name in models]
        side = max(max(m.transform.resize) if isinstance(m.transform.resize, tuple) else m.transform.resize
                   for m in loaded)
        mine = ranks.mine(cut)
        acc, skipped, fields, last_traces = LayerCKA(), [], [ReceptiveFieldSum(), ReceptiveFieldSum()], None
        bar = tqdm(total=sum(map(len, mine)), unit="image", desc="compare", file=sys.stderr,
                   disable=not (progress and ranks.leader))
        for batch in mine:
            images = []
            for index in batch:
                try:
                    images.append(dataset.image(index, target_size=side))
                except ImageError as e:
                    skipped.append({"index": index, "id": dataset.ids[index], "reason": str(e)})
            if len(images) < MIN_BATCH:   # all of them unreadable but a few: too few for HSIC_1
                skipped += [{"index": index, "id": dataset.ids[index],
                             "reason": f"its batch has {len(images)} readable image(s), HSIC_1 needs {MIN_BATCH}"}
                            for index in batch if index not in {s["index"] for s in skipped}]
            else:
                last_traces = traced_pair(loaded, images)
                acc.add_traces(*last_traces, tokens=tokens)
                if receptive:
                    for field, model in zip(fields, loaded):
                        pixels = torch.cat([model.preprocess(image) for image in images])
                        field.add(receptive_field(model.model, pixels), len(images))
            bar.update(len(batch))
        bar.close()
        acc.all_reduce()
        if receptive:
            for field in fields:
                field.all_reduce()
        gathered = ranks.gather(json.dumps(skipped))
        if not ranks.leader:
            return None
        skipped = sorted((s for text in gathered for s in json.loads(text)), key=lambda s: s["index"])
        result = acc.result()
        summary = {"vitviz_version": __version__,
                   "models": [{"name": m.name, "source": m.source_info()} for m in loaded],
                   "data": {"name": dataset.name, "images": result.images, "limit": limit, "skipped": skipped},
                   "tokens": tokens, "batch_size": batch_size, "batches": len(cut),
                   "estimator": "minibatch linear CKA, debiased (HSIC_1 summed over batches, normalised once)",
                   "layers": {"a": list(result.layers_a), "b": list(result.layers_b)},
                   "files": [CKA_FILE, *(f"{m}.png" for m in MATRICES), SUMMARY]}
        if receptive:
            from .render.compare import reach_plot

            found = [field.result() for field in fields]
            write_atomic(out / RECEPTIVE_FILE, receptive_npz(found, last_traces))
            write_atomic(out / RECEPTIVE_PLOT,
                         png_bytes(reach_plot(reach_curves(found, last_traces, [m.name for m in loaded]))))
            summary["receptive_field"] = {
                m.name: {"r50_px": [round(float(v), 2) for v in f.r50], "r90_px": [round(float(v), 2) for v in f.r90],
                         "input_size": list(f.input_size)} for m, f in zip(loaded, found)}
            summary["files"] += [RECEPTIVE_FILE, RECEPTIVE_PLOT]
        write_result(out, result, summary)
    print(f"compared {loaded[0].name} and {loaded[1].name} over {result.images} images ({len(skipped)} skipped), "
          f"tokens={tokens}: {out / CKA_FILE}")
    return result
