"""Effective receptive field (Luo et al., NeurIPS 2016): how far each block of any model looks, in pixels.

Per block l, take the grid token t nearest the centre of the input (the first of equally near ones;
prefix tokens never: they are not on the grid) and its output summed over channels,
y_l = sum_c X_l[t, c]. The map is how strongly each input pixel moves it,

    ERF_l(u, v) = mean over the batch of  sum over colour channels of |∂ y_l / ∂ x[:, u, v]|,

at the model's input resolution. Where a convolution's theoretical receptive field is a hard square
that only grows with depth, the effective one is the part of it that matters: Luo et al. show it is
Gaussian-like and far smaller. Attention has no theoretical bound at all (a ViT's first block can read
every patch), so the same gradient measures how far it looks in fact, and it is defined the same way
for ViT, CvT, Swin and the CNNs: that is what makes the comparison (Raghu et al. 2021's "how far does
each layer look") fair.

Radii. With d(u, v) the distance from the pixel's centre (u + 0.5, v + 0.5) to the centre of t's
receptive field (`distance.token_centres`' geometry), r_p is the smallest distance whose disc holds a
share p of the map's mass: pixels sorted by d, their mass accumulated, the distance where the running
sum first reaches p times the total. `r50` and `r90` are in input pixels; `share` divides them by the
input's shorter side. A map with no mass (a block the centre token does not depend on) has radius 0.

Cost: one traced forward that keeps the graph, then one backward per block from its centre token to the
pixels (autograd runs only the part of the graph below that block), so every block's map costs about
as much as hooks and `torch.autograd.grad` on a reference model. Nothing waits for a GPU per block: the
centre token is found from the geometry on the host (`centre_token`), every block's radii are computed
together on the maps' device, and they are read back once, at the end.
"""
from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ..models.trace import Trace
from .distance import stage_axis
from .lens import relative_depth


@dataclass
class ReceptiveField:
    """The effective receptive field of the centre grid token after each chosen block: its gradient map at the
    input resolution and the radii holding 50 % and 90 % of its mass, in input pixels."""
    blocks: list[int]   # indices into trace.blocks
    maps: Tensor        # blocks H W, the mean over the batch of sum_channels |dy / dx|
    r50: Tensor         # blocks, input pixels: the radius around the centre token holding 50 % of the map's mass
    r90: Tensor         # blocks, input pixels: 90 %
    centres: Tensor     # blocks 2 (host), the centre token's receptive-field centre (y, x) in input pixels
    input_size: tuple[int, int]

    @property
    def share(self) -> tuple[Tensor, Tensor]:
        """(r50, r90) as fractions of the input's shorter side."""
        side = min(self.input_size)
        return self.r50 / side, self.r90 / side


def centre_token(trace: Trace, index: int) -> tuple[int, tuple[float, float]]:
    """(position of the grid token nearest the input's centre in block `index`'s token sequence, its centre (y, x)
    in input pixels), from the geometry alone: no tensor is read, so nothing waits for a GPU.

    The centres of a grid's tokens are a * i + c on both axes (`distance.stage_axis`), so the distance to the
    input's centre is smallest where it is smallest on each axis apart; the first of equally near tokens is the
    first row and column of equally near ones (row-major order)."""
    block = trace.blocks[index]
    a, c = stage_axis(trace, block.stage)
    (rows, cols), (height, width) = block.query_grid, trace.input_size
    row = min(range(rows), key=lambda i: abs(a * i + c - height / 2))   # min: the first of equally near
    col = min(range(cols), key=lambda j: abs(a * j + c - width / 2))
    return block.prefix + row * cols + col, (a * row + c, a * col + c)


@functools.lru_cache(maxsize=16)
def pixels_by_distance(size: tuple[int, int], centre: tuple[float, float],
                       device: torch.device) -> tuple[Tensor, Tensor]:
    """(n distances, n pixel indices): a size[0] x size[1] input's pixels (row-major) sorted by the distance of
    their centres from `centre` (y, x), ties in reading order; float64, on `device`, made once per geometry."""
    with torch.inference_mode(False):   # kept and reused, also by passes that keep a graph
        ys, xs = torch.meshgrid(torch.arange(size[0], dtype=torch.float64, device=device) + 0.5,
                                torch.arange(size[1], dtype=torch.float64, device=device) + 0.5, indexing="ij")
        distance = ((ys - centre[0]) ** 2 + (xs - centre[1]) ** 2).sqrt().flatten()
        order = distance.argsort(stable=True)
        return distance[order], order


