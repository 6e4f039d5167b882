"""Model anatomy (the ViT paper's figure 7, for any checkpoint), faithfulness curves and token norms.

- principal components of the patch-embedding filters as RGB tiles (CvT: its stage-1 conv filters);
- cosine similarity of each position embedding with all others, one tile per patch position (CvT, Swin
  and the CNNs have no position embedding, and the panel says so);
- Swin's counterpart: each head's relative position bias, a (2w-1) x (2w-1) picture of the bias its
  attention adds for every offset between a query and a key of its window;
- mean attention distance per head against depth, several models on one plot;
- deletion / insertion curves with their areas under the curve;
- per-token norm maps with the high-norm outlier tokens ("Vision Transformers Need Registers") flagged.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import cv2
import numpy as np
import torch
from einops import rearrange
from torch import nn

from ..explain.artefacts import OUTLIER_Z, outliers
from .canvas import Canvas, as_map
from .captions import BLACK, STRIP, WHITE, Ink, put_text, text_box, tile
from .geometry import Field
from .overlay import SIGNED_CMAP, colorize, normalise, overlay, with_colorbar
from .plots import PLOT_COLOURS, figure_to_rgb


def pca(x: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Principal components of the rows of x (n d), centred: (scores n k, components k d), k =
    min(count, n, d). Each component's sign makes its largest-magnitude entry positive."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(axis=0)
    (n, d), k = centred.shape, min(count, x.shape[1], max(1, x.shape[0] - 1))
    # eigenvectors of the smaller Gram matrix: a small symmetric eigenproblem instead of an SVD of x
    # (tens of ms instead of seconds for a stage-1 feature map)
    evals, evecs = np.linalg.eigh(centred.T @ centred if n >= d else centred @ centred.T)
    order = np.argsort(evals)[::-1][:k]
    if n >= d:
        components = evecs[:, order].T
    else:   # right singular vectors from the left ones: v = x^T u / s
        components = (centred.T @ evecs[:, order] / np.sqrt(np.maximum(evals[order], 1e-30))).T
    signs = np.sign(components[np.arange(len(components)), np.abs(components).argmax(axis=1)])
    components = components * signs[:, None]
    return centred @ components.T, components


def embedding_filters(model: nn.Module) -> np.ndarray:
    """The first convolution that sees pixels, d 3 k k: ViT's and Swin's patch embedding, CvT's stage-1 embedding,
    a CNN's stem (every model registers it first)."""
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    return first.weight.detach().float().cpu().numpy()


def filter_components(weight, *, count: int = 28) -> np.ndarray:
    """The first `count` principal components of the RGB filters (d 3 k k), each as a k k 3 image
    scaled to [0, 1] by its own min and max: count k k 3."""
    weight = np.asarray(weight.detach().float().cpu() if hasattr(weight, "detach") else weight, dtype=np.float64)
    if weight.ndim != 4 or weight.shape[1] != 3:
        raise ValueError(f"expected RGB conv filters d 3 k k, got shape {weight.shape}")
    _, components = pca(rearrange(weight, 'd c kh kw -> d (c kh kw)'), count)
    tiles = rearrange(components, 'n (c kh kw) -> n kh kw c', c=3, kh=weight.shape[2])
    low = tiles.min(axis=(1, 2, 3), keepdims=True)
    span = tiles.max(axis=(1, 2, 3), keepdims=True) - low
    return (tiles - low) / np.where(span > 0, span, 1.0)


