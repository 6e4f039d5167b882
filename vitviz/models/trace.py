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
class AttentionParts:
    """How a block's heads write into the residual stream (TransformerLens' names in brackets), for
    decompositions: kept by traces made with decompose=True."""

    values: Tensor   # b h nk d (v): head h's output at query q is z = attn[:, h, q] @ values[:, h]
    weight: Tensor   # c (h d) (W_O, LayerScale folded in): the heads' outputs z write z @ weight.T ...
    bias: Tensor     # c (b_O, LayerScale folded in): ... + bias, the attention's whole output


@dataclass
class BlockTrace:
    attn: Tensor | None            # b h nq nk, post-softmax (None from trace(..., attention=False))
    tokens: Tensor                 # b n c, the block's output (prefix tokens first)
    stage: int                     # index into Trace.embeddings
    query_grid: tuple[int, int]
    key_grid: tuple[int, int]
    key_window: Window             # query grid -> key grid (CvT's k/v conv; identity for ViT)
    prefix_kinds: tuple[str, ...]  # 'cls', 'dist', 'reg' tokens in front of the grid tokens
    normed: Tensor | None = None   # b n c, the first LayerNorm's output (what the attention reads; Grad-CAM's
                                   # layer), kept by traces made with grad=True only
    inputs: Tensor | None = None   # b n c, the tokens the block read (resid_pre; `tokens` is resid_post): the
                                   # previous block's output, or for a stage's first block its embedding
    parts: AttentionParts | None = None   # kept by traces made with decompose=True only

    @property
    def prefix(self) -> int:
        return len(self.prefix_kinds)


@dataclass
class Trace:
    logits: Tensor                 # b classes; b 0 for a model without a classifier (headless: see `pooled`)
    blocks: list[BlockTrace]       # forward order
    embeddings: list[Embedding]    # one per stage
    features: list[Tensor]         # per stage, b c h w grid tokens after the stage's last block
    input_size: tuple[int, int]    # (h, w) of the pixels the model saw
    pooled: Tensor | None = None        # b c, what the classifier reads (timm's pre-logits): a headless model's
                                        # output (ViT; None for CvT)
    final_tokens: Tensor | None = None  # b n c, the last block's tokens through the final norm, as timm's
                                        # forward_features returns them (ViT; None for CvT)

    @property
    def has_classifier(self) -> bool:
        return self.logits.shape[-1] > 0

    @property
    def attentions(self) -> list[Tensor]:
        return [block.attn for block in self.blocks]
