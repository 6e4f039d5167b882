"""Convolutional vision Transformer (Wu et al. 2021), as published by Microsoft on the Hub.

Three stages, each a convolutional token embedding followed by pre-norm blocks whose q, k and v
come from depthwise 3x3 conv + BatchNorm projections (keys and values at stride 2). The class
token exists only where a stage asks for it (the last one) and skips the convolutions.
`convert_transformers_state_dict` maps `CvtForImageClassification` weights onto these names. The
layers come from `relevance.py`: torch's own, unless relevance rules (AttnLRP) are switched on.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .layers import renamed_state_dict
from .relevance import GELU, GammaConv2d, GammaLinear, LayerNorm, QuickGELU, attention_inputs
from .trace import (
    AttentionParts,
    BlockTrace,
    Edit,
    Embedding,
    KeptAttention,
    Trace,
    Window,
    edited,
    graph_pixels,
    graph_start,
    kept_blocks,
    kept_units,
)

LN_EPS = 1e-5   # every CvT LayerNorm; transformers never reads config.layer_norm_eps


@dataclass(frozen=True)
class CvTStageConfig:
    """One CvT stage: its convolutional token embedding, depth, heads and the depthwise
    convolutions that make queries, keys and values (keys and values at a stride)."""
    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int       # convolutional token embedding: kernel, stride, padding
    patch_stride: int
    patch_padding: int
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    cls_token: bool = False
    kernel_qkv: int = 3   # depthwise q/k/v convolutions; q at stride 1
    padding_q: int = 1
    stride_kv: int = 2
    padding_kv: int = 1


@dataclass(frozen=True)
class CvTConfig:
    """A CvT's architecture: its stages (CvT-13 by default), input channels, classes and activation."""
    stages: tuple[CvTStageConfig, ...] = field(default_factory=lambda: CVT_13)
    in_chans: int = 3
    num_classes: int = 1000
    act: str = "gelu"     # 'gelu' (transformers, the Hub weights' reference) or 'quick_gelu' (Microsoft's code)

    def __post_init__(self):
        stages = tuple(s if isinstance(s, CvTStageConfig) else CvTStageConfig(**s) for s in self.stages)
        object.__setattr__(self, "stages", stages)
        if self.act not in ("gelu", "quick_gelu"):
            raise ValueError(f"act must be 'gelu' or 'quick_gelu', not {self.act!r}")
        for i, s in enumerate(stages):
            if s.embed_dim % s.num_heads:
                raise ValueError(f"stage {i}: embed_dim {s.embed_dim} is not divisible by num_heads {s.num_heads}")
        if not stages[-1].cls_token:
            raise ValueError("the last stage must have the class token (the classifier reads it)")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, hf: dict) -> "CvTConfig":
        """A transformers `CvtConfig` (config.json of microsoft/cvt-*) -> CvTConfig."""
        n = len(hf["depth"])
        if any(m != "dw_bn" for m in hf.get("qkv_projection_method", ["dw_bn"] * n)):
            raise ValueError("only the 'dw_bn' q/k/v projection of the published CvTs is supported")
        if any(s != 1 for s in hf.get("stride_q", [1] * n)):
            raise ValueError("only stride_q = 1 is supported (the query grid is the token grid)")
        stages = tuple(CvTStageConfig(
            embed_dim=hf["embed_dim"][i], depth=hf["depth"][i], num_heads=hf["num_heads"][i],
            patch_size=hf["patch_sizes"][i], patch_stride=hf["patch_stride"][i],
            patch_padding=hf["patch_padding"][i], mlp_ratio=hf["mlp_ratio"][i], qkv_bias=hf["qkv_bias"][i],
            cls_token=hf["cls_token"][i], kernel_qkv=hf["kernel_qkv"][i], padding_q=hf["padding_q"][i],
            stride_kv=hf["stride_kv"][i], padding_kv=hf["padding_kv"][i]) for i in range(n))
        num_classes = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)   # transformers' default
        return cls(stages=stages, in_chans=hf.get("num_channels", 3), num_classes=num_classes)


