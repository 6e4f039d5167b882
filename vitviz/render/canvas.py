"""One image as one model saw it: the display-size picture, the geometry back to the model's input, and
the caches every view shares (shaded bases, resampling tables), built once per (image, transform, model)."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import cv2
import numpy as np
from PIL import Image

from ..models.trace import Embedding
from ..preprocess import Transform
from .captions import Ink
from .geometry import MAX_SIDE, MIN_SIDE, Field, Frame, fields

UNSEEN_DIM = 0.3      # brightness left where the model never looked
UNSEEN_TABLE = (np.arange(256) * UNSEEN_DIM).astype(np.uint8)   # per value: one lookup per pixel
HATCH_PERIOD = 10     # px between the diagonal hatch lines of that region, at a 512 px long side


def as_rgb(image) -> np.ndarray:
    """PIL image or h w [c] uint8 array -> h w 3 uint8 (greyscale repeated, alpha dropped)."""
    if isinstance(image, Image.Image):   # read-only pixels: the canvas resizes or copies them
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise ValueError(f"image must be uint8 (0-255), got {array.dtype}: convert it, e.g. (x * 255).astype(np.uint8)")
    if array.ndim == 2:
        return np.repeat(array[..., None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(f"image must be h w, h w 3 or h w 4, got shape {array.shape}")
    return np.ascontiguousarray(np.repeat(array, 3, axis=2) if array.shape[2] == 1 else array[..., :3])


def as_map(values, *, channels: bool = False) -> np.ndarray:
    """A token map (numpy or torch; leading batch dims of size 1 dropped) -> float32 h w [c], finite."""
    if hasattr(values, "detach"):   # torch tensor: convert at the boundary
        values = values.detach().float().cpu().numpy()
    array = np.asarray(values, dtype=np.float32)
    while array.ndim > (3 if channels else 2) and array.shape[0] == 1:
        array = array[0]
    if array.ndim != (3 if channels else 2):
        raise ValueError(f"expected a {'c h w' if channels else 'h w'} token map, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("the token map has NaN or infinite values")
    return array


class Canvas:
    """Display-size base image + geometry for one model's view of one image.

    `Canvas(image, transform, trace.embeddings)`; views are drawn by the functions in
    `vitviz.render` taking the canvas first. The display size is the original's unless its long side
    is over `max_side` or under `min_side` (then scaled, same aspect); points are (x, y) in it.
    """

    def __init__(self, image, transform: Transform, embeddings: Sequence[Embedding], *,
                 max_side: int = MAX_SIDE, min_side: int = MIN_SIDE):
        rgb = as_rgb(image)
        self.embeddings = list(embeddings)
        self.fields = fields(self.embeddings)
        if tuple(embeddings[0].in_grid) != tuple(transform.crop):
            raise ValueError(f"the model saw {tuple(embeddings[0].in_grid)} pixels but the transform crops "
                             f"{tuple(transform.crop)}: pass the transform that made the traced pixels")
        self.frame = Frame.fit(rgb.shape[:2], transform, max_side=max_side, min_side=min_side)
        self.image = _resize(rgb, self.frame.display_size)
        self._cache: dict = {}

    @classmethod
    def _scaled(cls, source: "Canvas", display: tuple[int, int]) -> "Canvas":
        canvas = cls.__new__(cls)
        canvas.embeddings, canvas.fields = source.embeddings, source.fields
        canvas.frame = Frame(source.frame.image_size, display, source.frame.transform)
        canvas.image = _resize(source.image, display)
        canvas._cache = {}
        return canvas

    @property
    def size(self) -> tuple[int, int]:
        """(h, w) of every view drawn on this canvas."""
        return self.frame.display_size

    @property
    def ink(self) -> Ink:
        return Ink.for_size(self.size)

    def thumbnail(self, max_side: int) -> "Canvas":
        """The same view geometry drawn at most `max_side` px on the long side (for galleries)."""
        h, w = self.size
        scale = min(1.0, max_side / max(h, w))
        display = (max(1, round(h * scale)), max(1, round(w * scale)))
        return self.cached(("thumbnail", display), lambda: Canvas._scaled(self, display))

    def field(self, field: Field | int | None = None, *, grid: tuple[int, int] | None = None) -> Field:
        """A Field, a stage index, or (None) the stage whose token grid is `grid`."""
        if isinstance(field, Field):
            return field
        if field is not None:
            return self.fields[field]
        matches = [f for f in self.fields if f.grid == tuple(grid)]
        if len(matches) != 1:
            raise ValueError(f"a {tuple(grid)} token map matches {len(matches)} of this model's grids "
                             f"{[f.grid for f in self.fields]}: pass field= (a stage index or a Field)")
        return matches[0]

    def seen_slices(self, field: Field) -> tuple[slice, slice]:
        """`seen(field)` as (rows, columns) slices of the display: it is always one rectangle, and
        slicing it is many times faster than masking with it."""
        def build():
            x0, y0, x1, y1 = self.frame.seen_box(field)
            x, y = _input_coords(self.frame)
            rows, cols = np.flatnonzero((y >= y0) & (y < y1)), np.flatnonzero((x >= x0) & (x < x1))
            return tuple(slice(i[0], i[-1] + 1) if len(i) else slice(0, 0) for i in (rows, cols))
        # keyed by the seen box: CvT stages whose tokens read the same pixels share every drawing
        return self.cached(("seen_slices", self.frame.seen_box(field)), build)

    def seen(self, field: Field) -> np.ndarray:
        """h w bool: display pixels whose centre lies in input pixels some token of `field` reads."""
        def build():
            mask = np.zeros(self.size, bool)
            mask[self.seen_slices(field)] = True
            return mask
        return self.cached(("seen", self.frame.seen_box(field)), build)

    def shaded(self, field: Field) -> np.ndarray:
        """The base image with what the model never saw darkened and hatched, outlined where it starts."""
        def build():
            out = cv2.LUT(self.image, UNSEEN_TABLE)
            lines = cv2.LUT(self.image, UNSEEN_TABLE // 2 + 60)   # lighter lines on any colour
            cv2.copyTo(lines, _hatch(self.size), out)
            seen = self.seen_slices(field)
            out[seen] = self.image[seen]
            x0, y0, x1, y1 = self.frame.box_to_display(self.frame.seen_box(field))   # outline just outside
            cv2.rectangle(out, (round(x0) - 1, round(y0) - 1), (round(x1), round(y1)), (200, 200, 200), 1)
            return out
        return self.cached(("shaded", self.frame.seen_box(field)), build)

    def sample(self, values: np.ndarray, field: Field, *, mode: str = "bilinear",
               at: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """A token map (h w or h w c, float32; or uint8 colours) resampled to the display: token values sit at
        their receptive-field centres; 'bilinear' interpolates between them, 'nearest' shows each token's cell.
        `at` (rows, cols): only those display pixels, with the same values: index arrays of one shape, or
        slices (a rectangle, e.g. `seen_slices`; its resampling tables are kept)."""
        if mode not in ("bilinear", "nearest"):
            raise ValueError(f"mode must be 'bilinear' or 'nearest', not {mode!r}")
        if values.shape[:2] != field.grid:
            raise ValueError(f"token map of shape {values.shape[:2]} does not match the grid {field.grid}")
        if at is not None and all(isinstance(i, slice) for i in at):   # a rectangle: its cropped tables are kept
            map_x, map_y = _remap_tables(self.frame, field, tuple((i.start, i.stop, i.step) for i in at))
        else:
            map_x, map_y = _remap_tables(self.frame, field)
            if at is not None:
                map_x, map_y = np.ascontiguousarray(map_x[at]), np.ascontiguousarray(map_y[at])
        flag = cv2.INTER_LINEAR if mode == "bilinear" else cv2.INTER_NEAREST
        values = np.ascontiguousarray(values, np.uint8 if values.dtype == np.uint8 else np.float32)
        return cv2.remap(values, map_x, map_y, flag, borderMode=cv2.BORDER_REPLICATE)

    def token_at(self, point: tuple[float, float], field: Field) -> tuple[int, int] | None:
        """The token (i, j) of `field` whose receptive-field centre is nearest a display point (x, y),
        or None where the model never saw that point."""
        x, y = self.frame.to_input(point[0], point[1])
        x0, y0, x1, y1 = self.frame.seen_box(field)
        if not (x0 <= x < x1 and y0 <= y < y1):
            return None
        (gh, gw) = field.grid
        return int(np.clip(field.index(y), 0, gh - 1)), int(np.clip(field.index(x), 0, gw - 1))

    def cached(self, key, build):
        """`build()`, computed once per key: for drawings that depend only on the image and the model."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


