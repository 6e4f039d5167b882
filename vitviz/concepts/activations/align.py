"""Aligning two or more models' token grids on the photo, so that one cell is one place for every model.

A dictionary across models (`kinds/across.py`) learns from rows that hold each model's token at the same place
of the same image. The models' grids differ (a ViT's 8 x 8 patches, a CvT's 4 x 4 last stage, a ResNet's
8 x 8), and so can the part of the photo each one saw (each checkpoint resizes and crops its own way).
So every model's tokens are resampled onto one grid of cells:

1. Each grid token's rectangle, from the trace's geometry: the tokens of a stage whose windows move by
   a input pixels per token (`explain.distance.stage_axis`, the chain of windows that made the grid)
   tile the input in a x a squares, token (i, j) covering rows [a i, a (i + 1)) and columns
   [a j, a (j + 1)), clipped to the input: the tiles the app draws a map on. (A padded, strided
   convolution centres its window up to a few pixels before its tile; a tile is where the token is
   shown, and where every model's token i starts.)
2. Those rectangles in the photo's own coordinates, as fractions of its height and width: input pixel u
   of a model is pixel u + left of the resized photo (its centre crop's offset), which is the fraction
   (u + left) / resized width of the photo (likewise top and height).
3. The region every model saw: the intersection of their inputs' rectangles. The cells cut it into the
   coarser of the grids, its rows and columns the fewest any model has across the region (a model's
   count: the region's extent over its tokens' median size, rounded).
4. A cell's value for a model is the area-weighted mean of that model's tokens over the cell:

       cell_c = Σ_t area(c ∩ t) · token_t / Σ_t area(c ∩ t)

   a linear map, one cells x tokens matrix per model (`Alignment.weights`, rows summing to 1). A cell
   that is exactly one token copies it; a cell of 2 x 2 tokens averages them.

Bilinear resizing of the grids (what Thasarathan et al. did for 16 x 16 against 14 x 14) mixes in tokens
outside the cell and ignores the crops; the rectangles keep each cell one place in the photo.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...explain.distance import stage_axis
from ...models.trace import Trace
from ...preprocess import Transform
from ..kinds.dictionary import ConceptsError

Box = tuple[float, float, float, float]   # (y0, x0, y1, x1)


def token_rectangles(trace: Trace, block: int) -> Tensor:
    """(h w) 4 float64: each grid token of block `block`'s output as (y0, x0, y1, x1) in input pixels."""
    out = trace.blocks[block]
    a, _ = stage_axis(trace, out.stage)
    (h, w), (height, width) = out.query_grid, trace.input_size
    ys = (a * torch.arange(h, dtype=torch.float64))[:, None].expand(h, w)
    xs = (a * torch.arange(w, dtype=torch.float64))[None, :].expand(h, w)
    return torch.stack([ys.clamp(0, height), xs.clamp(0, width),
                        (ys + a).clamp(0, height), (xs + a).clamp(0, width)], dim=-1).reshape(-1, 4)


def in_photo(rectangles: Tensor, transform: Transform, image_size: tuple[int, int]) -> Tensor:
    """n 4 rectangles in a model's input pixels -> fractions of the photo (h, w = `image_size`) it was made from."""
    top, left, _, _ = transform.crop_box(image_size)
    rh, rw = transform.resized_size(image_size)
    shift = rectangles.new_tensor([top, left, top, left])
    return (rectangles + shift) / rectangles.new_tensor([rh, rw, rh, rw])


def grid_region(trace: Trace, block: int, transform: Transform, image_size: tuple[int, int]) -> Box:
    """Where block `block`'s grid lies on a photo of `image_size` (h, w) through the model's `transform`: its tokens'
    tiles in fractions of the photo, clipped to it, as (y0, x0, y1, x1). The cells of a dictionary across models cut
    the same region where every model saw the whole photo (the bundled ones)."""
    tiles = in_photo(token_rectangles(trace, block), transform, image_size)
    low, high = tiles[:, :2].min(0).values.clamp(0, 1), tiles[:, 2:].max(0).values.clamp(0, 1)
    return tuple(float(v) for v in (*low, *high))


@dataclass(frozen=True)
class Alignment:
    """The cells two or more models' tokens are resampled onto: their grid over the region every model saw (in
    fractions of the photo), and per model the cells x tokens matrix of area weights."""
    grid: tuple[int, int]
    region: Box
    weights: tuple[Tensor, ...]   # per model: cells x tokens, float32, each row summing to 1

    def resample(self, model: int, tokens: Tensor) -> Tensor:
        """Model `model`'s grid tokens (... n d) -> its cells (... cells d)."""
        weights = self.weights[model].to(device=tokens.device, dtype=tokens.dtype)
        return torch.einsum('ct,...td->...cd', weights, tokens)


def align(rectangles: Sequence[Tensor]) -> Alignment:
    """The alignment of models whose grid tokens cover `rectangles` (per model: n 4, fractions of the photo)."""
    if len(rectangles) < 1 or any(len(r) == 0 for r in rectangles):
        raise ConceptsError("Aligning grids needs every model's grid tokens; a class token alone has no place on "
                            "the photo.")
    lo = torch.stack([r[:, :2].min(0).values for r in rectangles]).max(0).values
    hi = torch.stack([r[:, 2:].max(0).values for r in rectangles]).min(0).values
    if not (hi > lo).all():
        raise ConceptsError("The models saw parts of the photo that do not overlap (their crops are disjoint), so "
                            "their tokens have no common place to be compared at.")
    extent = hi - lo
    counts = [(extent / (r[:, 2:] - r[:, :2]).median(0).values).round().clamp(min=1) for r in rectangles]
    gh, gw = (int(v) for v in torch.stack(counts).min(0).values)
    ys = lo[0] + extent[0] * torch.arange(gh + 1, dtype=torch.float64) / gh
    xs = lo[1] + extent[1] * torch.arange(gw + 1, dtype=torch.float64) / gw
    cells = torch.stack([ys[:-1, None].expand(gh, gw), xs[None, :-1].expand(gh, gw),
                         ys[1:, None].expand(gh, gw), xs[None, 1:].expand(gh, gw)], dim=-1).reshape(-1, 4)
    weights = tuple(_area_weights(cells, r.double()) for r in rectangles)
    return Alignment(grid=(gh, gw), region=tuple(float(v) for v in (*lo, *hi)), weights=weights)


def _area_weights(cells: Tensor, tokens: Tensor) -> Tensor:
    """cells x tokens: area(c ∩ t) / Σ_t area(c ∩ t)."""
    top = torch.maximum(cells[:, None, 0], tokens[None, :, 0])
    left = torch.maximum(cells[:, None, 1], tokens[None, :, 1])
    bottom = torch.minimum(cells[:, None, 2], tokens[None, :, 2])
    right = torch.minimum(cells[:, None, 3], tokens[None, :, 3])
    area = (bottom - top).clamp(min=0) * (right - left).clamp(min=0)
    covered = area.sum(1, keepdim=True)
    if not (covered > 0).all():
        raise ConceptsError("A cell of the common region is covered by none of a model's tokens.")
    return (area / covered).float()