def filter_tiles(weight, *, count: int = 28, cols: int = 7, tile_px: int = 64) -> np.ndarray:
    """The principal components of the embedding filters as a grid of RGB tiles (ViT paper, fig. 7 left)."""
    tiles = filter_components(weight, count=count)
    k = tiles.shape[1]
    factor = max(1, round(tile_px / k))
    images = [np.kron(np.round(t * 255).astype(np.uint8), np.ones((factor, factor, 1), np.uint8)) for t in tiles]
    return tile(images, cols=min(cols, len(images)), gap=max(2, factor // 4))


def position_embedding(model: nn.Module) -> tuple[np.ndarray, tuple[int, int]] | None:
    """A ViT's position embeddings of the patch positions (prefix slots dropped), n c, with its grid;
    None for a model without absolute position embeddings (CvT, Swin, the CNNs)."""
    if getattr(model, "pos_embed", None) is None:
        return None
    prefix = 0 if model.config.no_embed_class else model.num_prefix
    return model.pos_embed[0, prefix:].detach().float().cpu().numpy(), model.grid


def position_similarity(pos_embed, grid: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of each position embedding with every other: gh gw gh gw, [i, j] the tile of
    patch (i, j)."""
    pos = np.asarray(pos_embed, dtype=np.float64)
    if pos.shape[0] != grid[0] * grid[1]:
        raise ValueError(f"{pos.shape[0]} position embeddings do not fill a {grid} grid")
    unit = pos / np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-12)
    return rearrange(unit @ unit.T, '(i j) (k l) -> i j k l', i=grid[0], k=grid[0])


def position_tiles(found: tuple[np.ndarray, tuple[int, int]] | None, *, cmap: str = "viridis",
                   side: int = 640) -> np.ndarray:
    """Position-embedding similarity tiles (ViT paper, fig. 7 centre) of `position_embedding`'s answer, with a
    colour bar over [-1, 1]; for a CvT (None), a panel saying why there is nothing to show."""
    if found is None:
        return _message_panel(["No absolute position embedding here.",
                               "Tokens know where they are from zero-padded",
                               "convolutions (CvT, the CNNs) or from the",
                               "relative position bias of their windows (Swin)."], side)
    pos, grid = found
    similarity = position_similarity(pos, grid)
    factor = max(1, side // max(grid) // max(grid))
    gap = max(1, factor // 2 + 1)
    colours = colorize(normalise(similarity, -1.0, 1.0), cmap)    # gh gw gh gw 3
    images = [np.kron(colours[i, j], np.ones((factor, factor, 1), np.uint8))
              for i in range(grid[0]) for j in range(grid[1])]
    return with_colorbar(tile(images, cols=grid[1], gap=gap), vmin=-1.0, vmax=1.0, cmap=cmap, label="cosine")


def relative_position_biases(model: nn.Module) -> list[np.ndarray] | None:
    """Every windowed block's relative position bias, in forward order, each h (2w-1) (2w-1): head h's bias on
    the attention logit of a key dy rows below and dx columns right of its query at [h, dy + w - 1, dx + w - 1]
    (the table is indexed by query minus key, so it is turned by 180 degrees); None for a model without (its
    attention has no relative bias table)."""
    tables = [m.relative_position_bias_table for m in model.modules() if hasattr(m, "relative_position_bias_table")]
    if not tables:
        return None
    out = []
    for table in tables:
        side = round(table.shape[0] ** 0.5)
        by_query_minus_key = rearrange(table.detach().float().cpu().numpy(), '(dy dx) h -> h dy dx', dy=side)
        out.append(np.ascontiguousarray(by_query_minus_key[:, ::-1, ::-1]))
    return out


def relative_bias_tiles(biases: list[np.ndarray] | None, layer: int, *, cmap: str = SIGNED_CMAP,
                        side: int = 640) -> np.ndarray:
    """Block `layer`'s relative position bias, one (2w-1) x (2w-1) tile per head (the centre: a query's bias on
    itself), on one colour scale symmetric about 0 with its colour bar; a panel saying why for a model without."""
    if biases is None:
        return _message_panel(["No relative position bias here:",
                               "only windowed attention (Swin) learns one,",
                               "a table per head of the bias its logits",
                               "get for each query-to-key offset."], side)
    if not 0 <= layer < len(biases):
        raise ValueError(f"layer must index one of the model's {len(biases)} windowed blocks, not {layer}")
    heads = biases[layer]
    vmax = max(float(np.abs(heads).max()), 1e-12)
    n = heads.shape[-1]
    cols = min(len(heads), 6)
    factor = max(2, (side // cols) // n)
    colours = colorize(normalise(heads, -vmax, vmax), cmap)   # h n n 3
    images = []
    for tile_rgb in colours:
        big = np.kron(tile_rgb, np.ones((factor, factor, 1), np.uint8))
        c = (n // 2) * factor
        cv2.rectangle(big, (c, c), (c + factor - 1, c + factor - 1), BLACK, 1)   # offset (0, 0): the query itself
        images.append(big)
    return with_colorbar(tile(images, cols=cols, gap=max(2, factor // 2)), vmin=-vmax, vmax=vmax, cmap=cmap,
                         label="bias")


def _message_panel(lines: Sequence[str], side: int) -> np.ndarray:
    panel = np.empty((side // 2, side, 3), np.uint8)
    panel[:] = STRIP
    ink = Ink.for_size((side, side))
    lh = ink.line_height(1.2)
    top = panel.shape[0] / 2 - lh * (len(lines) - 1) / 2
    for k, line in enumerate(lines):
        put_text(panel, line, (side / 2, top + k * lh), ink, scale=1.2, anchor="centre", outline=None)
    return panel


def attention_distance_plot(distances: Mapping[str, Sequence[Sequence[float]]], *,
                            unit: str = "model-input px") -> np.ndarray:
    """Mean attention distance of every head against depth (ViT paper, fig. 7 right), one colour per
    model. distances: model name -> per layer (forward order), the per-head distances (head counts
    may differ between layers, as in CvT's stages). No model with attention: a panel saying so."""
    if not distances:
        return _message_panel(["Neither model has attention:", "a CNN's reach is its receptive field",
                               "(Compare > How far each layer looks)."], 640)
    from matplotlib.figure import Figure  # matplotlib only where a plot is drawn
    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    ax = fig.add_subplot()
    markers = "osD^v"
    for k, (name, layers) in enumerate(distances.items()):
        offset = (k - (len(distances) - 1) / 2) * 0.15   # side by side, not on top of each other
        colour = PLOT_COLOURS[k % len(PLOT_COLOURS)]
        for depth, heads in enumerate(layers, start=1):
            heads = np.asarray(heads, dtype=float).ravel()
            ax.scatter(np.full(len(heads), depth + offset), heads, s=22, color=colour, marker=markers[k % 5],
                       alpha=0.8, label=name if depth == 1 else None, edgecolors="none")
        means = [np.mean(np.asarray(heads, dtype=float)) for heads in layers]
        ax.plot(np.arange(1, len(layers) + 1) + offset, means, color=colour, lw=1, alpha=0.6)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel(f"mean attention distance ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return figure_to_rgb(fig)


def faithfulness_plot(*, fractions, deletion: Mapping[str, Sequence[float]],
                      insertion: Mapping[str, Sequence[float]], target: str | None = None) -> np.ndarray:
    """Deletion and insertion curves side by side, each labelled with its area under the curve
    (trapezoidal over `fractions`). Curves whose name contains 'random' are drawn as grey dashes.
    Deletion: lower is better; insertion: higher is better."""
    x = np.asarray(fractions, dtype=float)
    from matplotlib.figure import Figure  # matplotlib only where a plot is drawn
    fig = Figure(figsize=(8.0, 3.6), dpi=100)
    for k, (title, curves, better) in enumerate((("deletion", deletion, "lower"), ("insertion", insertion, "higher"))):
        ax = fig.add_subplot(1, 2, k + 1)
        for c, (name, curve) in enumerate(curves.items()):
            y = np.asarray(curve, dtype=float)
            if y.shape != x.shape:
                raise ValueError(f"{title} curve {name!r} has {y.shape} points for {x.shape} fractions")
            random = "random" in name.lower()
            ax.plot(x, y, ls="--" if random else "-", lw=1.5 if random else 2,
                    color="0.5" if random else PLOT_COLOURS[c % len(PLOT_COLOURS)],
                    label=f"{name} (AUC {np.trapezoid(y, x):.3f})")
        ax.set_title(f"{title} ({better} AUC is better)", fontsize=10)
        ax.set_xlabel("fraction of the image " + ("removed" if title == "deletion" else "inserted"))
        ax.set_ylabel(f"p({target})" if target else "target-class probability")
        ax.set_xlim(x.min(), x.max())
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_to_rgb(fig)


def outlier_tokens(norms, *, z: float = OUTLIER_Z) -> np.ndarray:
    """Tokens whose norm is more than `z` robust standard deviations (1.4826 MAD) above the median
    (`vitviz.explain.artefacts`' rule), for a norm map of any kind."""
    return outliers(torch.from_numpy(as_map(norms)), z=z).numpy()


def token_norm_map(canvas: Canvas, norms, *, field: Field | int | None = None,
                   prefix_norms: Mapping[str, float] | None = None, z: float = OUTLIER_Z,
                   cmap: str = "viridis", legend: bool = True) -> np.ndarray:
    """Per-token norms on the image (each token's cell), outliers ringed and their norms written on;
    with `legend`, the median and any prefix tokens' norms (e.g. {'class token': 41.2}) in the corner."""
    values = as_map(norms)
    field = canvas.field(field, grid=values.shape)
    out = overlay(canvas, values, field=field, mode="nearest", cmap=cmap, alpha=0.65)
    flagged = outlier_tokens(values, z=z)
    ring_tokens(out, canvas, flagged, field=field, labels=values)
    if legend:
        count = int(flagged.sum())
        lines = [f"median norm {np.median(values):.3g}, max {values.max():.3g}",
                 f"{count} outlier token{'s' * (count != 1)} (ringed: > {z:g} robust SD above median)"]
        lines += [f"{name}: {value:.3g}" for name, value in (prefix_norms or {}).items()]
        text_box(out, lines, canvas.ink)
    return out


def ring_tokens(out: np.ndarray, canvas: Canvas, tokens: np.ndarray, *, field: Field,
                labels: np.ndarray | None = None) -> None:
    """A white ring (on black, visible on any colour) around each token of the h w bool map `tokens`, in
    place, with its value from `labels` (h w) written above it."""
    ink = canvas.ink
    for i, j in np.argwhere(tokens):
        x, y = canvas.frame.to_display(field.centre(j), field.centre(i))
        x0, _, x1, _ = canvas.frame.box_to_display(field.box(i, j))
        radius = max(4, round(0.6 * (x1 - x0) * field.stride / field.size))   # 0.6 of a token's cell
        centre = (int(round(float(x))), int(round(float(y))))
        cv2.circle(out, centre, radius, BLACK, ink.line + 2, cv2.LINE_AA)
        cv2.circle(out, centre, radius, WHITE, ink.line, cv2.LINE_AA)
        if labels is not None:
            put_text(out, f"{labels[i, j]:.3g}", (centre[0], centre[1] - radius - ink.line_height() // 2), ink,
                     anchor="centre", scale=0.9)