def _stages(embed_dims, heads, depths) -> tuple[CvTStageConfig, ...]:
    embeds = ((7, 4, 2), (3, 2, 1), (3, 2, 1))
    return tuple(CvTStageConfig(embed_dim=d, depth=n, num_heads=h, patch_size=k, patch_stride=s, patch_padding=p,
                                cls_token=i == 2)
                 for i, (d, h, n, (k, s, p)) in enumerate(zip(embed_dims, heads, depths, embeds)))


CVT_13 = _stages((64, 192, 384), (1, 3, 6), (1, 2, 10))
CVT_21 = _stages((64, 192, 384), (1, 3, 6), (1, 4, 16))
CVT_W24 = _stages((192, 768, 1024), (3, 12, 16), (2, 2, 20))


class ConvEmbed(nn.Module):
    """Convolutional token embedding: an overlapping strided convolution, then LayerNorm over channels."""
    def __init__(self, *, in_chans: int, dim: int, window: Window):
        super().__init__()
        self.window = window
        self.proj = GammaConv2d(in_chans, dim, kernel_size=window.kernel, stride=window.stride, padding=window.padding)
        self.norm = LayerNorm(dim, eps=LN_EPS)

    def forward(self, x: Tensor) -> Tensor:
        x = self.proj(x)
        h, w = x.shape[2:]
        x = self.norm(rearrange(x, 'b c h w -> b h w c'))
        return rearrange(x, 'b h w c -> b c h w', h=h, w=w)


class DepthwiseConvBN(nn.Module):
    """A depthwise convolution and BatchNorm: how CvT projects tokens to queries, keys and values."""
    def __init__(self, *, dim: int, window: Window):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size=window.kernel, stride=window.stride, padding=window.padding,
                              groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, fmap: Tensor) -> Tensor:
        return self.bn(self.conv(fmap))   # b c h w


class ConvAttention(nn.Module):
    """Convolutional attention: queries, keys and values from depthwise convolutions on the token
    grid (keys and values subsampled), then linear maps and multi-head attention; the class
    token bypasses the convolutions."""
    def __init__(self, *, dim: int, heads: int, qkv_bias: bool, q_window: Window, kv_window: Window):
        super().__init__()
        self.heads = heads
        self.scale = dim ** -0.5   # over the whole stage width, as in Microsoft's and transformers' code
        self.kv_window = kv_window
        self.conv_q = DepthwiseConvBN(dim=dim, window=q_window)
        self.conv_k = DepthwiseConvBN(dim=dim, window=kv_window)
        self.conv_v = DepthwiseConvBN(dim=dim, window=kv_window)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, grid: tuple[int, int], prefix: int,
                return_attn: bool = False) -> tuple[Tensor, Tensor | None, tuple[int, int], Tensor]:
        """-> (output, attention b h nq nk or None, the key grid, the values b h nk d it weighed, for
        decompositions)."""
        cls, fmap = x[:, :prefix], rearrange(x[:, prefix:], 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        k_map = self.conv_k(fmap)
        key_grid = (k_map.shape[2], k_map.shape[3])

        def tokens(m: Tensor) -> Tensor:   # the class token bypasses the convolutions
            return torch.cat([cls, rearrange(m, 'b c h w -> b (h w) c')], dim=1)

        values = self.v(tokens(self.conv_v(fmap)))
        q, k, v = attention_inputs(self.q(tokens(self.conv_q(fmap))), self.k(tokens(k_map)), values)
        q, k, v = (rearrange(t, 'b n (h d) -> b h n d', h=self.heads) for t in (q, k, v))
        if return_attn:
            attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)   # b h nq nk
            out = attn @ v
        else:
            attn, out = None, F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        values = rearrange(values, 'b n (h d) -> b h n d', h=self.heads)
        return self.proj(rearrange(out, 'b h n d -> b n (h d)')), attn, key_grid, values


