"""Mean attention distance (ViT paper, fig. 7): how far, in input pixels, each head looks.

Per block and head: for every grid query, the attention-weighted mean of the pixel distance
between its centre and each grid key's centre (prefix tokens excluded, rows re-normalised over
the grid keys), averaged over the queries. Token centres come from the chain of windows that
made the tokens: a window over a grid with centres a*t + c has centres (a*s)*i + a*((k-1)/2 - p) + c
(padding positions counted, as in the receptive field); a pixel t has centre t + 0.5. CvT's keys
add their k/v window over the query grid. In a windowed block (Swin) a query reads only the keys of
its window, so the distance is bounded by the window's diagonal; a shifted window's tokens are at
their own places on the grid (the pairs the roll brought together from opposite edges have weight 0),
and the padding positions of a grid that is not a multiple of the window are left out like prefix
tokens. A convolutional network has no attention, and no attention distance.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.trace import BlockTrace, Trace, Window
from .rollout import needs_attention
from .windows import to_windows, windowed

Axis = tuple[float, float]   # centre of token i along an axis: a * i + c, in input pixels


def _through(axis: Axis, window: Window) -> Axis:
    a, c = axis
    return a * window.stride, a * ((window.kernel - 1) / 2 - window.padding) + c


def stage_axis(trace: Trace, stage: int) -> Axis:
    """(a, c): the centre of token i of `stage`'s grid, along either axis, is a * i + c input pixels."""
    axis = (1.0, 0.5)
    for embedding in trace.embeddings[:stage + 1]:
        axis = _through(axis, embedding.window)
    return axis


def _centres(axis: Axis, grid: tuple[int, int], like: Tensor) -> Tensor:
    """(h w) 2: the (y, x) pixel centres of a grid's tokens (the same affine map on both axes)."""
    a, c = axis
    ys, xs = (a * torch.arange(n, dtype=like.dtype, device=like.device) + c for n in grid)
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)


def token_centres(trace: Trace, layer: int) -> tuple[Tensor, Tensor]:
    """((qh qw) 2 query centres, (kh kw) 2 key centres): block `layer`'s grid tokens in input pixels (y, x)."""
    block = trace.blocks[layer]
    axis = stage_axis(trace, block.stage)
    return (_centres(axis, block.query_grid, block.tokens),
            _centres(_through(axis, block.key_window), block.key_grid, block.tokens))


def mean_attention_distance(trace: Trace) -> list[Tensor]:
    """Per block, b h: each head's mean attention distance in input pixels (stack them for a ViT: b L h)."""
    needs_attention(trace, "mean attention distance")
    return [_block_distance(trace, i, block) for i, block in enumerate(trace.blocks)]


def _block_distance(trace: Trace, layer: int, block: BlockTrace) -> Tensor:
    def in_windows(centres: Tensor) -> tuple[Tensor, Tensor]:   # (nw t 2 centres, nw t 1 for a grid token)
        tokens = torch.cat([centres.new_zeros(block.prefix, 3), F.pad(centres, (0, 1), value=1.0)])
        placed = to_windows(tokens[None], block)[0]
        return placed[..., :2], placed[..., 2]

    (queries, is_query), (keys, is_key) = (in_windows(c) for c in token_centres(trace, layer))
    attn = windowed(block.attn.detach(), block) * is_key[:, None, None, :]   # b nw h tq tk, grid keys only
    attn = attn / attn.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(attn.dtype).tiny)
    per_query = torch.einsum('bwhqk,wqk->bwhq', attn, torch.cdist(queries, keys)) * is_query[:, None, :]
    return per_query.sum(dim=(1, 3)) / is_query.sum()
