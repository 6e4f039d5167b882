"""ConvNeXt (Liu et al. 2022, "A ConvNet for the 2020s"): a ResNet modernised step by step towards Swin.

A 4x4 stride-4 "patchify" stem (convolution + LayerNorm), four stages joined by a LayerNorm and a 2x2
stride-2 convolution, global average pooling, a LayerNorm and a linear classifier. A block is a 7x7
depthwise convolution (the spatial mixing, Swin's window in a convolution), a LayerNorm, an MLP (c -> 4c,
GELU, 4c -> c) and a learned per-channel scale (layer scale), added to its input: a pure residual
stream, as in a transformer, so every block's update reaches the classifier as a sum.

Parameter names are timm's (`stem.0`, `stages.i.downsample.1`, `stages.i.blocks.j.conv_dw`, `mlp.fc1`,
`gamma`, `head.norm`, `head.fc`), so a timm `ConvNeXt` state dict loads 1:1;
`convert_transformers_state_dict` maps `ConvNextForImageClassification` onto them. The trace has no
attention: per block its output on its stage's grid, per stage the window that made the grid (the
stem's 4x4 patches, then each 2x2 downsampling).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .layers import Mlp
from .relevance import GammaConv2d, GammaLinear, LayerNorm
from .trace import BlockTrace, Edit, Embedding, KeptAttention, Trace, Window, edited_map, graph_pixels

LN_EPS = 1e-6


@dataclass(frozen=True)
class ConvNeXtConfig:
    """A ConvNeXt's architecture: blocks and widths per stage, the patch stem, the depthwise
    kernel, the MLP ratio and layer scale."""
    depths: tuple[int, ...] = (3, 3, 9, 3)
    dims: tuple[int, ...] = (96, 192, 384, 768)
    in_chans: int = 3
    num_classes: int = 1000
    patch_size: int = 4
    kernel_size: int = 7                  # the depthwise convolution's
    mlp_ratio: float = 4.0
    layer_scale: bool = True
    head_norm_eps: float = LN_EPS         # transformers' final LayerNorm takes config.layer_norm_eps (1e-12)

    def __post_init__(self):
        object.__setattr__(self, "depths", tuple(self.depths))
        object.__setattr__(self, "dims", tuple(self.dims))
        if len(self.depths) != len(self.dims):
            raise ValueError(f"{len(self.depths)} stage depths but {len(self.dims)} widths")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, hf: dict) -> "ConvNeXtConfig":
        """A transformers `ConvNextConfig` (config.json of facebook/convnext-*) -> ConvNeXtConfig."""
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError("only GELU is supported")
        num_classes = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)   # transformers' default
        return cls(depths=tuple(hf.get("depths", (3, 3, 9, 3))),
                   dims=tuple(hf.get("hidden_sizes", (96, 192, 384, 768))), in_chans=hf.get("num_channels", 3),
                   num_classes=num_classes, patch_size=hf.get("patch_size", 4),
                   layer_scale=hf.get("layer_scale_init_value", 1e-6) > 0,
                   head_norm_eps=hf.get("layer_norm_eps", 1e-12))


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channels of a b c h w map (timm's `LayerNorm2d`)."""

    def forward(self, x: Tensor) -> Tensor:
        return rearrange(super().forward(rearrange(x, 'b c h w -> b h w c')), 'b h w c -> b c h w')


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: depthwise convolution, LayerNorm, MLP and layer scale, added to the input."""
    def __init__(self, *, dim: int, kernel_size: int, mlp_ratio: float, layer_scale: bool):
        super().__init__()
        self.conv_dw = GammaConv2d(dim, dim, kernel_size=kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim=dim, hidden_dim=int(mlp_ratio * dim))
        self.gamma = nn.Parameter(torch.ones(dim)) if layer_scale else None

    def forward(self, x: Tensor, units: list[Tensor] | None = None) -> Tensor:
        """b c h w -> b c h w: x plus the block's update; units: where a list is given, its pointwise MLP's hidden
        units (b h w hidden) are appended to it."""
        update = self.mlp(self.norm(rearrange(self.conv_dw(x), 'b c h w -> b h w c')), units)
        if self.gamma is not None:
            update = update * self.gamma
        return x + rearrange(update, 'b h w c -> b c h w')


class ConvNeXtStage(nn.Module):
    """One ConvNeXt stage: a downsampling LayerNorm and 2x2 convolution (not in the first), then its
    blocks."""
    def __init__(self, *, in_dim: int, dim: int, depth: int, downsample: bool, config: ConvNeXtConfig):
        super().__init__()
        self.downsample = nn.Sequential(LayerNorm2d(in_dim, eps=LN_EPS), GammaConv2d(in_dim, dim, kernel_size=2,
                                                                                      stride=2)) \
            if downsample else nn.Identity()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(dim=dim, kernel_size=config.kernel_size, mlp_ratio=config.mlp_ratio,
                                                    layer_scale=config.layer_scale) for _ in range(depth)])


class ClassifierHead(nn.Module):
    """timm's `NormMlpClassifierHead` without its hidden layer: average pool, LayerNorm, linear."""

    def __init__(self, *, dim: int, num_classes: int, eps: float):
        super().__init__()
        self.norm = LayerNorm(dim, eps=eps)
        self.fc = GammaLinear(dim, num_classes)

    def forward(self, pooled: Tensor) -> Tensor:
        return self.fc(self.norm(pooled))