class Mlp(nn.Module):
    """The block's two-layer MLP: `fc1`, GELU (or QuickGELU, as Microsoft's code has it), `fc2`."""
    def __init__(self, *, dim: int, hidden_dim: int, act: str):
        super().__init__()
        self.fc1 = GammaLinear(dim, hidden_dim)
        self.act = GELU() if act == "gelu" else QuickGELU()
        self.fc2 = GammaLinear(hidden_dim, dim)

    def forward(self, x: Tensor, units: list[Tensor] | None = None) -> Tensor:
        """x -> fc2(act(fc1(x))); `units`: where a list is given, act(fc1(x)) is appended to it (as
        `models.layers.Mlp`)."""
        return self.fc2(kept_units(self.act(self.fc1(x)), units))


class Block(nn.Module):
    """A pre-norm CvT block: convolutional attention, then the MLP, each added to the stream."""
    def __init__(self, *, stage: CvTStageConfig, act: str):
        s = stage
        super().__init__()
        self.norm1 = LayerNorm(s.embed_dim, eps=LN_EPS)
        self.attn = ConvAttention(dim=s.embed_dim, heads=s.num_heads, qkv_bias=s.qkv_bias,
                                  q_window=Window(s.kernel_qkv, 1, s.padding_q),
                                  kv_window=Window(s.kernel_qkv, s.stride_kv, s.padding_kv))
        self.norm2 = LayerNorm(s.embed_dim, eps=LN_EPS)
        self.mlp = Mlp(dim=s.embed_dim, hidden_dim=int(s.embed_dim * s.mlp_ratio), act=act)

    def forward(self, x: Tensor, grid: tuple[int, int], prefix: int, return_attn: bool = False,
                attn_delta: Tensor | None = None, units: list[Tensor] | None = None):
        """-> (output tokens, attention or None, key grid, first norm's output, the attention's values); attn_delta:
        added to the attention's output (activation patching); units: where a list is given, the MLP's hidden units
        are appended to it."""
        normed = self.norm1(x)
        out, attn, key_grid, values = self.attn(normed, grid, prefix, return_attn)
        x = x + out if attn_delta is None else x + out + attn_delta
        return x + self.mlp(self.norm2(x), units), attn, key_grid, normed, values

    def parts(self, values: Tensor) -> AttentionParts:
        """How the heads write, from the values the attention weighed."""
        return AttentionParts(values=values, weight=self.attn.proj.weight, bias=self.attn.proj.bias)


