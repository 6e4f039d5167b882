"""What a traced forward pass returns: plain data, read by `explain/` and `render/`.

Geometry is kept with the tensors so that any token index maps back to a pixel rectangle of the
model's input without knowing which architecture produced it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from einops import rearrange
from torch import Tensor

KeptAttention = bool | slice   # `trace(attention=...)`: every block's attention maps, none, or a slice of the blocks'
# `trace(edit=...)`: (block index, the b n c tokens it put out) -> the tokens the rest of the forward reads instead
# (a dictionary spliced in, a concept's interpolation): what the trace keeps as that block's tokens too
Edit = Callable[[int, Tensor], Tensor]


def edited(edit: Edit | None, index: int, tokens: Tensor) -> Tensor:
    """Block `index`'s b n c output tokens, through `edit` where one is given."""
    return tokens if edit is None else edit(index, tokens)


def edited_map(edit: Edit | None, index: int, fmap: Tensor, *, layout: str = 'b c h w') -> Tensor:
    """The same for a block's feature map in `layout` ('b c h w', or channels last: 'b h w c')."""
    if edit is None:
        return fmap
    h, w = (fmap.shape[2], fmap.shape[3]) if layout == 'b c h w' else (fmap.shape[1], fmap.shape[2])
    return rearrange(edit(index, rearrange(fmap, f'{layout} -> b (h w) c')), f'b (h w) c -> {layout}', h=h, w=w)


def kept_units(hidden: Tensor, units: list[Tensor] | None) -> Tensor:
    """An MLP's hidden units (its first layer through the activation), appended to `units` where a list is given:
    how a block hands them to `trace(units=True)` without a hook, its plain forward paying one test."""
    if units is not None:
        units.append(hidden)
    return hidden


def graph_pixels(pixels: Tensor) -> Tensor:
    """The pixels a grad trace starts its graph from: a leaf of their values, unless they already carry a graph
    (a feature picture's parametrisation: the gradient must reach what made them)."""
    return pixels if pixels.requires_grad else pixels.detach().requires_grad_(True)


def kept_blocks(attention: KeptAttention, depth: int) -> range:
    """The blocks whose attention maps a trace keeps, of `depth`: all (True), none (False), or those a slice of the
    blocks picks (a negative start counts from the last block)."""
    if isinstance(attention, bool):
        return range(depth) if attention else range(0)
    return range(depth)[attention]


def graph_start(attention: KeptAttention, kept: range) -> int:
    """The first block a grad trace keeps the graph of: 0, or a slice's first block, since what the trace is for
    reads nothing before it (the earlier blocks run without a graph, and the pixels get no gradient)."""
    return kept.start if isinstance(attention, slice) and len(kept) else 0


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