class ConvNeXt(nn.Module):
    """ConvNeXt: the patch stem, its stages, then the mean over the grid, LayerNorm and the
    classifier; `model.trace(pixels)` returns each block's output as tokens on its grid."""
    def __init__(self, config: ConvNeXtConfig):
        super().__init__()
        c = self.config = config
        self.stem = nn.Sequential(GammaConv2d(c.in_chans, c.dims[0], kernel_size=c.patch_size, stride=c.patch_size),
                                  LayerNorm2d(c.dims[0], eps=LN_EPS))
        self.stages = nn.ModuleList([
            ConvNeXtStage(in_dim=c.dims[max(i - 1, 0)], dim=dim, depth=depth, downsample=i > 0, config=c)
            for i, (depth, dim) in enumerate(zip(c.depths, c.dims))])
        self.head = ClassifierHead(dim=c.dims[-1], num_classes=c.num_classes, eps=c.head_norm_eps)
        if not self.head.fc.weight.is_meta:   # built on the meta device to be loaded: nothing to draw
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias) if m.bias is not None else None
                elif isinstance(m, ConvNeXtBlock) and m.gamma is not None:
                    nn.init.constant_(m.gamma, 1e-6)

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        """The stem's patches, then each stage's 2x2 stride-2 downsampling, for pixels of `input_size`."""
        out, grid = [], tuple(input_size)
        for i in range(len(self.stages)):
            window = Window(self.config.patch_size, self.config.patch_size, 0) if i == 0 else Window(2, 2, 0)
            new = tuple((n - window.kernel) // window.stride + 1 for n in grid)
            out.append(Embedding(window, grid, new))
            grid = new
        return out

    def head_logits(self, x: Tensor) -> Tensor:
        """b n c last-stage tokens -> logits: their mean through the head's norm and classifier."""
        return self.head(x.mean(dim=1))

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        return self.head_logits(tokens)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.stem(pixels)
        for stage in self.stages:
            x = stage.blocks(stage.downsample(x))
        return self.head(x.mean(dim=(2, 3)))

    def forward_from(self, index: int, tokens: Tensor, grid: tuple[int, int], *,
                     attn_delta: Tensor | None = None) -> Tensor:
        """The stream entering block `index` of `trace.blocks` (b n c on its stage's `grid`) -> logits, for
        activation patching and the readout of direct logit attribution; index = the number of blocks: the
        classifier alone. There is no attention, so no `attn_delta`."""
        if attn_delta is not None:
            raise ValueError("a ConvNeXt has no attention, so there is no attention output to patch")
        x = rearrange(tokens, 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        first = 0
        for stage in self.stages:
            if first > index:
                x = stage.downsample(x)
            for i, block in enumerate(stage.blocks, start=first):
                if i >= index:
                    x = block(x)
            first += len(stage.blocks)
        return self.head(x.mean(dim=(2, 3)))

    def trace(self, pixels: Tensor, *, grad: bool = False, decompose: bool = False,
              attention: KeptAttention = True, edit: Edit | None = None, units: bool = False) -> Trace:
        """One forward pass that returns every block's output on its grid and each stage's feature map.
        `attention` and `decompose` are accepted for the methods' sake: a block's whole update is its one part.
        edit: `models.trace.Edit`, each block's output tokens replaced before the rest of the forward reads
        them (circuits splice dictionaries in this way).
        units=True: each block also keeps its pointwise MLP's hidden units (`BlockTrace.hidden`, b (h w) hidden).
        """
        blocks, features = [], []
        flat = lambda t: rearrange(t, 'b c h w -> b (h w) c')
        with torch.set_grad_enabled(grad):
            if grad:
                pixels = graph_pixels(pixels)
            x = self.stem(pixels)
            for s, stage in enumerate(self.stages):
                x = stage.downsample(x)
                for block in stage.blocks:
                    inputs, hidden = x, [] if units else None
                    x = edited_map(edit, len(blocks), block(x, hidden))
                    grid = (x.shape[2], x.shape[3])
                    blocks.append(BlockTrace(attn=None, tokens=flat(x), stage=s, query_grid=grid, key_grid=grid,
                                             key_window=Window(1, 1, 0), prefix_kinds=(), inputs=flat(inputs),
                                             attends=False,
                                             hidden=rearrange(hidden[0], 'b h w c -> b (h w) c') if units else None))
                features.append(x)
            pooled = blocks[-1].tokens.mean(dim=1)   # from the tokens the trace keeps: Grad-CAM's layer
            logits = self.head(pooled)
        input_size = (pixels.shape[2], pixels.shape[3])
        return Trace(logits=logits, blocks=blocks, embeddings=self.embeddings(input_size), features=features,
                     input_size=input_size, pooled=pooled, pixels=pixels if grad else None)


# transformers' ConvNextForImageClassification names -> ours, applied in order
_TRANSFORMERS_RENAMES = [
    (r"^convnext\.layernorm\.", "head.norm."),   # before the blocks' own `.layernorm.`
    (r"^convnext\.embeddings\.patch_embeddings\.", "stem.0."),
    (r"^convnext\.embeddings\.layernorm\.", "stem.1."),
    (r"^convnext\.encoder\.stages\.(\d+)\.downsampling_layer\.", r"stages.\1.downsample."),
    (r"^convnext\.encoder\.stages\.(\d+)\.layers\.(\d+)\.", r"stages.\1.blocks.\2."),
    (r"\.dwconv\.", ".conv_dw."),
    (r"\.layernorm\.", ".norm."),
    (r"\.pwconv1\.", ".mlp.fc1."),
    (r"\.pwconv2\.", ".mlp.fc2."),
    (r"\.layer_scale_parameter$", ".gamma"),
    (r"^classifier\.", "head.fc."),
]


def convert_transformers_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """`ConvNextForImageClassification`'s Hub state dict -> a `ConvNeXt` state dict."""
    out = {}
    for key, value in state_dict.items():
        for pattern, repl in _TRANSFORMERS_RENAMES:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out
