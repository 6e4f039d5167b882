"""Where every token sits in the user's original image.

Two exact linear maps, composed:
- token -> model-input pixels, by chaining the embeddings' sliding windows (ViT's patchify; CvT's
  convolutional embeddings): token i of a grid covers input pixels [stride*i + offset, ... + size);
- model-input pixels -> original pixels, by undoing the centre crop (add its offset) and the resize
  (scale each axis by original/resized, PIL's continuous convention: pixel k spans [k, k+1)).

A `Frame` adds the display scale (huge originals are drawn smaller with the same aspect, tiny ones
larger) so that every view is drawn in one frame: the original image's, scaled.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..models.trace import Embedding, Window
from ..preprocess import Transform

MAX_SIDE, MIN_SIDE = 768, 256   # display sizes: originals outside this range are scaled to fit it


@dataclass(frozen=True)
class Field:
    """Where the tokens of one grid read the model's input: token (i, j) covers the square of side
    `size` at (stride*j + offset, stride*i + offset), in input pixels (x, y)."""

    grid: tuple[int, int]   # (h, w) tokens
    stride: int             # input pixels between neighbouring tokens (the effective stride)
    offset: int             # where token 0's window starts; negative: it reaches into zero padding
    size: int               # side of the receptive field, input pixels

    def then(self, window: Window, grid: tuple[int, int]) -> "Field":
        """The field of a grid made by sliding `window` over this one (a conv on top of a conv)."""
        return Field(grid=tuple(grid), stride=self.stride * window.stride,
                     offset=self.offset - self.stride * window.padding,
                     size=self.size + (window.kernel - 1) * self.stride)

    def start(self, index):
        """First input pixel of token `index` along an axis (arrays welcome)."""
        return self.stride * np.asarray(index) + self.offset

    def centre(self, index):
        """Receptive-field centre of token `index` along an axis, continuous input coordinates."""
        return self.start(index) + self.size / 2

    def box(self, i: int, j: int) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) of token (i, j)'s receptive field, input pixels, not clipped to the input."""
        x0, y0 = float(self.start(j)), float(self.start(i))
        return x0, y0, x0 + self.size, y0 + self.size

    def index(self, coord):
        """Token whose receptive-field centre is nearest to input coordinate `coord`, unclamped."""
        return np.floor((np.asarray(coord) - self.offset - self.size / 2) / self.stride + 0.5).astype(int)


def fields(embeddings: Sequence[Embedding]) -> list[Field]:
    """One `Field` per stage, chaining each embedding's window from the input pixels."""
    if not embeddings:
        raise ValueError("no embeddings: pass trace.embeddings of a traced forward pass")
    field = Field(grid=tuple(embeddings[0].in_grid), stride=1, offset=0, size=1)
    out = []
    for stage, emb in enumerate(embeddings):
        if tuple(emb.in_grid) != field.grid:
            raise ValueError(f"embedding {stage} reads a {emb.in_grid} grid but the one before it makes {field.grid}")
        field = field.then(emb.window, emb.grid)
        out.append(field)
    return out


def display_size(image_size: tuple[int, int], *, max_side: int = MAX_SIDE, min_side: int = MIN_SIDE) -> tuple[int, int]:
    """(h, w) the views are drawn at: the original's, unless its long side is over `max_side` or
    under `min_side`, then scaled (same aspect) so the long side is exactly that."""
    h, w = image_size
    long = max(h, w)
    scale = max_side / long if long > max_side else min_side / long if long < min_side else 1.0
    return max(1, round(h * scale)), max(1, round(w * scale))


@dataclass(frozen=True)
class Frame:
    """The maps between model-input pixels, original-image pixels and display pixels (all (x, y),
    continuous: pixel k spans [k, k+1))."""

    image_size: tuple[int, int]     # (h, w) of the user's original image
    display_size: tuple[int, int]   # (h, w) the views are drawn at
    transform: Transform

    @classmethod
    def fit(cls, image_size: tuple[int, int], transform: Transform, *, max_side: int = MAX_SIDE,
            min_side: int = MIN_SIDE) -> "Frame":
        return cls(tuple(image_size), display_size(image_size, max_side=max_side, min_side=min_side), transform)

    @property
    def input_size(self) -> tuple[int, int]:
        return self.transform.crop

    def _input_to_resized(self):
        """(scale_x, scale_y, left, top): input x -> original x is (x + left) * scale_x."""
        rh, rw = self.transform.resized_size(self.image_size)
        top, left, _, _ = self.transform.crop_box(self.image_size)
        return self.image_size[1] / rw, self.image_size[0] / rh, left, top

    def to_original(self, x, y):
        """Model-input coordinates -> original-image coordinates."""
        sx, sy, left, top = self._input_to_resized()
        return (np.asarray(x) + left) * sx, (np.asarray(y) + top) * sy

    def to_display(self, x, y):
        """Model-input coordinates -> display coordinates."""
        ox, oy = self.to_original(x, y)
        return ox * self.display_size[1] / self.image_size[1], oy * self.display_size[0] / self.image_size[0]

    def to_input(self, x, y):
        """Display coordinates -> model-input coordinates."""
        sx, sy, left, top = self._input_to_resized()
        ox = np.asarray(x) * self.image_size[1] / self.display_size[1]
        oy = np.asarray(y) * self.image_size[0] / self.display_size[0]
        return ox / sx - left, oy / sy - top

    def box_to_display(self, box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1) in input pixels -> the same rectangle in display pixels."""
        (x0, x1), (y0, y1) = self.to_display(np.array(box[0::2]), np.array(box[1::2]))
        return float(x0), float(y0), float(x1), float(y1)

    # a key of the canvases' caches, asked for by every view; Frames are frozen and at most 256 are kept alive
    @lru_cache(maxsize=256)   # noqa: B019
    def seen_box(self, field: Field) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1), input pixels: the part of the input some token of `field` reads (the crop,
        less any remainder a patchify without padding drops)."""
        (h, w), (gh, gw) = self.input_size, field.grid
        x0, y0 = max(0, field.offset), max(0, field.offset)
        x1 = min(w, field.start(gw - 1) + field.size)
        y1 = min(h, field.start(gh - 1) + field.size)
        return float(x0), float(y0), float(x1), float(y1)
