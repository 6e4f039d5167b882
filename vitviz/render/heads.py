"""Every head at a glance, and DINO's mass-threshold display.

- `head_tile`: one head's map over the image on its own colour scale (heads differ in how peaked they
  are, so a shared scale would leave most of them dark), with a token set, e.g. the tokens holding 60 %
  of the head's attention (`explain.mass_threshold`), drawn as an outline over the heat map, or as a
  mask: the image kept under the set and dimmed elsewhere (DINO's figures);
- `layer_strip`: the tiles of one layer's heads side by side at thumbnail size, one row of the model
  view (every layer x head, the view attention tools for text call the model view).

Captions (which head, which layer, which token) are the caller's: in the app they are page text.
"""
from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np

from .canvas import Canvas, as_map
from .captions import BLACK, WHITE, tile
from .geometry import Field
from .overlay import DEFAULT_CMAP, overlay

STYLES = ("outline", "mask")
MASK_DIM = 0.25   # brightness left outside the token set in the 'mask' style


def head_tile(canvas: Canvas, values, *, field: Field | int | None = None, mask: np.ndarray | None = None,
              style: str = "outline", cmap: str = DEFAULT_CMAP, point: tuple[float, float] | None = None) -> np.ndarray:
    """One head's map (gh gw) over the image on its own scale; `mask` (gh gw bool): a token set to draw, as
    its `style`: 'outline' (its boundary over the heat map) or 'mask' (the image under it, the rest dimmed)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, not {style!r}")
    values = as_map(values)
    field = canvas.field(field, grid=values.shape)
    if mask is None:
        return overlay(canvas, values, field=field, cmap=cmap, point=point)
    mask = np.asarray(mask, bool)
    if mask.shape != values.shape:
        raise ValueError(f"the token set's shape {mask.shape} is not the map's {values.shape}")
    inside = np.zeros(canvas.size, bool)
    seen = canvas.seen_slices(field)
    inside[seen] = canvas.sample(mask.astype(np.float32), field, mode="nearest", at=seen) > 0.5
    if style == "mask":
        out = canvas.shaded(field).copy()
        out[~inside] = (out[~inside] * MASK_DIM).astype(np.uint8)
        return out
    out = overlay(canvas, values, field=field, cmap=cmap, point=point)
    contours, _ = cv2.findContours(inside.astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    line = canvas.ink.line
    cv2.drawContours(out, contours, -1, BLACK, line + 2, cv2.LINE_AA)
    cv2.drawContours(out, contours, -1, WHITE, line, cv2.LINE_AA)
    return out


def layer_strip(canvas: Canvas, maps, *, field: Field | int | None = None, masks: Sequence[np.ndarray] | None = None,
                style: str = "outline", side: int = 160, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """One layer's heads (h gh gw maps) as `side`-px tiles in one row, head 1 on the left."""
    thumb = canvas.thumbnail(side)
    maps = as_map(maps, channels=True)
    masks = [None] * len(maps) if masks is None else masks
    return tile([head_tile(thumb, m, field=field, mask=k, style=style, cmap=cmap) for m, k in zip(maps, masks)],
                cols=len(maps), gap=2)
