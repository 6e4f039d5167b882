"""Swin Transformer (Liu et al. 2021): attention inside shifted windows, four stages joined by patch merging.

Tokens stay on their grid (b h w c, as in timm). Stage 1 cuts the image into 4x4 patches (a strided
convolution + LayerNorm); every later stage starts by merging each 2x2 neighbourhood into one token
(concatenated to 4c, LayerNorm, a bias-free linear map to 2c). A block attends within w x w windows,
and every second block first rolls the grid by -w//2 on both axes, so that its windows straddle the
previous block's borders; the tokens the roll brought together from opposite edges are kept apart by
a mask (exactly: their weights are 0, where timm adds -100), and the grid is rolled back afterwards.
Where a stage's grid is no larger than the window, the window shrinks to the grid and nothing shifts.
Attention logits get a learned relative position bias, one table of (2w-1)^2 offsets per head. The
classifier reads the mean of the last stage's tokens after a LayerNorm; there is no class token.

Parameter names are timm's (`patch_embed.proj`, `layers.i.downsample.reduction`, `layers.i.blocks.j.attn.
relative_position_bias_table`, `head.fc`, ...), so a timm `SwinTransformer` state dict loads 1:1;
`convert_transformers_state_dict` maps `SwinForImageClassification` (patch merging at the end of
stages 1-3, q, k and v apart) onto them. The trace keeps each block's attention per window
(b nw h t t, t = w^2) with the window partition that made it (`WindowPartition`), never as a dense
token x token matrix. The layers come from `relevance.py`: torch's own, unless relevance rules
(AttnLRP) are switched on for one pass.
"""
from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .layers import Mlp
from .relevance import GammaConv2d, GammaLinear, LayerNorm, attention_inputs
from .trace import (
    AttentionParts,
    BlockTrace,
    Edit,
    Embedding,
    KeptAttention,
    Trace,
    Window,
    WindowPartition,
    edited_map,
    graph_pixels,
    graph_start,
    kept_blocks,
)

LN_EPS = 1e-5   # timm's and transformers' Swin: nn.LayerNorm's default


