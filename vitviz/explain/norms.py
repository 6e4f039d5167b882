"""Token norms: the L2 norm of every block's output tokens.

Large ViTs repurpose a few low-information patches as global scratch space; those tokens stand
out with norms many times the rest ("Vision Transformers Need Registers", Darcet et al. 2023),
and register tokens take the role over.
"""
from __future__ import annotations

from einops import rearrange
from torch import Tensor

from ..models.trace import Trace


def token_norms(trace: Trace) -> tuple[list[Tensor], list[Tensor]]:
    """Per block: (b h w norms of the grid tokens, b p norms of the prefix tokens, in `prefix_kinds` order)."""
    grids, prefixes = [], []
    for block in trace.blocks:
        norms = block.tokens.detach().norm(dim=-1)   # b n
        h, w = block.query_grid
        grids.append(rearrange(norms[:, block.prefix:], 'b (h w) -> b h w', h=h, w=w))
        prefixes.append(norms[:, :block.prefix])
    return grids, prefixes