def radii(maps: Tensor, centres: Sequence[tuple[float, float]], shares: Sequence[float]) -> Tensor:
    """blocks H W maps, each block's centre (y, x) -> blocks x shares, float32 on the maps' device: for each share
    p the distance whose disc holds p of the map's mass (0 for a map without mass). The pixels' order by distance
    is sorted once per centre and kept (a stage's blocks share theirs); nothing is read back."""
    _, h, w = maps.shape
    sorted_pixels = [pixels_by_distance((h, w), tuple(centre), maps.device) for centre in centres]
    distance = torch.stack([d for d, _ in sorted_pixels])   # blocks n
    order = torch.stack([o for _, o in sorted_pixels])
    running = maps.double().flatten(1).gather(1, order).cumsum(dim=1)
    total = running[:, -1:]
    found = [distance.gather(1, (running < share * total).sum(dim=1, keepdim=True).clamp(max=h * w - 1))
             for share in shares]
    return torch.where(total > 0, torch.cat(found, dim=1), 0.0).float()


def receptive_field(model: nn.Module, pixels: Tensor, blocks: Sequence[int] | None = None) -> ReceptiveField:
    """Every block's effective receptive field (or those in `blocks`, indices into `trace.blocks`) for a batch of
    pixels (b 3 H W): maps at the input resolution with their 50 % and 90 % radii (see the module docstring).
    The maps stay on the pixels' device; the radii come back to the host once, at the end."""
    if model.training:
        raise ValueError("call model.eval() first: in training mode BatchNorm mixes the images of a batch")
    with torch.enable_grad():
        trace = model.trace(pixels, grad=True)
        indices = list(range(len(trace.blocks))) if blocks is None else [range(len(trace.blocks))[i] for i in blocks]
        centre_tokens = [centre_token(trace, i) for i in indices]
        maps = []
        for i, (token, _) in zip(indices, centre_tokens):
            y = trace.blocks[i].tokens[:, token].sum()   # images are independent: per-image gradients
            (grad,) = torch.autograd.grad(y, trace.pixels, retain_graph=i != indices[-1])
            maps.append(grad.abs().sum(dim=1).mean(dim=0).detach())
    maps, centres = torch.stack(maps), [centre for _, centre in centre_tokens]
    r50, r90 = radii(maps, centres, (0.5, 0.9)).cpu().unbind(dim=1)
    return ReceptiveField(blocks=indices, maps=maps, r50=r50, r90=r90, centres=torch.tensor(centres),
                          input_size=tuple(pixels.shape[-2:]))


class ReceptiveFieldSum:
    """Receptive fields over a data set: every batch's maps summed (weighted by its images), all-reduced across
    torchrun's ranks, averaged once, and the radii read off the averaged maps (Luo et al. average the gradient
    magnitudes over images, then measure)."""

    def __init__(self):
        self.maps: Tensor | None = None
        self.images = 0
        self.blocks: list[int] = []
        self.centres: Tensor | None = None
        self.input_size: tuple[int, int] | None = None

    def add(self, field: ReceptiveField, images: int) -> None:
        maps = field.maps.double() * images
        self.maps = maps if self.maps is None else self.maps + maps
        self.images += images
        self.blocks, self.centres, self.input_size = field.blocks, field.centres, field.input_size

    def all_reduce(self) -> None:
        """Sum every rank's maps and image counts through the process group (every rank ends with all)."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        if self.maps is None:
            raise ValueError("this rank has no batch: use fewer ranks than batches")
        images = torch.tensor([self.images], dtype=torch.float64, device=self.maps.device)
        dist.all_reduce(self.maps)
        dist.all_reduce(images)
        self.images = int(images.item())

    def result(self) -> ReceptiveField:
        maps = (self.maps / self.images).float().cpu()
        r50, r90 = radii(maps, [tuple(centre) for centre in self.centres.tolist()], (0.5, 0.9)).unbind(dim=1)
        return ReceptiveField(blocks=self.blocks, maps=maps, r50=r50, r90=r90, centres=self.centres,
                              input_size=self.input_size)


def receptive_npz(fields: Sequence, traces: Sequence[Trace]) -> bytes:
    """receptive-field.npz: per model (prefix a_, b_) its blocks' averaged maps (blocks H W), r50 and r90 (pixels of
    its input), their shares of the input's shorter side and the blocks' relative depths."""
    arrays = {}
    for prefix, field, trace in zip(("a", "b"), fields, traces):
        share50, share90 = field.share
        arrays.update({f"{prefix}_maps": field.maps.numpy(), f"{prefix}_r50": field.r50.numpy(),
                       f"{prefix}_r90": field.r90.numpy(), f"{prefix}_r50_share": share50.numpy(),
                       f"{prefix}_r90_share": share90.numpy(), f"{prefix}_blocks": np.asarray(field.blocks),
                       f"{prefix}_depth": np.asarray(relative_depth(trace, field.blocks)),
                       f"{prefix}_input_size": np.asarray(field.input_size)})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def reach_curves(fields: Sequence, traces: Sequence[Trace], names: Sequence[str]) -> dict:
    """`render.compare.reach_plot`'s curves: name -> (relative depths, r50 share, r90 share)."""
    return {name: (relative_depth(trace, field.blocks), *(s.tolist() for s in field.share))
            for name, field, trace in zip(names, fields, traces)}
