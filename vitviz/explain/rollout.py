"""Attention rollout (Abnar & Zuidema 2020), for ViT, through the key operator D for CvT, and through windows for Swin.

Per block: fuse the heads (mean, max or min), optionally zero each query row's lowest attentions
(never the class-token column; in a windowed block, the lowest among the keys of the query's window),
add the identity for the residual path and re-normalise the rows: Ã = (I + fuse(A)·D) / rowsum,
with D = I for ViT and Swin (see `cvt.py` for CvT's D, `windows.py` for how a windowed A is applied).
The map is the readout row of Ã_L ··· Ã_start, carried backwards block by block as a row vector, so no
Nq x Nq product is formed; it equals the paper's matrix formula. The readout is the class-token row; a
model without a class token (register ViTs with average pooling, Swin) reads the mean of the grid rows,
which is what its classifier reads. A convolutional network has no attention, and no rollout.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor

from ..models.trace import BlockTrace, Trace
from .cvt import keys_to_queries, spread_to_input
from .windows import attend, row_sums

HEAD_FUSIONS = ("mean", "max", "min")

# (row over the block's query tokens, the block's b nq nk matrix, the block) -> row over the tokens it read
Propagate = Callable[[Tensor, Tensor, BlockTrace], Tensor]


def fuse_heads(attn: Tensor, head_fusion: str) -> Tensor:
    """b h nq nk -> b nq nk (windowed: b nw h t t -> b nw t t)."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, not {head_fusion!r}")
    if head_fusion == "mean":
        return attn.mean(dim=-3)
    return attn.amax(dim=-3) if head_fusion == "max" else attn.amin(dim=-3)


def discard_lowest(fused: Tensor, ratio: float, *, keep_column: int | None) -> Tensor:
    """Zero the lowest `ratio` of every query row's entries (b (nw) nq nk), never `keep_column` (the class key).

    Per row and per image: int(ratio * candidates) entries go, candidates being the row's columns
    other than `keep_column`.
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), not {ratio}")
    candidates = fused.shape[-1] - (keep_column is not None)
    count = int(ratio * candidates)
    if count == 0:
        return fused
    ranked = fused
    if keep_column is not None:   # ranked last, so never among the lowest (set in place: no index sent to a device)
        ranked = fused.clone()
        ranked[..., keep_column] = torch.inf
    lowest = ranked.topk(count, dim=-1, largest=False).indices
    return fused.scatter(-1, lowest, 0.0)


def class_column(block: BlockTrace) -> int | None:
    """The class token's index among the block's tokens (its prefix comes first), or None for a model
    without one."""
    return block.prefix_kinds.index("cls") if "cls" in block.prefix_kinds else None


def readout_row(block: BlockTrace) -> Tensor:
    """b nq: the class token's one-hot row, or the mean over grid tokens when there is no class token."""
    row = block.tokens.new_zeros(block.tokens.shape[:2])
    cls = class_column(block)
    if cls is None:
        row[:, block.prefix:] = 1.0 / (row.shape[1] - block.prefix)
    else:
        row[:, cls] = 1.0
    return row


def rollout_step(row: Tensor, fused: Tensor, block: BlockTrace) -> Tensor:
    """r·Ã with Ã = (I + fused·D) / rowsum, without forming Ã (rows of D sum to 1)."""
    w = row / (1.0 + row_sums(fused, block))
    return w + keys_to_queries(attend(w, fused, block), block)


class NoAttention(ValueError):
    """What asked for attention was given a model that has none (a convolutional network)."""


def needs_attention(trace: Trace, what: str) -> None:
    """`NoAttention`, in words, when the model's blocks do not attend (a convolutional network)."""
    if not trace.blocks[-1].attends:
        raise NoAttention(f"this model is a convolutional network: its blocks have no attention, so {what} has "
                         f"nothing to read (Grad-CAM and the relevance methods explain it)")


def propagate(trace: Trace, matrices: Callable[[int], Tensor], step: Propagate, *, start_layer: int,
              to_stage: int) -> Tensor:
    """Carry the readout row backwards through the blocks -> b gh gw on the grid of stage `to_stage`.

    matrices(i): block i's b (nw) nq nk matrix (fused attention, or its gradient-weighted variant). Blocks
    before `start_layer` are skipped (identity); between stages the row crosses the later stage's
    embedding (CvT's convolution, Swin's patch merging: the row shared over each token's window; prefix
    tokens dropped: they carry no image content).
    """
    blocks, embeddings = trace.blocks, trace.embeddings
    to_stage = _checked_stage(trace, start_layer=start_layer, to_stage=to_stage)
    prefix = {block.stage: block.prefix for block in blocks}
    row = readout_row(blocks[-1])
    for stage in range(blocks[-1].stage, to_stage - 1, -1):
        for i in reversed(range(len(blocks))):
            if blocks[i].stage == stage and i >= start_layer:
                row = step(row, matrices(i), blocks[i])
        if stage > to_stage:
            embedding = embeddings[stage]
            grid = spread_to_input(row[:, prefix.get(stage, 0):], embedding.window, grid=embedding.grid,
                                   in_grid=embedding.in_grid)
            row = torch.cat([grid.new_zeros(grid.shape[0], prefix.get(stage - 1, 0)), grid], dim=1)
    h, w = embeddings[to_stage].grid
    return rearrange(row[:, prefix.get(to_stage, 0):], 'b (h w) -> b h w', h=h, w=w)


def attention_rollout(trace: Trace, *, head_fusion: str = "mean", discard_ratio: float = 0.0, start_layer: int = 0,
                      to_stage: int = -1) -> Tensor:
    """Attention rollout: b gh gw on the model's last token grid (`to_stage=0`: the stage-1 grid of CvT,
    experimental, and of Swin, through its patch mergings).

    start_layer indexes `trace.blocks`; for CvT and Swin only the last stage's blocks enter the default map.
    """
    needs_attention(trace, "attention rollout")

    def fused(i: int) -> Tensor:
        block = trace.blocks[i]
        attn = fuse_heads(block.attn.detach(), head_fusion)
        return discard_lowest(attn, discard_ratio, keep_column=class_column(block)) if discard_ratio else attn

    return propagate(trace, fused, rollout_step, start_layer=start_layer, to_stage=to_stage)


def blocks_in_range(trace: Trace, *, start_layer: int, to_stage: int) -> list[int]:
    """Indices of the blocks `propagate` reads (to compute only the gradients a map needs)."""
    to_stage = _checked_stage(trace, start_layer=start_layer, to_stage=to_stage)
    return [i for i, b in enumerate(trace.blocks) if i >= start_layer and b.stage >= to_stage]


def _checked_stage(trace: Trace, *, start_layer: int, to_stage: int) -> int:
    if not 0 <= start_layer < len(trace.blocks):
        raise ValueError(f"start_layer must be in [0, {len(trace.blocks)}), not {start_layer}")
    if not -len(trace.embeddings) <= to_stage < len(trace.embeddings):
        raise ValueError(f"to_stage must index one of the model's {len(trace.embeddings)} stages, not {to_stage}")
    return to_stage % len(trace.embeddings)
