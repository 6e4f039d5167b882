"""A concept of a dictionary drawn: its map over the photo, its top images from a data set with their maps, and
both on one card (near square, as a gallery shows its items; its words go beside it as page text), with what the
concept looks like (its feature pictures, `render.looks`) in a row between them.

A concept's map is its code at each cell of a grid that tiles a rectangle of the photo evenly (the model's tokens
as `concepts.activations.align` cuts them, or the cells of a dictionary across models): the rectangle is given as
`region`, (y0, x0, y1, x1) in fractions of the photo's height and width, so the same drawing serves the photo on its
canvas and a thumbnail of any size. Each cell is coloured on its own (nearest: a cell is what the dictionary read), and
its opacity grows with the code, so the photo shows through where the concept does not fire:

    colour = cmap(u),   opacity = OPACITY · u,   u = clip(code / vmax, 0, 1)
"""
from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from .canvas import UNSEEN_TABLE, as_map, as_rgb
from .captions import STRIP, Ink, put_text, tile
from .looks import picture_row
from .overlay import DEFAULT_CMAP, colorize, normalise

Region = tuple[float, float, float, float]   # (y0, x0, y1, x1), fractions of the image's height and width
OPACITY = 0.7    # of a cell at the top of the scale: the picture still shows through
GAP = 3          # px between a card's pictures
CARD_WIDTH, PHOTO_HEIGHT = 400, 260   # px: a card, and the box its photo is fitted into
PER_ROW = 5      # exemplar tiles in a card's one row; more go in two


def region_box(region: Region, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) in pixels of an image of `size` (h, w): `region` rounded to whole pixels, at least
    one pixel each way."""
    h, w = size
    y0, x0, y1, x1 = region
    top, left = min(round(y0 * h), h - 1), min(round(x0 * w), w - 1)
    return top, left, max(round(y1 * h), top + 1), max(round(x1 * w), left + 1)


def cell_overlay(image, values, region: Region, *, vmax: float, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """A map of gh gw `values` (a concept's codes) over the `region` of `image` (h w 3 uint8), each cell its own
    colour, its opacity growing with the value (the module docstring); a copy, the rest of the image as it was."""
    out = as_rgb(image).copy()
    values = as_map(values)
    top, left, bottom, right = region_box(region, out.shape[:2])
    unit = normalise(values, 0.0, vmax) if vmax > 0 else np.zeros_like(values)
    size = (right - left, bottom - top)
    colours = cv2.resize(colorize(unit, cmap), size, interpolation=cv2.INTER_NEAREST).astype(np.float32)
    opacity = cv2.resize(unit * OPACITY, size, interpolation=cv2.INTER_NEAREST)[..., None]
    under = out[top:bottom, left:right].astype(np.float32)
    out[top:bottom, left:right] = np.round(under + opacity * (colours - under)).astype(np.uint8)
    return out


def exemplar_tile(thumbnail, values, region: Region, *, vmax: float, side: int, label: str,
                  cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """One of a concept's top images: the `thumbnail` scaled to `side` px on its longer side, darkened where the
    model never saw it (outside `region`), the concept's map over it, and `label` (its class and value) under it on
    the tile."""
    picture = as_rgb(thumbnail)
    h, w = picture.shape[:2]
    scale = side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    picture = cv2.resize(picture, size, interpolation=cv2.INTER_CUBIC if scale > 1 else cv2.INTER_AREA)
    top, left, bottom, right = region_box(region, picture.shape[:2])
    dimmed = cv2.LUT(picture, UNSEEN_TABLE)
    dimmed[top:bottom, left:right] = picture[top:bottom, left:right]
    out = np.empty((side, side, 3), np.uint8)
    out[:] = STRIP
    y, x = (side - picture.shape[0]) // 2, (side - picture.shape[1]) // 2
    out[y:y + picture.shape[0], x:x + picture.shape[1]] = cell_overlay(dimmed, values, region, vmax=vmax, cmap=cmap)
    ink = Ink.for_size((side, side))
    put_text(out, label, (ink.line + 1, side - ink.text_size(label)[2] - ink.line - 1), ink)
    return out


def exemplar_layout(count: int) -> tuple[int, int]:
    """(tiles per row, side in px) of a card's `count` exemplar tiles: one row of up to `PER_ROW`, else two rows,
    across the card's width."""
    per_row = count if count <= PER_ROW else -(-count // 2)
    return per_row, (CARD_WIDTH - (per_row + 1) * GAP) // max(per_row, 1)


def photo_side(size: tuple[int, int]) -> int:
    """The longer side of a view of `size` (h, w) fitted into a card's photo box (`CARD_WIDTH` x `PHOTO_HEIGHT`):
    draw it at that size (`Canvas.thumbnail`) and the card places it as it is."""
    h, w = size
    return max(1, round(max(h, w) * min(CARD_WIDTH / w, PHOTO_HEIGHT / h)))


def concept_card(photo_view: np.ndarray, exemplars: Sequence[np.ndarray], *, title: str,
                 pictures: Sequence[tuple[str, np.ndarray]] | None = None) -> np.ndarray:
    """One concept on a card `CARD_WIDTH` px wide, near square (as a gallery shows it): the photo with its map,
    fitted into the card's width and `PHOTO_HEIGHT`, `title` on it; under it what the concept looks like (`pictures`,
    (label, picture) pairs, in `render.looks.picture_row`'s row; empty: the row says there are none yet; None: no
    row), then the exemplar tiles (squares of `exemplar_layout`'s side, in its rows), each picture above a tile."""
    photo = as_rgb(photo_view)
    h, w = photo.shape[:2]
    fitted = w <= CARD_WIDTH and h <= PHOTO_HEIGHT and (w == CARD_WIDTH or h == PHOTO_HEIGHT)   # `photo_side`'s
    if not fitted:
        scale = min(CARD_WIDTH / w, PHOTO_HEIGHT / h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        photo = cv2.resize(photo, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    per_row, side = exemplar_layout(len(exemplars) or PER_ROW)
    parts = [] if pictures is None else [picture_row(pictures, side=side, per_row=per_row, width=CARD_WIDTH)]
    if exemplars:
        strip = tile(list(exemplars), cols=per_row, gap=GAP)
        part = np.empty((strip.shape[0], CARD_WIDTH, 3), np.uint8)
        part[:] = STRIP
        x = (CARD_WIDTH - strip.shape[1]) // 2
        part[:, x:x + strip.shape[1]] = strip
        parts.append(part)
    out = np.empty((PHOTO_HEIGHT + sum(part.shape[0] for part in parts), CARD_WIDTH, 3), np.uint8)
    out[:] = STRIP
    x, y = (CARD_WIDTH - photo.shape[1]) // 2, (PHOTO_HEIGHT - photo.shape[0]) // 2
    out[y:y + photo.shape[0], x:x + photo.shape[1]] = photo
    y = PHOTO_HEIGHT
    for part in parts:
        out[y:y + part.shape[0]] = part
        y += part.shape[0]
    ink = Ink.for_size(out.shape[:2])
    put_text(out, title, (GAP + ink.line, GAP + ink.line_height(1.2)), ink, scale=1.2)
    return out
