"""Attention as an operator over windows: how rollout and the other attention methods read Swin (vitviz's
adaptation), and the one layout every method reads.

Why Swin needs one. A Swin block attends within w x w windows of its token grid, every second block
after rolling the grid by -w//2 on both axes, and patch merging halves the grid between stages. There
is no class token: the classifier averages the last stage's tokens. Written as a dense matrix, block
l's attention A_l (N x N) has row q equal to q's attention over the keys of its window and zeros
elsewhere; at 224 px stage 1 has N = 3,136 tokens, and A_l would take 118 MB per block per image for
its 3 heads. The trace keeps what the block computed instead: b nw h t t, one t x t matrix per window
(t = w^2), with the window partition that made it (`models.trace.WindowPartition`): which grid token sits
at each window position, where the roll put it, and which pairs the mask of a shifted block keeps apart
(their weights are exactly 0).

The layout. Every block's attention is read as windows: b nw h tq tk, the queries of window n over its
keys. A global attention (ViT, CvT) is one window that holds every query and every key; a windowed one
(Swin) holds each token in exactly one window, queries and keys alike, and padding positions (a grid
that is not a multiple of the window) in none. `to_windows` cuts a per-token quantity into that layout
and `from_windows` puts a per-window one back on the tokens (padding dropped), so that a product with
A never forms the dense matrix:

    (r · A)[k] = sum over the window n holding k of  sum_q r[n, q] A[n, q, k]      (a row times A)
    (A · u)[q] = sum_k A[n, q, k] u[n, k]                                           (A times a column)

Rollout through windows, shifts and merging. Per block Ã = (I + fuse(A)) / rowsum, fuse over heads;
the row r (the readout: the mean over the final tokens, what the classifier averages) is carried
backwards block by block, r <- w + w · fuse(A) with w = r / (1 + rowsum), each product per window as
above, so it costs one window-sized product per block. Shifted blocks need nothing of their own: the
partition already says where each token went, and the masked pairs are zeros of A. Across a patch
merging the row is shared equally among each merged token's 2x2 tokens (the merging's window, 2x2 at
stride 2, through `cvt.spread_to_input`, as CvT's convolutional embeddings). Gradient rollout and Chefer's
relevance use the same products on their gradient-weighted matrices (Chefer: r <- r + r · Ā). With one
global window every formula here is the dense one, so ViT and CvT read the same code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from ..models.trace import BlockTrace


def windowed(attn: Tensor, block: BlockTrace) -> Tensor:
    """A block's attention, or any tensor of its shape (a gradient), as b nw h tq tk (global: one window)."""
    return attn if block.windows is not None else attn.unsqueeze(1)


def to_windows(values: Tensor, block: BlockTrace) -> Tensor:
    """b n ... per token -> b nw t ... per window position (global: one window of every token; padding: 0)."""
    if block.windows is None:
        return values.unsqueeze(1)
    index = block.windows.index_on(values.device)
    padded = F.pad(values, (0, 0) * (values.dim() - 2) + (0, 1))   # one zero slot, where padding points
    return padded.index_select(1, index.flatten()).unflatten(1, index.shape)


def from_windows(values: Tensor, block: BlockTrace) -> Tensor:
    """b nw t ... per window position -> b n ... per token (padding positions dropped): `to_windows` undone."""
    if block.windows is None:
        return values.squeeze(1)
    index = block.windows.index_on(values.device)
    flat = values.flatten(1, 2)
    n = block.windows.grid[0] * block.windows.grid[1]
    out = flat.new_zeros(flat.shape[0], n + 1, *flat.shape[2:]).index_add_(1, index.flatten(), flat)
    return out[:, :n]


def attend(row: Tensor, matrix: Tensor, block: BlockTrace) -> Tensor:
    """r · M: b nq over the block's queries, M a fused b (nw) nq nk matrix -> b nk over its keys."""
    return from_windows(torch.einsum('bwq,bwqk->bwk', to_windows(row, block), windowed(matrix, block)), block)


def row_sums(matrix: Tensor, block: BlockTrace) -> Tensor:
    """b (nw) nq nk -> b nq: each query's row sum."""
    return from_windows(windowed(matrix, block).sum(dim=-1), block)


def apply_to_column(matrix: Tensor, column: Tensor, block: BlockTrace) -> Tensor:
    """M · u: M b (nw) nq nk, u b nk over the keys -> b nq over the queries."""
    return from_windows(torch.einsum('bwqk,bwk->bwq', windowed(matrix, block), to_windows(column, block)), block)


def query_rows(attn: Tensor, query: int, block: BlockTrace) -> Tensor:
    """Row `query` of every head's attention, b h nk over all the block's keys (keys it did not see: 0)."""
    if block.windows is None:
        return attn[:, :, query]
    index = block.windows.index
    window, position = divmod(int((index.flatten() == query).nonzero()[0]), index.shape[1])
    keys = attn.new_zeros(attn.shape[0], *index.shape, attn.shape[2])   # b nw t h: zero outside its window
    keys[:, window] = rearrange(attn[:, window, :, position], 'b h k -> b k h')
    return rearrange(from_windows(keys, block), 'b n h -> b h n')


def key_means(values: Tensor, block: BlockTrace) -> Tensor:
    """b nw tq tk per (query, key) pair -> b nk: the mean over every query of the block, 0 where a query did not
    see the key (the dense matrix's column mean)."""
    return from_windows(windowed(values, block).sum(dim=-2), block) / block.tokens.shape[1]


def head_outputs(block: BlockTrace) -> Tensor:
    """b h nq d: each head's output z (attention times values) at the block's queries, from a trace made with
    decompose=True."""
    z = windowed(block.attn, block) @ windowed(block.parts.values, block)   # b nw h tq d
    return rearrange(from_windows(rearrange(z, 'b w h q d -> b w q h d'), block), 'b n h d -> b h n d')
