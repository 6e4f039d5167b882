"""Two models side by side over depth: the logit lens's curve of each model's final class, the per-token
lens (each token coloured by its top class, with a legend), and the residual stream's share per block.
Depth is relative (block i of L at i / L), so models of different depths share one axis."""
from __future__ import annotations

from typing import Mapping, Sequence

import cv2
import numpy as np

from .canvas import Canvas
from .captions import STRIP, WHITE, Ink, put_text
from .geometry import Field
from .plots import PLOT_COLOURS, figure_to_rgb

# a token's top class: Okabe & Ito's colour-blind-safe palette without black (orange, sky blue, bluish green,
# yellow, blue, vermillion, reddish purple); the classes beyond it share grey
CLASS_COLOURS = ((230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (0, 114, 178), (213, 94, 0),
                 (204, 121, 167))
OTHER_COLOUR = (150, 150, 150)


def lens_plot(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
              chance: float | None = None) -> np.ndarray:
    """The logit lens's probability of each model's final class after every block it reads, over relative
    depth. curves: legend label -> (relative depths, probabilities); `chance`: 1 / classes, drawn dotted."""
    from matplotlib.figure import Figure  # matplotlib only where a plot is drawn
    fig = Figure(figsize=(6.4, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for k, (label, (depth, probs)) in enumerate(curves.items()):
        ax.plot(depth, probs, marker="osD^v"[k % 5], lw=2, color=PLOT_COLOURS[k % len(PLOT_COLOURS)], label=label)
    if chance is not None:
        ax.axhline(chance, ls=":", color="0.5", lw=1, label=f"chance (1/{round(1 / chance)})")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("relative depth (block i of L at i / L)")
    ax.set_ylabel("probability of the final class")
    ax.set_title("the logit lens: when each model commits to its class", loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncol=3, frameon=False)   # clear of the page's overlays
    return figure_to_rgb(fig)


def residual_plot(shares: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]]) -> np.ndarray:
    """Per block, ||x_in|| / ||x_out - x_in|| over relative depth: each model in its colour, the class token
    solid (NaN where a block has none: not drawn), the grid tokens' mean dashed; 1 dotted.
    shares: model name -> (relative depths, class token, grid tokens)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.4, 4.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for k, (name, (depth, cls, grid)) in enumerate(shares.items()):
        colour, marker = PLOT_COLOURS[k % len(PLOT_COLOURS)], "osD^v"[k % 5]
        if not np.isnan(np.asarray(cls, dtype=float)).all():
            ax.plot(depth, cls, marker=marker, lw=2, color=colour, label=f"{name}: class token")
        ax.plot(depth, grid, marker=marker, lw=1.5, ls="--", color=colour, mfc="none", label=f"{name}: grid tokens")
    ax.axhline(1.0, ls=":", color="0.5", lw=1)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("relative depth (block i of L at i / L)")
    ax.set_ylabel("||x_in|| / ||x_out - x_in||")
    ax.set_title("the residual stream: what each block passes on against what it adds", loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncol=2, frameon=False)
    return figure_to_rgb(fig)


def class_colours(*class_maps: np.ndarray) -> dict[int, tuple[int, int, int]]:
    """The most frequent classes over the maps (as many as `CLASS_COLOURS` has), most frequent first, each with
    its colour: maps of models with the same classes get one legend's colours."""
    classes, counts = np.unique(np.concatenate([np.ravel(m) for m in class_maps]), return_counts=True)
    order = classes[np.argsort(-counts, kind="stable")][:len(CLASS_COLOURS)]
    return {int(c): colour for c, colour in zip(order, CLASS_COLOURS)}


def lens_patches(canvas: Canvas, classes: np.ndarray, probs: np.ndarray, labels: Sequence[str], *,
                 colours: Mapping[int, tuple[int, int, int]], field: Field | int | None = None,
                 alpha: float = 0.6) -> np.ndarray:
    """Each token's cell coloured by its top class (`colours`; any other class grey) over the image, what the
    model never saw shaded, and a legend under it: per class, its colour, how many tokens and their mean top
    probability. classes, probs: gh gw."""
    classes, probs = np.asarray(classes), np.asarray(probs, dtype=np.float32)
    field = canvas.field(field, grid=classes.shape)
    palette = np.array([*colours.values(), OTHER_COLOUR], np.uint8)
    slot = np.array([list(colours).index(c) if c in colours else len(colours) for c in classes.ravel()],
                    np.float32).reshape(classes.shape)
    seen = canvas.seen_slices(field)
    cells = palette[canvas.sample(slot, field, mode="nearest", at=seen).round().astype(int)]
    out = canvas.shaded(field).copy()
    out[seen] = cv2.addWeighted(np.ascontiguousarray(canvas.image[seen]), 1 - alpha, cells, alpha, 0)
    entries = []
    for c in [c for c in colours if (classes == c).any()]:
        chosen = classes == c
        entries.append((colours[c], f"{labels[c]}: {tokens(int(chosen.sum()))}, mean p {probs[chosen].mean():.2f}"))
    others = ~np.isin(classes, list(colours))
    if others.any():
        entries.append((OTHER_COLOUR, f"{len(np.unique(classes[others]))} other classes: {tokens(int(others.sum()))}"))
    return np.vstack([out, legend(entries, out.shape[1], Ink.for_size(out.shape[:2]))])


def tokens(count: int) -> str:
    """'1 token', '2 tokens': a count of tokens in words, for captions."""
    return f"{count} token{'s' * (count != 1)}"


def legend(entries: Sequence[tuple[tuple[int, int, int], str]], width: int, ink: Ink) -> np.ndarray:
    """A strip `width` px wide of (colour swatch, text) entries, as many to a line as fit."""
    lh, gap = ink.line_height(), ink.line_height() // 2
    swatch = ink.text_size("A")[1] + 2
    placed, x, line = [], gap, 0
    for colour, text in entries:
        w = swatch + gap // 2 + ink.text_size(text)[0]
        if x > gap and x + w > width - gap:
            x, line = gap, line + 1
        placed.append((x, line, colour, text))
        x += w + 2 * gap
    strip = np.empty((lh * (line + 1) + gap, width, 3), np.uint8)
    strip[:] = STRIP
    for x, line, colour, text in placed:
        base = gap // 2 + lh * line + (lh + swatch) // 2
        cv2.rectangle(strip, (x, base - swatch), (x + swatch, base), colour, -1)
        put_text(strip, text, (x + swatch + gap // 2, base), ink, color=WHITE, outline=None)
    return strip


def reach_plot(reaches: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
               distances: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> np.ndarray:
    """How far each layer looks (Raghu et al. 2021's comparison): per model, the radius holding 50 % (solid)
    and 90 % (dashed) of each block's effective receptive field, and for a model with attention its mean
    attention distance (dotted), all as shares of the input's side over relative depth, so models of any depth
    and input size share the axes. reaches: name -> (depths, r50, r90); distances: name -> (depths, distance)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.4, 4.4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for k, (name, (depth, r50, r90)) in enumerate(reaches.items()):
        colour, marker = PLOT_COLOURS[k % len(PLOT_COLOURS)], "osD^v"[k % 5]
        ax.plot(depth, r50, marker=marker, lw=2, color=colour, label=f"{name}: 50 % of the field")
        ax.plot(depth, r90, marker=marker, lw=1.5, ls="--", color=colour, mfc="none", label=f"{name}: 90 %")
        if distances and name in distances:
            ax.plot(*distances[name], lw=1.5, ls=":", color=colour, label=f"{name}: mean attention distance")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("relative depth (block i of L at i / L)")
    ax.set_ylabel("radius, share of the input's side")
    ax.set_title("how far each layer looks: effective receptive field radii", loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center", ncol=2, frameon=False)
    return figure_to_rgb(fig)


def receptive_view(canvas: Canvas, values, *, centre: tuple[float, float], r50: float, r90: float,
                   cmap: str = "inferno") -> np.ndarray:
    """One block's effective receptive field (H W, at the model's input resolution) over the photo, with circles
    of the radii holding 50 % (solid) and 90 % (dashed) of it around the centre token (`centre` (y, x), input
    pixels)."""
    from .overlay import overlay  # the map module's own drawing, at pixel resolution
    h, w = np.asarray(values).shape[-2:]
    field = Field(grid=(h, w), stride=1, offset=0, size=1)
    out = overlay(canvas, values, field=field, cmap=cmap, alpha=0.7)
    cy, cx = centre
    x, y = canvas.frame.to_display(cx, cy)
    scale = canvas.frame.to_display(cx + 1.0, cy)[0] - x   # display px per input px
    ink = canvas.ink
    for radius, dashed in ((r50, False), (r90, True)):
        r = max(1, int(round(radius * float(scale))))
        centre_px = (int(round(float(x))), int(round(float(y))))
        if dashed:
            for start in range(0, 360, 20):
                cv2.ellipse(out, centre_px, (r, r), 0, start, start + 10, WHITE, ink.line, cv2.LINE_AA)
        else:
            cv2.circle(out, centre_px, r, WHITE, ink.line, cv2.LINE_AA)
    return out
