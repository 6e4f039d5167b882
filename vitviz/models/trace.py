"""What a traced forward pass returns: plain data, read by `explain/` and `render/`.

Geometry is kept with the tensors so that any token index maps back to a pixel rectangle of the
model's input without knowing which architecture produced it.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Window:
    """A square sliding window: one output token reads input[stride*i - padding : ... + kernel]."""

    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class Embedding:
    """One token embedding (ViT's patchify, or a CvT stage's convolutional embedding)."""

    window: Window          # in units of the previous grid (pixels for the first one)
    in_grid: tuple[int, int]
    grid: tuple[int, int]   # the token grid it produces (h, w), read off the conv output


@dataclass
class BlockTrace:
    attn: Tensor                   # b h nq nk, post-softmax
    tokens: Tensor                 # b n c, the block's output (prefix tokens first)
    stage: int                     # index into Trace.embeddings
    query_grid: tuple[int, int]
    key_grid: tuple[int, int]
    key_window: Window             # query grid -> key grid (CvT's k/v conv; identity for ViT)
    prefix_kinds: tuple[str, ...]  # 'cls', 'dist', 'reg' tokens in front of the grid tokens

    @property
    def prefix(self) -> int:
        return len(self.prefix_kinds)


@dataclass
class Trace:
    logits: Tensor                 # b classes
    blocks: list[BlockTrace]       # forward order
    embeddings: list[Embedding]    # one per stage
    features: list[Tensor]         # per stage, b c h w grid tokens after the stage's last block
    input_size: tuple[int, int]    # (h, w) of the pixels the model saw

    @property
    def attentions(self) -> list[Tensor]:
        return [block.attn for block in self.blocks]
