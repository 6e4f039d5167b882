"""Raw attention maps of one block: where a token looks (its row), who looks at a patch (a column).

A row lives on the block's key grid, as the model computed it; `on_query_grid=True` spreads it
through CvT's key operator D (`cvt.py`) onto the query grid, where it lines up with the rollout
maps (for ViT and Swin the two grids are one and D = I). A column is asked about a query-grid patch:
for CvT that patch is part of several keys' windows, so the column is the patch's column of A·D. In a
windowed block (Swin) a token's row covers the keys of its own window and is 0 elsewhere, and its
column the queries of that window (`windows.py`).
"""
from __future__ import annotations

from einops import rearrange
from torch import Tensor

from ..models.trace import BlockTrace, Trace
from .cvt import keys_to_queries, queries_to_keys
from .rollout import needs_attention
from .windows import apply_to_column, query_rows

# (row, col) on the block's query grid; a prefix kind: 'cls', 'dist', 'reg' (the first of its kind); or a
# position in the block's token sequence (prefix tokens first: register k of a [cls, reg x4] model is 1 + k)
Token = tuple[int, int] | str | int


def _block(trace: Trace, layer: int) -> BlockTrace:
    if not -len(trace.blocks) <= layer < len(trace.blocks):
        raise ValueError(f"layer must index one of the model's {len(trace.blocks)} blocks, not {layer}")
    needs_attention(trace, "an attention map")
    return trace.blocks[layer]


def _token_index(block: BlockTrace, token: Token) -> int:
    """Position of `token` among the block's query tokens (prefix first)."""
    if isinstance(token, int):
        if not 0 <= token < block.tokens.shape[1]:
            raise ValueError(f"token {token} is not one of the block's {block.tokens.shape[1]} query tokens")
        return token
    if isinstance(token, str):
        if token not in block.prefix_kinds:
            raise ValueError(f"this block has no {token!r} token (its prefix tokens: {block.prefix_kinds or 'none'})")
        return block.prefix_kinds.index(token)
    (row, col), (h, w) = token, block.query_grid
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"patch {token} is outside the block's {h}x{w} token grid")
    return block.prefix + row * w + col


def _heads(block: BlockTrace, head: int | None) -> Tensor:
    """b (nw) h nq nk -> b (nw) nq nk: one head, or the head mean."""
    attn = block.attn.detach()
    if head is None:
        return attn.mean(dim=-3)
    if not -attn.shape[-3] <= head < attn.shape[-3]:
        raise ValueError(f"head must be one of the block's {attn.shape[-3]} heads, not {head}")
    return attn.select(-3, head)


def _grid(values: Tensor, block: BlockTrace, grid: tuple[int, int]) -> Tensor:
    """... (prefix + tokens) -> ... h w, prefix dropped."""
    return rearrange(values[..., block.prefix:], '... (h w) -> ... h w', h=grid[0], w=grid[1])


def query_attention(trace: Trace, *, layer: int, query: Token = "cls", head: int | None = None,
                    on_query_grid: bool = False) -> Tensor:
    """Where `query` looks in block `layer` (head, or head mean): b kh kw over the key grid (prefix keys dropped)."""
    block = _block(trace, layer)
    rows = query_rows(block.attn.detach(), _token_index(block, query), block)   # b h nk
    if head is not None and not -rows.shape[1] <= head < rows.shape[1]:
        raise ValueError(f"head must be one of the block's {rows.shape[1]} heads, not {head}")
    row = rows.mean(dim=1) if head is None else rows[:, head]
    if on_query_grid:
        return _grid(keys_to_queries(row, block), block, block.query_grid)
    return _grid(row, block, block.key_grid)


def class_attention(trace: Trace, *, layer: int = -1, on_query_grid: bool = False) -> Tensor:
    """Every head's class-token row in block `layer`: b h kh kw over the key grid (CvT: stage 3 only)."""
    return head_attention(trace, layer=layer, query="cls", on_query_grid=on_query_grid)


def head_attention(trace: Trace, *, layer: int = -1, query: Token = "cls", on_query_grid: bool = False) -> Tensor:
    """Where `query` looks in block `layer`, every head apart: b h kh kw over the key grid (prefix keys dropped)."""
    block = _block(trace, layer)
    rows = query_rows(block.attn.detach(), _token_index(block, query), block)   # b h nk
    if on_query_grid:
        heads = rows.shape[1]
        rows = rearrange(keys_to_queries(rearrange(rows, 'b h n -> (b h) n'), block), '(b h) n -> b h n', h=heads)
        return _grid(rows, block, block.query_grid)
    return _grid(rows, block, block.key_grid)


def key_attention(trace: Trace, *, layer: int, patch: Token, head: int | None = None) -> Tensor:
    """Who looks at `patch` in block `layer`: b qh qw, the patch's column of A·D over the grid queries."""
    block = _block(trace, layer)
    onehot = block.tokens.new_zeros(1, block.tokens.shape[1])
    onehot[0, _token_index(block, patch)] = 1.0
    key_weights = queries_to_keys(onehot, block)   # D's column for the patch: 1 nk
    attn = _heads(block, head)
    return _grid(apply_to_column(attn, key_weights.expand(attn.shape[0], -1), block), block, block.query_grid)