@dataclass(frozen=True)
class SwinConfig:
    """A Swin's architecture as timm's `SwinTransformer` names it: patch size, width, depths and
    heads per stage, window size and the input size the windows were trained for."""
    img_size: tuple[int, int] = (224, 224)   # the size the windows were trained for (a stage's window shrinks
    patch_size: int = 4                       # to its grid there, which fixes the bias tables' shapes)
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 96                       # stage i has embed_dim * 2**i channels
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True

    def __post_init__(self):
        size = self.img_size
        object.__setattr__(self, "img_size", (size, size) if isinstance(size, int) else tuple(size))
        object.__setattr__(self, "depths", tuple(self.depths))
        object.__setattr__(self, "num_heads", tuple(self.num_heads))
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"{len(self.depths)} stage depths but {len(self.num_heads)} head counts")
        for i, heads in enumerate(self.num_heads):
            if self.dims[i] % heads:
                raise ValueError(f"stage {i + 1}: width {self.dims[i]} is not divisible by {heads} heads")

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self.embed_dim * 2 ** i for i in range(len(self.depths)))

    def stage_grids(self, input_size: tuple[int, int]) -> list[tuple[int, int]]:
        """Each stage's token grid for pixels of `input_size`: the patch grid, then halved by every merging."""
        grid = tuple(n // self.patch_size for n in input_size)
        grids = [grid]
        for _ in self.depths[1:]:
            grid = tuple(-(-n // 2) for n in grid)
            grids.append(grid)
        return grids

    @property
    def stage_windows(self) -> tuple[int, ...]:
        """Each stage's window side at `img_size`: `window_size`, or the grid where that is smaller (timm's rule,
        which sizes the relative position bias tables)."""
        return tuple(min(self.window_size, *grid) for grid in self.stage_grids(self.img_size))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, hf: dict) -> "SwinConfig":
        """A transformers `SwinConfig` (config.json of microsoft/swin-*) -> SwinConfig."""
        if hf.get("use_absolute_embeddings"):
            raise ValueError("absolute position embeddings (use_absolute_embeddings) are not supported")
        if hf.get("hidden_act", "gelu") != "gelu" or hf.get("layer_norm_eps", LN_EPS) != LN_EPS:
            raise ValueError(f"only GELU and LayerNorm eps {LN_EPS} are supported")
        num_classes = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)   # transformers' default
        return cls(img_size=hf.get("image_size", 224), patch_size=hf.get("patch_size", 4),
                   in_chans=hf.get("num_channels", 3), num_classes=num_classes, embed_dim=hf.get("embed_dim", 96),
                   depths=tuple(hf.get("depths", (2, 2, 6, 2))), num_heads=tuple(hf.get("num_heads", (3, 6, 12, 24))),
                   window_size=hf.get("window_size", 7), mlp_ratio=hf.get("mlp_ratio", 4.0),
                   qkv_bias=hf.get("qkv_bias", True))


@functools.lru_cache(maxsize=32)
def relative_position_index(window: int, table_window: int | None = None,
                            device: torch.device | str = "cpu") -> Tensor:
    """t t (long) on `device`: the row of the bias table for each (query, key) pair of a window of side `window`,
    the table holding the (2 table_window - 1)^2 offsets of a window of side `table_window` (default: the same). A
    window smaller than the table's (the grid at another input size) reads the table's central offsets. Made on
    the device, once per geometry: a copy from the host to a GPU in every block would make the host wait."""
    table_window = table_window or window
    # kept and reused: a tensor made in inference mode could not be saved for backward
    with torch.inference_mode(False):
        steps = torch.arange(window, device=device)
        coords = torch.stack(torch.meshgrid(steps, steps, indexing="ij")).flatten(1)
        offsets = coords[:, :, None] - coords[:, None, :] + table_window - 1   # 2 t t, from 0
        return offsets[0] * (2 * table_window - 1) + offsets[1]


@functools.lru_cache(maxsize=64)
def _partition(size: int, shift: int, grid: tuple[int, int]) -> WindowPartition:
    """One partition object per geometry, so its index and mask are computed once."""
    return WindowPartition(size=size, shift=shift, grid=grid)


class WindowAttention(nn.Module):
    """Multi-head attention inside each window, with a learnt bias per head on every relative
    position (`relative_position_bias_table`)."""
    def __init__(self, *, dim: int, heads: int, window: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.window = window
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def position_bias(self, window: int) -> Tensor:
        """h t t: each head's bias on the logits of a window of side `window`."""
        table = self.relative_position_bias_table
        index = relative_position_index(window, self.window, table.device)
        return rearrange(table[index], 'q k h -> h q k').contiguous()   # added to every window: contiguous is faster

    def forward(self, x: Tensor, window: int, masked: Tensor | None,
                return_attn: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """x: b nw t c windows of tokens; masked: nw t t pairs kept apart (shifted windows) or None. -> (output,
        attention b nw h t t or None, the values b nw h t d it weighed, for decompositions)."""
        q, k, values = rearrange(self.qkv(x), 'b nw t (three h d) -> three b nw h t d', three=3, h=self.heads)
        q, k, v = attention_inputs(q, k, values)
        bias = self.position_bias(window).to(x.dtype)   # h t t
        if masked is not None:
            bias = bias.masked_fill(masked[:, None], float("-inf"))   # nw h t t: every query keeps its own key
        if return_attn:
            attn = (q * self.scale @ k.transpose(-2, -1) + bias).softmax(dim=-1)   # b nw h t t
            out = attn @ v
        else:   # the fused kernel, its mask written out per window: a broadcast mask takes a CPU's slow path
            b, nw, h, t, d = q.shape
            mask = bias.expand(b, nw, h, t, t).reshape(b * nw, h, t, t)
            q, k, v = (rearrange(y, 'b nw h t d -> (b nw) h t d') for y in (q, k, v))
            attn, out = None, rearrange(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale),
                                        '(b nw) h t d -> b nw h t d', b=b)
        return self.proj(rearrange(out, 'b nw h t d -> b nw t (h d)')), attn, values


class SwinBlock(nn.Module):
    """A pre-norm Swin block: window attention (on cyclically shifted windows every second block),
    then the MLP, each added to the stream."""
    def __init__(self, *, dim: int, heads: int, window: int, shifted: bool, mlp_ratio: float, qkv_bias: bool):
        super().__init__()
        self.window, self.shifted = window, shifted
        self.norm1 = LayerNorm(dim, eps=LN_EPS)
        self.attn = WindowAttention(dim=dim, heads=heads, window=window, qkv_bias=qkv_bias)
        self.norm2 = LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim=dim, hidden_dim=int(dim * mlp_ratio))

    def partition(self, grid: tuple[int, int]) -> WindowPartition:
        """The windows on a grid: the window shrinks to a grid no larger than it, and then nothing shifts."""
        size = min(self.window, *grid)
        shift = self.window // 2 if self.shifted and min(grid) > self.window else 0
        return _partition(size, shift, tuple(grid))

    def windows(self, x: Tensor, part: WindowPartition) -> Tensor:
        """b h w c -> b nw t c: rolled by -shift, padded with zeros at the bottom and right, cut into windows."""
        if part.shift:
            x = torch.roll(x, shifts=(-part.shift, -part.shift), dims=(1, 2))
        (h, w), (hp, wp) = part.grid, part.padded
        if (hp, wp) != (h, w):
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        return rearrange(x, 'b (nh wh) (nw ww) c -> b (nh nw) (wh ww) c', wh=part.size, ww=part.size)

    def unwindowed(self, x: Tensor, part: WindowPartition) -> Tensor:
        """b nw t c -> b h w c: `windows` undone (padding dropped, the roll reversed)."""
        (h, w), size = part.grid, part.size
        x = rearrange(x, 'b (nh nw) (wh ww) c -> b (nh wh) (nw ww) c', nh=part.count[0], wh=size, ww=size)
        x = x[:, :h, :w]
        return torch.roll(x, shifts=(part.shift, part.shift), dims=(1, 2)) if part.shift else x

    def forward(self, x: Tensor, return_attn: bool = False, attn_delta: Tensor | None = None,
                units: list[Tensor] | None = None) -> tuple[Tensor, Tensor | None, Tensor, WindowPartition, Tensor]:
        """b h w c -> (output tokens b h w c, attention b nw h t t or None, first norm's output b n c, the windows,
        the attention's values b nw h t d); attn_delta (b h w c): added to the attention's output (activation
        patching); units: where a list is given, the MLP's hidden units (b h w hidden) are appended to it."""
        part = self.partition(x.shape[1:3])
        masked = part.masked_on(x.device)
        normed = self.norm1(rearrange(x, 'b h w c -> b (h w) c'))   # b n c, the tensor Grad-CAM differentiates
        grid = rearrange(normed, 'b (h w) c -> b h w c', h=part.grid[0])
        out, attn, values = self.attn(self.windows(grid, part), part.size, masked, return_attn)
        x = x + self.unwindowed(out, part)
        if attn_delta is not None:
            x = x + attn_delta
        return x + self.mlp(self.norm2(x), units), attn, normed, part, values

    def parts(self, values: Tensor) -> AttentionParts:
        """How the heads write, from the values the attention weighed, per window (b nw h t d)."""
        return AttentionParts(values=values, weight=self.attn.proj.weight, bias=self.attn.proj.bias)


class PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens: one convolution with kernel and stride the patch size, then
    LayerNorm."""
    def __init__(self, *, patch_size: int, in_chans: int, dim: int):
        super().__init__()
        self.proj = GammaConv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        self.norm = LayerNorm(dim, eps=LN_EPS)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.norm(rearrange(self.proj(pixels), 'b c h w -> b h w c'))


class PatchMerging(nn.Module):
    """Each 2x2 neighbourhood (2i+a, 2j+b) -> one token: concatenated in the order (a, b) = (0,0), (1,0),
    (0,1), (1,1) as in the paper's code, LayerNorm, bias-free linear map 4c -> 2c."""

    def __init__(self, *, dim: int, out_dim: int):
        super().__init__()
        self.norm = LayerNorm(4 * dim, eps=LN_EPS)
        self.reduction = GammaLinear(4 * dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.reduction(self.norm(rearrange(x, 'b (h a) (w b2) c -> b h w (b2 a c)', a=2, b2=2)))


class SwinStage(nn.Module):
    """One Swin stage: patch merging from the previous stage (not in the first), then its blocks,
    alternating plain and shifted windows."""
    def __init__(self, *, in_dim: int, dim: int, depth: int, heads: int, window: int, downsample: bool,
                 mlp_ratio: float, qkv_bias: bool):
        super().__init__()
        self.downsample = PatchMerging(dim=in_dim, out_dim=dim) if downsample else nn.Identity()
        self.blocks = nn.ModuleList([
            SwinBlock(dim=dim, heads=heads, window=window, shifted=i % 2 == 1, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias)
            for i in range(depth)])


class ClassifierHead(nn.Module):
    """The classifier on the pooled tokens (the identity for a headless model)."""
    def __init__(self, *, dim: int, num_classes: int):
        super().__init__()
        self.fc = GammaLinear(dim, num_classes) if num_classes else nn.Identity()

    def forward(self, pooled: Tensor) -> Tensor:
        return self.fc(pooled)


class Swin(nn.Module):
    """Swin Transformer: patch embedding, stages of windowed attention joined by patch merging,
    the final norm, the mean over tokens and the classifier; `model.trace(pixels)` a `Trace`."""
    def __init__(self, config: SwinConfig):
        super().__init__()
        c = self.config = config
        dims = c.dims
        self.patch_embed = PatchEmbed(patch_size=c.patch_size, in_chans=c.in_chans, dim=dims[0])
        self.layers = nn.ModuleList([
            SwinStage(in_dim=dims[max(i - 1, 0)], dim=dims[i], depth=depth, heads=c.num_heads[i],
                      window=c.stage_windows[i], downsample=i > 0, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias)
            for i, depth in enumerate(c.depths)])
        self.norm = LayerNorm(dims[-1], eps=LN_EPS)
        self.head = ClassifierHead(dim=dims[-1], num_classes=c.num_classes)
        if not self.norm.weight.is_meta:   # built on the meta device to be loaded: nothing to draw
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias) if m.bias is not None else None
                elif isinstance(m, WindowAttention):
                    nn.init.trunc_normal_(m.relative_position_bias_table, std=0.02)

    @property
    def blocks(self) -> list[SwinBlock]:
        """Every block in forward order (the trace's order)."""
        return [block for stage in self.layers for block in stage.blocks]

    def embed(self, pixels: Tensor) -> Tensor:
        """pixels -> b h w c patch tokens, once the input is one the stages can merge."""
        grids = self.config.stage_grids(pixels.shape[2:])
        odd = [i for i, grid in enumerate(grids[:-1]) if grid[0] % 2 or grid[1] % 2]
        if min(grids[0]) < 1 or odd:
            step = self.config.patch_size * 2 ** (len(grids) - 1)
            raise ValueError(f"Swin merges 2x2 tokens between stages, so its input must be a multiple of {step} px "
                             f"on both sides, not {pixels.shape[2]}x{pixels.shape[3]}")
        return self.patch_embed(pixels)

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        """The patch embedding and each patch merging (a 2x2, stride 2 window) for pixels of `input_size`."""
        p, grids = self.config.patch_size, self.config.stage_grids(input_size)
        ins = [tuple(input_size)] + grids[:-1]
        return [Embedding(Window(p, p, 0) if i == 0 else Window(2, 2, 0), ins[i], grids[i]) for i in range(len(grids))]

    def pre_logits(self, x: Tensor) -> Tensor:
        """Final-norm'd b n c tokens -> what the classifier reads, b c: their mean."""
        return x.mean(dim=1)

    def head_logits(self, x: Tensor) -> Tensor:
        """Final-norm'd b n c last-stage tokens -> logits (the mean through the classifier)."""
        return self.head(self.pre_logits(x))

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        """A last-stage block's b n c tokens -> logits of their mean through the final norm and the classifier
        (LeGrad's per-layer score). The classifier normalises each token before the mean, so this is not
        `head_logits(norm(tokens))`: LeGrad's score norms the mean, as for the other families."""
        return self.head(self.norm(tokens.mean(dim=1)))

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embed(pixels)
        for stage in self.layers:
            x = stage.downsample(x)
            for block in stage.blocks:
                x = block(x)[0]
        return self.head_logits(self.norm(rearrange(x, 'b h w c -> b (h w) c')))

    def forward_from(self, index: int, tokens: Tensor, grid: tuple[int, int], *,
                     attn_delta: Tensor | None = None) -> Tensor:
        """The residual stream entering block `index` of `trace.blocks` (b n c on its stage's `grid`) -> logits:
        the rest of the forward, for activation patching (`attn_delta`, b n c, added to that block's attention
        output); index = the number of blocks: the classifier alone."""
        x = rearrange(tokens, 'b (h w) c -> b h w c', h=grid[0], w=grid[1])
        delta = None if attn_delta is None else rearrange(attn_delta, 'b (h w) c -> b h w c', h=grid[0], w=grid[1])
        first = 0
        for stage in self.layers:
            if first > index:
                x = stage.downsample(x)
            for i, block in enumerate(stage.blocks, start=first):
                if i >= index:
                    x = block(x, attn_delta=delta if i == index else None)[0]
            first += len(stage.blocks)
        return self.head_logits(self.norm(rearrange(x, 'b h w c -> b (h w) c')))

    def trace(self, pixels: Tensor, *, grad: bool = False, decompose: bool = False,
              attention: KeptAttention = True, edit: Edit | None = None, units: bool = False) -> Trace:
        """One forward pass that returns every block's windowed attention, block output and stage feature map.

        With grad=True the graph is kept, so `torch.autograd.grad(logit, trace.attentions)` works.
        decompose=True: each block also keeps how its heads write (`BlockTrace.parts`, values per window).
        attention=False: no attention maps (`attn` None) and the fused attention kernel (CKA).
        attention=slice(...): the maps of those blocks only (indices of `trace.blocks`), and with grad=True the
        graph from the first of them on (`models.trace.graph_start`).
        edit: `models.trace.Edit`, each block's output tokens replaced before the rest of the forward reads
        them (circuits splice dictionaries in this way).
        units=True: each block also keeps its MLP's hidden units (`BlockTrace.hidden`, for feature pictures).
        """
        kept = kept_blocks(attention, sum(len(stage.blocks) for stage in self.layers))
        graph_from = graph_start(attention, kept)
        blocks, features = [], []
        with torch.set_grad_enabled(grad):
            if grad and not graph_from:
                pixels = graph_pixels(pixels)
            with torch.set_grad_enabled(grad and not graph_from):
                x = self.embed(pixels)
            for s, stage in enumerate(self.layers):
                with torch.set_grad_enabled(grad and len(blocks) >= graph_from):
                    x = stage.downsample(x)
                grid = (x.shape[1], x.shape[2])
                for block in stage.blocks:
                    inputs, i, hidden = x, len(blocks), [] if units else None
                    with torch.set_grad_enabled(grad and i >= graph_from):
                        x, attn, normed, part, values = block(x, return_attn=i in kept, units=hidden)
                    x = edited_map(edit, i, x, layout='b h w c')
                    flat = lambda t: rearrange(t, 'b h w c -> b (h w) c')
                    blocks.append(BlockTrace(attn=attn, tokens=flat(x), stage=s, query_grid=grid, key_grid=grid,
                                             key_window=Window(1, 1, 0), prefix_kinds=(),
                                             normed=normed if grad else None, inputs=flat(inputs),
                                             parts=block.parts(values) if decompose else None, windows=part,
                                             hidden=flat(hidden[0]) if units else None))
                features.append(rearrange(x, 'b h w c -> b c h w'))
            final = self.norm(rearrange(x, 'b h w c -> b (h w) c'))
            pooled = self.pre_logits(final)
            logits = self.head(pooled) if self.config.num_classes else pooled.new_zeros(pooled.shape[0], 0)
        input_size = (pixels.shape[2], pixels.shape[3])
        return Trace(logits=logits, blocks=blocks, embeddings=self.embeddings(input_size), features=features,
                     input_size=input_size, pooled=pooled, final_tokens=final,
                     pixels=pixels if grad and not graph_from else None)


# transformers' SwinForImageClassification names -> ours, applied in order (q, k, v are joined afterwards)
_TRANSFORMERS_RENAMES = [
    (r"^swin\.embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^swin\.embeddings\.norm\.", "patch_embed.norm."),
    (r"^swin\.encoder\.layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) + 1}.downsample."),
    (r"^swin\.encoder\.layers\.(\d+)\.blocks\.(\d+)\.", r"layers.\1.blocks.\2."),
    (r"\.layernorm_before\.", ".norm1."),
    (r"\.layernorm_after\.", ".norm2."),
    (r"\.attention\.self\.relative_position_bias_table$", ".attn.relative_position_bias_table"),
    (r"\.attention\.self\.(query|key|value)\.", r".attn.\1."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
    (r"^swin\.layernorm\.", "norm."),
    (r"^classifier\.", "head.fc."),
]


def convert_transformers_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """`SwinForImageClassification.state_dict()` -> a `Swin` state dict: names mapped, the merging at the end of
    stage i moved to the start of stage i + 1, query, key and value joined into qkv, index buffers dropped."""
    renamed = {}
    for key, value in state_dict.items():
        if key.endswith(("relative_position_index", "attn_mask")):
            continue
        for pattern, repl in _TRANSFORMERS_RENAMES:
            key = re.sub(pattern, repl, key)
        renamed[key] = value
    out = {}
    for key, value in renamed.items():
        found = re.match(r"(.*\.attn\.)(query|key|value)\.(weight|bias)$", key)
        if found is None:
            out[key] = value
        elif found.group(2) == "query":
            prefix, kind = found.group(1), found.group(3)
            out[f"{prefix}qkv.{kind}"] = torch.cat([renamed[f"{prefix}{n}.{kind}"] for n in ("query", "key", "value")])
    return out