@dataclass(frozen=True)
class WindowPartition:
    """How a windowed attention (Swin) cut its token grid: rolled by -shift on both axes (`torch.roll`),
    padded at the bottom and right to whole windows, cut into size x size windows in row-major order.
    Every query attends to the keys of its own window alone, so the attention is kept per window, and
    a shifted block also keeps apart, inside one window, the sub-windows the roll brought together."""

    size: int                  # window side, in tokens
    shift: int                 # the roll, in tokens (0: regular windows)
    grid: tuple[int, int]      # the token grid (h, w) before padding

    @property
    def padded(self) -> tuple[int, int]:
        return tuple(-(-n // self.size) * self.size for n in self.grid)

    @property
    def count(self) -> tuple[int, int]:
        """Windows per column and per row."""
        return tuple(n // self.size for n in self.padded)

    @cached_property
    def index(self) -> Tensor:
        """nw t (long): the grid token (row-major on the unrolled grid) at each window position; padding
        positions hold h*w, one past the last token."""
        (h, w), (hp, wp) = self.grid, self.padded
        with torch.inference_mode(False):   # kept and reused, also by passes that keep a graph
            rows, cols = torch.arange(hp)[:, None], torch.arange(wp)[None, :]
            token = ((rows + self.shift) % h) * w + (cols + self.shift) % w
            token = torch.where((rows < h) & (cols < w), token, h * w)
            return _windows(token, self.size)

    @cached_property
    def masked(self) -> Tensor | None:
        """nw t t (bool): the query-key pairs a shifted block keeps apart (timm's `attn_mask` regions, on the
        padded grid); None without a shift."""
        if not self.shift:
            return None
        region = []
        with torch.inference_mode(False):   # kept and reused, also by passes that keep a graph
            for n in self.padded:   # three bands per axis: untouched, the window before the wrap, the wrapped part
                band = torch.zeros(n, dtype=torch.long)
                band[n - self.size:n - self.shift], band[n - self.shift:] = 1, 2
                region.append(band)
            label = _windows(region[0][:, None] * 3 + region[1][None, :], self.size)
            return label[:, :, None] != label[:, None, :]

    def index_on(self, device: torch.device) -> Tensor:
        """`index` on `device`, copied there once and kept: a copy from the host to a GPU makes the host wait for
        the device, so a forward or a method that reads the windows never makes one per block."""
        return self._copied("index", device)

    def masked_on(self, device: torch.device) -> Tensor | None:
        """`masked` on `device`, copied there once and kept (as `index_on`); None without a shift."""
        return None if self.masked is None else self._copied("masked", device)

    @cached_property
    def _copies(self) -> dict[tuple[str, torch.device], Tensor]:
        return {}

    def _copied(self, name: str, device: torch.device) -> Tensor:
        key = (name, torch.device(device))
        if key not in self._copies:
            with torch.inference_mode(False):   # kept and reused, also by passes that keep a graph
                self._copies[key] = getattr(self, name).to(device)
        return self._copies[key]


def _windows(values: Tensor, size: int) -> Tensor:
    """hp wp -> nw t: the window partition, windows row-major and positions row-major inside each."""
    hp, wp = values.shape
    return values.reshape(hp // size, size, wp // size, size).permute(0, 2, 1, 3).reshape(-1, size * size)


@dataclass
class AttentionParts:
    """How a block's heads write into the residual stream (TransformerLens' names in brackets), for
    decompositions: kept by traces made with decompose=True."""

    values: Tensor   # b h nk d (v): head h's output at query q is z = attn[:, h, q] @ values[:, h]
    weight: Tensor   # c (h d) (W_O, LayerScale folded in): the heads' outputs z write z @ weight.T ...
    bias: Tensor     # c (b_O, LayerScale folded in): ... + bias, the attention's whole output


@dataclass
class BlockTrace:
    """What one block computed: its output tokens (prefix tokens first), the attention it applied
    (global or per window), the query and key grids it worked on and, where asked for, its input
    and the parts gradient and decomposition methods read."""
    attn: Tensor | None            # post-softmax, heads at dim -3, queries -2, keys -1: b h nq nk (global), or
                                   # b nw h t t per window (`windows`); None from trace(..., attention=False)
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
    windows: WindowPartition | None = None   # windowed attention (Swin): which keys each query saw
    attends: bool = True           # False: a convolutional block, which has no attention at all (ResNet, ConvNeXt)
    input_grid: tuple[int, int] | None = None   # the grid of `inputs` where it is not query_grid (a ResNet block
                                                # that halves the grid itself: its input is the previous stage's)
    hidden: Tensor | None = None   # b n hidden, the MLP's first layer through its activation at every token (prefix
                                   # tokens first): Ghiasi et al. 2022's units, kept by traces made with units=True

    @property
    def stream_grid(self) -> tuple[int, int]:
        """The grid of the residual stream entering the block (`inputs`)."""
        return self.input_grid or self.query_grid

    @property
    def prefix(self) -> int:
        return len(self.prefix_kinds)

    @property
    def heads(self) -> int:
        """The attention's head count (0 where the trace keeps no attention)."""
        return 0 if self.attn is None else self.attn.shape[-3]


@dataclass
class Trace:
    """What a traced forward pass returns: the logits, every block's `BlockTrace` in forward order, each
    stage's embedding geometry and feature map, and the size of the input the model saw."""
    logits: Tensor                 # b classes; b 0 for a model without a classifier (headless: see `pooled`)
    blocks: list[BlockTrace]       # forward order
    embeddings: list[Embedding]    # one per stage
    features: list[Tensor]         # per stage, b c h w grid tokens after the stage's last block
    input_size: tuple[int, int]    # (h, w) of the pixels the model saw
    pooled: Tensor | None = None        # b c, what the classifier reads (timm's pre-logits): a headless model's
                                        # output (ViT; None for CvT)
    final_tokens: Tensor | None = None  # b n c, the last block's tokens through the final norm, as timm's
                                        # forward_features returns them (ViT, Swin; None for CvT)
    pixels: Tensor | None = None   # b 3 h w, the leaf a trace made with grad=True differentiates to (None otherwise)
    residual_stream: bool = True   # each block's output is its input plus what it added (False: a ResNet, whose
                                   # ReLU after each addition makes the stream no sum of the blocks' parts)

    @property
    def has_classifier(self) -> bool:
        return self.logits.shape[-1] > 0

    @property
    def attentions(self) -> list[Tensor]:
        return [block.attn for block in self.blocks]
