"""Heatmap overlays of token maps on the original image, colour maps and colour bars."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np

from .canvas import Canvas, as_map
from .captions import BLACK, STRIP, WHITE, Ink, put_text
from .geometry import Field

DEFAULT_CMAP = "inferno"   # perceptually uniform and colour-blind safe, like viridis and cividis
SIGNED_CMAP = "bwr"        # for maps with a sign (relevance): red for, blue against, white at 0 (LRP's convention)


# matplotlib's tables of the maps vitviz draws with and offers (inferno, viridis, cividis, magma, turbo, bwr), shipped
# so that drawing needs no matplotlib (a third of a second to import, in every process that draws): written by
# `np.savez_compressed(SHIPPED_CMAPS, **{name: matplotlib_colormap(name) for name in those})`, checked against
# matplotlib by tests/test_render.py
SHIPPED_CMAPS = Path(__file__).with_name("colormaps.npz")


@lru_cache(maxsize=16)
def colormap(name: str) -> np.ndarray:
    """256 x 3 uint8 lookup table of a matplotlib colour map ('viridis', 'inferno', 'turbo', ...): a shipped one
    (`SHIPPED_CMAPS`), else matplotlib's."""
    with np.load(SHIPPED_CMAPS) as shipped:
        lut = shipped[name] if name in shipped.files else matplotlib_colormap(name)
    lut.flags.writeable = False   # one table for every caller
    return lut


def matplotlib_colormap(name: str) -> np.ndarray:
    """A matplotlib colour map by name as a 256 x 3 uint8 table (for a map vitviz does not
    ship); ValueError for a name matplotlib does not know."""
    from matplotlib import colormaps  # only for a map vitviz does not ship
    if name not in colormaps:
        raise ValueError(f"unknown colour map {name!r}: try 'inferno', 'viridis', 'cividis' or 'turbo'")
    lut = colormaps[name].resampled(256)(np.arange(256))[:, :3]
    return np.round(lut * 255).astype(np.uint8)


def normalise(values: np.ndarray, vmin: float, vmax: float) -> np.ndarray:
    """values -> [0, 1] on the scale [vmin, vmax] (clipped); a flat scale gives 0.5 everywhere."""
    if vmax <= vmin:
        return np.full_like(values, 0.5, dtype=np.float32)
    # in place from here (a view's map is a megabyte), in the type `(values - vmin) / (vmax - vmin)` would have
    unit = np.subtract(values, vmin, dtype=np.result_type(values, vmin, vmax, np.float32))
    np.divide(unit, vmax - vmin, out=unit)
    return np.clip(unit, 0.0, 1.0, out=unit).astype(np.float32, copy=False)


