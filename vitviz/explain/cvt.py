"""Rollout for convolutional attention: the key-to-query operator D (vitviz's CvT adaptation).

Why plain rollout does not apply to CvT. In every CvT block the keys (and values) are a depthwise
3x3 stride-2 convolution of the query-grid tokens, so an attention matrix A is Nq x Nk with
Nk ~ Nq / 4; rollout needs square, chainable matrices. Stages change the token set as well, and
only the last stage has a class token.

The operator D. Key token j is computed from the query-grid tokens inside its window
W(j) = [s*j - p, s*j - p + k) (per axis; padding positions excluded). The convolution weights are
per channel, so no single scalar says how much of each token a key carries; D takes the
uninformed choice and spreads every key uniformly over its valid window:

    D[j, i] = 1 / |W(j)|  if query-grid token i is in W(j), else 0;   D[cls, cls] = 1.

Every row of D sums to 1, so A·D (Nq x Nq) is row-stochastic whenever A is: "query q attends to
key j" becomes "q attends to the tokens key j was made of". With a 1x1 stride-1 window D = I.

Rollout within a stage. For each block, Ã = ½I + ½·fuse(A)·D: the ½I is the residual path and
the rest is rollout's usual identity-plus-attention average. When head fusion (max, min) or
discarding leaves fuse(A)'s rows not summing to 1, Ã = (I + fuse(A)·D) / rowsum, the
re-normalisation of Abnar & Zuidema; for mean fusion the two are the same. The map is the
stage-3 class-token row of Ã_L ··· Ã_1 on the stage-3 grid, computed without ever forming an
Nq x Nq matrix: the row r is carried backwards block by block,

    r <- w + (w · fuse(A)) · D,   w = r / (1 + rowsum(fuse(A))),

and applying D to a key row vector v is v·D = conv_transpose(v / |W|) with an all-ones kernel.
(A stage-1 Nq x Nq matrix at 384 px would be 9216² floats, 340 MB.) The gradient variants use
the same D: gradient rollout puts the clipped head mean of grad ⊙ A in place of fuse(A); Chefer's
rule becomes R <- R + Ā·D·R, i.e. r <- r + (r · Ā) · D.

Back to the stage-1 grid (experimental). A stage's tokens come from a convolutional embedding of
the previous stage's grid, with its own window; spreading the row over that window in the same
uniform way (the embedding's D, class token dropped: it is a parameter, not image content) carries
the map onto the previous stage's grid, where rollout continues through that stage's blocks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from ..models.trace import BlockTrace, Window

IDENTITY = Window(1, 1, 0)


def _window_sizes(window: Window, in_grid: tuple[int, int], like: Tensor) -> Tensor:
    """1 1 h w: how many valid in-grid positions each output token's window covers (|W(j)|)."""
    ones = like.new_ones(1, 1, *in_grid)
    return F.conv2d(ones, like.new_ones(1, 1, window.kernel, window.kernel), stride=window.stride,
                    padding=window.padding)


def spread_to_input(values: Tensor, window: Window, *, grid: tuple[int, int], in_grid: tuple[int, int]) -> Tensor:
    """v·D: b (h w) values on an output `grid` -> b (h' w') on `in_grid`, each output token's value
    shared equally among the valid in-grid positions of its window (rows of D sum to 1)."""
    if window == IDENTITY and grid == in_grid:
        return values
    sizes = _window_sizes(window, in_grid, values)
    if tuple(sizes.shape[2:]) != tuple(grid):
        raise ValueError(f"window {window} maps a {in_grid} grid to {tuple(sizes.shape[2:])}, not {grid}")
    k, s, p = window.kernel, window.stride, window.padding
    full = [(n - 1) * s - 2 * p + k for n in grid]   # conv_transpose's size before output_padding
    v = rearrange(values, 'b (h w) -> b 1 h w', h=grid[0], w=grid[1]) / sizes
    out = F.conv_transpose2d(v, values.new_ones(1, 1, k, k), stride=s, padding=p,
                             output_padding=(in_grid[0] - full[0], in_grid[1] - full[1]))
    return rearrange(out, 'b 1 h w -> b (h w)')


def average_over_windows(values: Tensor, window: Window, *, in_grid: tuple[int, int]) -> Tensor:
    """D·u: b (h' w') values on `in_grid` -> b (h w), each output token the mean of its valid window."""
    if window == IDENTITY:
        return values
    u = rearrange(values, 'b (h w) -> b 1 h w', h=in_grid[0], w=in_grid[1])
    out = F.avg_pool2d(u, window.kernel, stride=window.stride, padding=window.padding, count_include_pad=False)
    return rearrange(out, 'b 1 h w -> b (h w)')


def keys_to_queries(row: Tensor, block: BlockTrace) -> Tensor:
    """v·D for one block: b (prefix + key tokens) -> b (prefix + query tokens); prefix keys map to themselves."""
    p = block.prefix
    grid = spread_to_input(row[:, p:], block.key_window, grid=block.key_grid, in_grid=block.query_grid)
    return torch.cat([row[:, :p], grid], dim=1)


def queries_to_keys(column: Tensor, block: BlockTrace) -> Tensor:
    """D·u for one block: b (prefix + query tokens) -> b (prefix + key tokens)."""
    p = block.prefix
    grid = average_over_windows(column[:, p:], block.key_window, in_grid=block.query_grid)
    return torch.cat([column[:, :p], grid], dim=1)