class Stage(nn.Module):
    """One CvT stage: the convolutional embedding of the previous stage's feature map, a class token
    where the stage has one, and its blocks."""
    def __init__(self, *, stage: CvTStageConfig, in_chans: int, act: str):
        super().__init__()
        s = stage
        self.patch_embed = ConvEmbed(in_chans=in_chans, dim=s.embed_dim,
                                     window=Window(s.patch_size, s.patch_stride, s.patch_padding))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, s.embed_dim)) if s.cls_token else None
        self.blocks = nn.ModuleList([Block(stage=s, act=act) for _ in range(s.depth)])

    def forward(self, fmap: Tensor, trace: list[BlockTrace] | None = None, index: int = 0, keep_normed: bool = False,
                decompose: bool = False, kept: range = range(0), graph_from: int = 0, edit: Edit | None = None,
                units: bool = False):
        """b c h w -> (b c' h' w' feature map, b 1 c' class token or None); appends to `trace` if given
        (with each block's first-norm output if `keep_normed`, how its heads write if `decompose`, its MLP's hidden
        units if `units`, the attention maps of the blocks in `kept`, indices of the whole trace, and where grad is
        enabled the graph from its block `graph_from` on; `edit`: `models.trace.Edit`, by the whole trace's block
        indices)."""
        first, grad = 0 if trace is None else len(trace), torch.is_grad_enabled()
        with torch.set_grad_enabled(grad and first >= graph_from):
            x = self.patch_embed(fmap)
            grid = (x.shape[2], x.shape[3])
            x = rearrange(x, 'b c h w -> b (h w) c')
            prefix = 0
            if self.cls_token is not None:
                x, prefix = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1), 1
        for i, block in enumerate(self.blocks, start=first):
            inputs, hidden = x, [] if units else None
            with torch.set_grad_enabled(grad and i >= graph_from):
                x, attn, key_grid, normed, values = block(x, grid, prefix, return_attn=i in kept, units=hidden)
                x = edited(edit, i, x)
            if trace is not None:
                trace.append(BlockTrace(attn=attn, tokens=x, stage=index, query_grid=grid, key_grid=key_grid,
                                        key_window=block.attn.kv_window, prefix_kinds=("cls",) * prefix,
                                        normed=normed if keep_normed else None, inputs=inputs,
                                        parts=block.parts(values) if decompose else None,
                                        hidden=hidden[0] if units else None))
        fmap = rearrange(x[:, prefix:], 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        return fmap, (x[:, :1] if prefix else None)


class CvT(nn.Module):
    """Convolutional vision Transformer: stages that each embed the previous one's feature map more
    coarsely, then the final norm and classifier on the class token; `model.trace(pixels)` a `Trace`."""
    def __init__(self, config: CvTConfig):
        super().__init__()
        self.config = config
        chans = (config.in_chans,) + tuple(s.embed_dim for s in config.stages)
        self.stages = nn.ModuleList([Stage(stage=s, in_chans=chans[i], act=config.act)
                                     for i, s in enumerate(config.stages)])
        self.norm = LayerNorm(chans[-1], eps=LN_EPS)
        self.head = GammaLinear(chans[-1], config.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias) if m.bias is not None else None
        for stage in self.stages:
            if stage.cls_token is not None:
                nn.init.trunc_normal_(stage.cls_token, std=0.02)

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        """Each stage's convolutional token embedding for pixels of `input_size` (h, w), as `trace` reports it."""
        embeddings, grid = [], tuple(input_size)
        for stage in self.stages:
            w = stage.patch_embed.window
            out = tuple((n + 2 * w.padding - w.kernel) // w.stride + 1 for n in grid)
            embeddings.append(Embedding(w, grid, out))
            grid = out
        return embeddings

    def forward(self, pixels: Tensor) -> Tensor:
        x = pixels
        for stage in self.stages:
            x, cls = stage(x)
        return self.head(self.norm(cls[:, 0]))

    def head_logits(self, x: Tensor) -> Tensor:
        """Final-norm'd last-stage tokens -> logits: the class token through the classifier (as ViT's
        `head_logits`, so the logit lens reads both models alike)."""
        return self.head(x[:, 0])

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        """A last-stage block's b n c tokens -> logits of their mean (class token included) through the final
        norm and the classifier: LeGrad's per-layer score."""
        return self.head(self.norm(tokens.mean(dim=1)))

    def forward_from(self, index: int, tokens: Tensor, grid: tuple[int, int], *,
                     attn_delta: Tensor | None = None) -> Tensor:
        """The residual stream entering block `index` of `trace.blocks` (b n c on its stage's `grid`) -> logits:
        the rest of the forward, for activation patching (`attn_delta` added to that block's attention
        output); index = the number of blocks: the classifier alone."""
        stages = iter(self.stages)
        for stage in stages:
            if index < len(stage.blocks):
                break
            index -= len(stage.blocks)
        else:
            return self.head(self.norm(tokens[:, 0]))
        prefix = int(stage.cls_token is not None)
        for i, block in enumerate(stage.blocks[index:]):
            tokens = block(tokens, grid, prefix, attn_delta=attn_delta if i == 0 else None)[0]
        x, cls = rearrange(tokens[:, prefix:], 'b (h w) c -> b c h w', h=grid[0], w=grid[1]), tokens[:, :prefix]
        for later in stages:   # the iterator resumes after the stage that holds block `index`
            x, cls = later(x)
        return self.head(self.norm(cls[:, 0]))

    def trace(self, pixels: Tensor, *, grad: bool = False, decompose: bool = False,
              attention: KeptAttention = True, edit: Edit | None = None, units: bool = False) -> Trace:
        """One forward pass that returns every attention map, block output and stage feature map.

        With grad=True the graph is kept, so `torch.autograd.grad(logit, trace.attentions)` works.
        decompose=True: each block also keeps how its heads write (`BlockTrace.parts`). attention=False: no
        attention maps (`attn` None) and the fused attention kernel, for work that reads only the tokens (CKA).
        attention=slice(...): the maps of those blocks only (indices of `trace.blocks`), and with grad=True the
        graph from the first of them on (`models.trace.graph_start`).
        edit: `models.trace.Edit`, each block's output tokens replaced before the rest of the forward reads
        them (circuits splice dictionaries in this way).
        units=True: each block also keeps its MLP's hidden units (`BlockTrace.hidden`, for feature pictures).
        """
        kept = kept_blocks(attention, sum(len(stage.blocks) for stage in self.stages))
        graph_from = graph_start(attention, kept)
        blocks, features = [], []
        with torch.set_grad_enabled(grad):
            if grad and not graph_from:
                pixels = graph_pixels(pixels)
            x = pixels
            for i, stage in enumerate(self.stages):
                x, cls = stage(x, trace=blocks, index=i, keep_normed=grad, decompose=decompose, kept=kept,
                               graph_from=graph_from, edit=edit, units=units)
                features.append(x)
            logits = self.head(self.norm(cls[:, 0]))
        input_size = (pixels.shape[2], pixels.shape[3])
        return Trace(logits=logits, blocks=blocks, embeddings=self.embeddings(input_size), features=features,
                     input_size=input_size, pixels=pixels if grad and not graph_from else None)


# transformers' CvtForImageClassification names -> ours, applied in order
_TRANSFORMERS_RENAMES = [
    (r"^cvt\.encoder\.stages\.(\d+)\.embedding\.convolution_embeddings\.projection\.", r"stages.\1.patch_embed.proj."),
    (r"^cvt\.encoder\.stages\.(\d+)\.embedding\.convolution_embeddings\.normalization\.",
     r"stages.\1.patch_embed.norm."),
    (r"^cvt\.encoder\.stages\.(\d+)\.cls_token$", r"stages.\1.cls_token"),
    (r"^cvt\.encoder\.stages\.(\d+)\.layers\.", r"stages.\1.blocks."),
    (r"\.attention\.attention\.convolution_projection_(query|key|value)\.convolution_projection\.convolution\.",
     r".attn.conv_\1.conv."),
    (r"\.attention\.attention\.convolution_projection_(query|key|value)\.convolution_projection\.normalization\.",
     r".attn.conv_\1.bn."),
    (r"\.attention\.attention\.projection_(query|key|value)\.", r".attn.\1."),
    (r"\.attention\.output\.dense\.", r".attn.proj."),
    (r"\.intermediate\.dense\.", r".mlp.fc1."),
    (r"\.output\.dense\.", r".mlp.fc2."),
    (r"\.layernorm_before\.", r".norm1."),
    (r"\.layernorm_after\.", r".norm2."),
    (r"conv_query\.", r"conv_q."), (r"conv_key\.", r"conv_k."), (r"conv_value\.", r"conv_v."),
    (r"attn\.query\.", r"attn.q."), (r"attn\.key\.", r"attn.k."), (r"attn\.value\.", r"attn.v."),
    (r"^layernorm\.", r"norm."),
    (r"^classifier\.", r"head."),
]


def convert_transformers_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """`CvtForImageClassification.state_dict()` -> a `CvT` state dict (BatchNorm's counters dropped)."""
    return renamed_state_dict(state_dict, _TRANSFORMERS_RENAMES)