def colorize(unit: np.ndarray, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """Values in [0, 1] -> RGB uint8 through the colour map (any shape; OpenCV's table lookup: 5x numpy's)."""
    unit = np.asarray(unit)
    index = cv2.convertScaleAbs(unit.reshape(-1, 1).astype(np.float32), alpha=255)   # rounds half to even, as np.round
    return cv2.LUT(cv2.merge([index] * 3), colormap(cmap)[:, None]).reshape(*unit.shape, 3)


def shared_scale(*token_maps) -> tuple[float, float]:
    """(vmin, vmax) covering all maps: pass it to each overlay so their colours are comparable.
    Maps from models with different grids are comparable only in a common unit, e.g. `per_uniform`."""
    arrays = [as_map(m) for m in token_maps]
    return float(min(a.min() for a in arrays)), float(max(a.max() for a in arrays))


def per_uniform(token_map) -> np.ndarray:
    """A non-negative map in multiples of the uniform map (its mean is 1): 3 means 'three times the
    share of a token under uniform attention', whatever the grid size."""
    array = as_map(token_map)
    mean = float(array.mean())
    if mean <= 0:
        raise ValueError("per_uniform needs a map with a positive mean (a non-negative relevance or attention map)")
    return array / mean


def overlay(canvas: Canvas, token_map, *, field: Field | int | None = None, mode: str = "bilinear",
            cmap: str = DEFAULT_CMAP, alpha: float = 0.55, vmin: float | None = None, vmax: float | None = None,
            style: str = "heatmap", point: tuple[float, float] | None = None) -> np.ndarray:
    """A token map drawn over the original image, h w 3 uint8 at the canvas size.

    field: the map's grid (a stage index or Field; default: the stage whose grid has the map's shape).
    mode: 'bilinear' (smooth) or 'nearest' (each token's cell, honest about the grid).
    style: 'heatmap' (colour map blended with `alpha`) or 'mask' (the ViT paper's: the normalised map
        as the image's opacity over black).
    vmin, vmax: the colour scale (default: the map's range; see `shared_scale`).
    point: a display point (x, y) to mark, e.g. the query of a query map.
    Where the model never looked the image stays shaded, without colour.
    """
    values = as_map(token_map)
    field = canvas.field(field, grid=values.shape)
    vmin = float(values.min()) if vmin is None else vmin
    vmax = float(values.max()) if vmax is None else vmax
    seen = canvas.seen_slices(field)   # colour is drawn only there: the rest is the shaded base
    image = np.ascontiguousarray(canvas.image[seen])
    if style == "heatmap":
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if mode == "nearest":   # each pixel shows one token's value: colour the tokens, then sample the colours
            colours = canvas.sample(colorize(normalise(values, vmin, vmax), cmap), field, mode=mode, at=seen)
        else:
            colours = colorize(normalise(canvas.sample(values, field, mode=mode, at=seen), vmin, vmax), cmap)
        drawn = cv2.addWeighted(image, 1 - alpha, colours, alpha, 0)
    elif style == "mask":
        unit = normalise(canvas.sample(values, field, mode=mode, at=seen), vmin, vmax)
        drawn = cv2.multiply(image, cv2.merge([unit] * 3), dtype=cv2.CV_8U)
    else:
        raise ValueError(f"style must be 'heatmap' or 'mask', not {style!r}")
    out = canvas.shaded(field).copy()
    out[seen] = drawn
    if point is not None:
        mark_point(out, point, canvas.ink)
    return out


def mark_point(image: np.ndarray, point: tuple[float, float], ink: Ink) -> None:
    """A crosshair ring at display point (x, y), in place: white on black, visible on any colour."""
    x, y = int(round(point[0])), int(round(point[1]))
    r = 4 * ink.line + 4
    for color, width in ((BLACK, ink.line + 2), (WHITE, ink.line)):
        cv2.circle(image, (x, y), r, color, width, cv2.LINE_AA)
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            cv2.line(image, (x + dx * r // 2, y + dy * r // 2), (x + dx * r * 3 // 2, y + dy * r * 3 // 2),
                     color, width, cv2.LINE_AA)


def colorbar(height: int, *, vmin: float, vmax: float, cmap: str = DEFAULT_CMAP, label: str | None = None,
             ink: Ink | None = None) -> np.ndarray:
    """A vertical colour bar, `height` px tall (vmax at the top), with tick values: h w 3 uint8."""
    ink = ink or Ink.for_size((height, height))
    ticks = [vmax, (vmin + vmax) / 2, vmin]
    texts = [f"{t:.3g}" for t in ticks]
    margin = ink.line_height()
    bar_w = max(10, ink.line_height())
    text_w = max(ink.text_size(t)[0] for t in texts + ([label] if label else []))
    x0 = 2 * ink.line
    width = x0 + max(bar_w + 4 * ink.line + text_w, text_w) + ink.line_height() // 2
    strip = np.empty((height, width, 3), np.uint8)
    strip[:] = STRIP
    top, bottom = margin + (ink.line_height() if label else 0), height - margin
    if bottom - top < 8:
        raise ValueError(f"a colour bar {height} px tall is too short to draw")
    ramp = np.linspace(1.0, 0.0, bottom - top, dtype=np.float32)
    strip[top:bottom, x0:x0 + bar_w] = colorize(ramp, cmap)[:, None]
    if label:
        put_text(strip, label, (x0, margin), ink, outline=None)
    for t, text in zip(np.linspace(top, bottom - 1, 3), texts):
        cv2.line(strip, (x0 + bar_w, int(t)), (x0 + bar_w + ink.line * 3, int(t)), WHITE, ink.line)
        put_text(strip, text, (x0 + bar_w + ink.line * 4, t + ink.text_size(text)[1] / 2), ink, outline=None)
    return strip


def with_colorbar(view: np.ndarray, *, vmin: float, vmax: float, cmap: str = DEFAULT_CMAP,
                  label: str | None = None) -> np.ndarray:
    """`view` with its colour bar on the right (the image keeps its pixel coordinates)."""
    return np.hstack([view, colorbar(view.shape[0], vmin=vmin, vmax=vmax, cmap=cmap, label=label,
                                     ink=Ink.for_size(view.shape[:2]))])