def _input_coords(frame: Frame) -> tuple[np.ndarray, np.ndarray]:
    """Model-input x of each display column's centre, y of each row's centre."""
    h, w = frame.display_size
    x, _ = frame.to_input(np.arange(w) + 0.5, 0.0)
    _, y = frame.to_input(0.0, np.arange(h) + 0.5)
    return np.asarray(x), np.asarray(y)


@lru_cache(maxsize=16)   # at most 16 x 2 tables of a 768 px display: 56 MB, kept in a long-running app
def _remap_tables(frame: Frame, field: Field, crop: tuple[tuple, tuple] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cv2.remap's tables from display pixels to `field`'s fractional token index, for the whole display or its
    `crop` ((start, stop, step) of rows and of columns), read-only: kept across canvases, since they depend on the
    geometry alone (the same for every photo of one size through one model)."""
    x, y = _input_coords(frame)
    # fractional token index: token k's centre is at stride*k + offset + size/2
    u = ((x - field.offset - field.size / 2) / field.stride).astype(np.float32)
    v = ((y - field.offset - field.size / 2) / field.stride).astype(np.float32)
    if crop is not None:
        rows, cols = (slice(*c) for c in crop)
        u, v = u[cols], v[rows]
    tables = np.broadcast_to(u[None, :], (len(v), len(u))).copy(), np.broadcast_to(v[:, None], (len(v), len(u))).copy()
    for table in tables:
        table.flags.writeable = False
    return tables


@lru_cache(maxsize=8)
def _hatch(size: tuple[int, int]) -> np.ndarray:
    """h w uint8 mask of the diagonal hatch lines over what a model never saw, read-only (kept per display size)."""
    h, w = size
    period = max(6, round(HATCH_PERIOD * max(h, w) / 512))
    # pixel (y, x) is on a line where (x + y) % period is small, so row y is row 0 shifted by y
    row = (np.arange(w + period) % period) < max(1, period // 5)
    hatch = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(row, w)[np.arange(h) % period].view(np.uint8))
    hatch.flags.writeable = False
    return hatch


def _resize(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The display-size picture, read-only (views copy what they draw on): at the display size already, the pixels
    themselves, unless they are an array the caller may still change."""
    h, w = size
    if (h, w) == rgb.shape[:2]:
        out = rgb.copy() if rgb.flags.writeable else rgb
    else:
        shrink = h * w < rgb.shape[0] * rgb.shape[1]
        out = cv2.resize(rgb, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)
    out.flags.writeable = False
    return out
