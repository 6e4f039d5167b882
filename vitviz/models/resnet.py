"""Residual networks (He et al. 2016): the convolutional baseline the vision transformers are measured against.

A stem (ImageNet: 7x7 stride-2 convolution, BatchNorm, ReLU, 3x3 stride-2 max pool; CIFAR: one 3x3
convolution at stride 1, no pool), then stages of residual blocks whose first block may halve the grid
(stride 2, the shortcut a 1x1 stride-2 convolution + BatchNorm), global average pooling and a linear
classifier. A basic block is two 3x3 convolutions; a bottleneck block is 1x1 (reduce), 3x3 (with the
stride), 1x1 (expand 4x). A ReLU follows every addition, so the residual stream is not a sum of the
blocks' outputs (no direct logit attribution).

Parameter names are timm's (`conv1`, `bn1`, `layer1.0.conv1`, `layer2.0.downsample.0`, `fc`), which are
torchvision's too, so a timm or torchvision `ResNet` state dict loads 1:1; `convert_transformers_state_dict`
maps `ResNetForImageClassification` onto them. The trace has no attention: per block its output on its
stage's grid, and per stage the window that made the grid (the stem's composed convolution and pool,
then each stride-2 block's 3x3 convolution).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .layers import renamed_state_dict
from .relevance import GammaLinear, RelevanceRules, conv_bn, norm_mean, norm_sum, relu
from .trace import BlockTrace, Edit, Embedding, KeptAttention, Trace, Window, edited_map, graph_pixels

BLOCKS = ("basic", "bottleneck")


@dataclass(frozen=True)
class ResNetConfig:
    """A ResNet's architecture: block kind (basic or bottleneck), blocks and widths per stage, and
    the stem (ImageNet's 7x7 with max pool or CIFAR's 3x3)."""
    block: str = "bottleneck"                   # 'basic' (ResNet-18/34, CIFAR) or 'bottleneck' (ResNet-50 on)
    layers: tuple[int, ...] = (3, 4, 6, 3)      # blocks per stage
    widths: tuple[int, ...] = (64, 128, 256, 512)   # the 3x3 convolutions' channels per stage
    stem_width: int = 64
    stem_kernel: int = 7                        # 7: ImageNet's stride-2 stem with max pool; 3: CIFAR's, stride 1
    in_chans: int = 3
    num_classes: int = 1000

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "widths", tuple(self.widths))
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, not {self.block!r}")
        if len(self.layers) != len(self.widths):
            raise ValueError(f"{len(self.layers)} stage depths but {len(self.widths)} widths")
        if self.stem_kernel not in (3, 7):
            raise ValueError(f"stem_kernel must be 7 (ImageNet) or 3 (CIFAR), not {self.stem_kernel}")

    @property
    def expansion(self) -> int:
        return 4 if self.block == "bottleneck" else 1

    @property
    def stem(self) -> Window:
        """The stem as one window on the pixels: 7x7/2 convolution then 3x3/2 max pool compose to 11x11 at
        stride 4, padding 5; CIFAR's 3x3/1 convolution is itself."""
        return Window(11, 4, 5) if self.stem_kernel == 7 else Window(3, 1, 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, hf: dict) -> "ResNetConfig":
        """A transformers `ResNetConfig` (config.json of microsoft/resnet-*) -> ResNetConfig."""
        if hf.get("downsample_in_first_stage") or hf.get("downsample_in_bottleneck"):
            raise ValueError("only the stride in the 3x3 convolution, from the second stage on, is supported")
        if hf.get("hidden_act", "relu") != "relu":
            raise ValueError("only ReLU is supported")
        block = hf.get("layer_type", "bottleneck")
        expansion = 4 if block == "bottleneck" else 1
        num_classes = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)   # transformers' default
        return cls(block=block, layers=tuple(hf.get("depths", (3, 4, 6, 3))),
                   widths=tuple(n // expansion for n in hf.get("hidden_sizes", (256, 512, 1024, 2048))),
                   stem_width=hf.get("embedding_size", 64), stem_kernel=7, in_chans=hf.get("num_channels", 3),
                   num_classes=num_classes)


def conv_and_norm(in_chans: int, out_chans: int, *, kernel: int, stride: int = 1) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    """A bias-free convolution padded to keep the grid (at stride 1) and the BatchNorm after it."""
    return (nn.Conv2d(in_chans, out_chans, kernel_size=kernel, stride=stride, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(out_chans))


class BasicBlock(nn.Module):
    """ResNet-18/34's block: two 3x3 convolutions added to the shortcut, then ReLU."""
    def __init__(self, *, in_chans: int, width: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = conv_and_norm(in_chans, width, kernel=3, stride=stride)
        self.conv2, self.bn2 = conv_and_norm(width, width, kernel=3)
        self.downsample = nn.Sequential(*conv_and_norm(in_chans, width, kernel=1, stride=stride)) \
            if stride != 1 or in_chans != width else None

    def residual(self, x: Tensor) -> Tensor:
        return conv_bn(relu(conv_bn(x, self.conv1, self.bn1)), self.conv2, self.bn2)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else conv_bn(x, *self.downsample)
        return relu(norm_sum(self.residual(x), shortcut))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1, 3x3 and 1x1 convolutions (four times as wide out) added to the
    shortcut, then ReLU."""
    def __init__(self, *, in_chans: int, width: int, stride: int):
        super().__init__()
        out = width * 4
        self.conv1, self.bn1 = conv_and_norm(in_chans, width, kernel=1)
        self.conv2, self.bn2 = conv_and_norm(width, width, kernel=3, stride=stride)
        self.conv3, self.bn3 = conv_and_norm(width, out, kernel=1)
        self.downsample = nn.Sequential(*conv_and_norm(in_chans, out, kernel=1, stride=stride)) \
            if stride != 1 or in_chans != out else None

    def residual(self, x: Tensor) -> Tensor:
        x = relu(conv_bn(x, self.conv1, self.bn1))
        x = relu(conv_bn(x, self.conv2, self.bn2))
        return conv_bn(x, self.conv3, self.bn3)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else conv_bn(x, *self.downsample)
        return relu(norm_sum(self.residual(x), shortcut))


class ResNet(nn.Module):
    """Residual network: the stem, stages of residual blocks, the mean over the grid and the
    classifier; `model.trace(pixels)` returns each block's output as tokens on its grid."""
    # LRP as zennit computes a ResNet (EpsilonPlusFlat with its ResNet canonizer; `relevance.py`)
    relevance_rules = RelevanceRules(gamma_linear=0.0, conv="zplus", first_conv="flat")

    def __init__(self, config: ResNetConfig):
        super().__init__()
        c = self.config = config
        self.conv1, self.bn1 = conv_and_norm(c.in_chans, c.stem_width, kernel=c.stem_kernel,
                                       stride=2 if c.stem_kernel == 7 else 1)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if c.stem_kernel == 7 else nn.Identity()
        block = BasicBlock if c.block == "basic" else Bottleneck
        chans = c.stem_width
        for i, (depth, width) in enumerate(zip(c.layers, c.widths)):
            stage = []
            for j in range(depth):
                stage.append(block(in_chans=chans, width=width, stride=2 if i > 0 and j == 0 else 1))
                chans = width * c.expansion
            self.add_module(f"layer{i + 1}", nn.Sequential(*stage))
        self.num_features = chans
        self.fc = GammaLinear(chans, c.num_classes)
        if not self.fc.weight.is_meta:   # built on the meta device to be loaded: nothing to draw
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            for m in self.modules():   # timm's zero_init_last: each block starts as its shortcut
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_((m.bn3 if isinstance(m, Bottleneck) else m.bn2).weight)

    @property
    def stages(self) -> list[nn.Sequential]:
        return [getattr(self, f"layer{i + 1}") for i in range(len(self.config.layers))]

    def stem(self, pixels: Tensor) -> Tensor:
        return self.maxpool(relu(conv_bn(pixels, self.conv1, self.bn1, first=True)))

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        """The stem, then each stage's stride-2 first block (its 3x3 convolution's window), for `input_size`."""
        out, grid = [], tuple(input_size)
        for i in range(len(self.config.layers)):
            window = self.config.stem if i == 0 else Window(3, 2, 1)
            new = tuple((n + 2 * window.padding - window.kernel) // window.stride + 1 for n in grid)
            out.append(Embedding(window, grid, new))
            grid = new
        return out

    def head_logits(self, x: Tensor) -> Tensor:
        """b n c last-stage tokens -> logits (their mean through the classifier); there is no final norm."""
        return self.fc(x.mean(dim=1))

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        return self.head_logits(tokens)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.stem(pixels)
        for stage in self.stages:
            x = stage(x)
        return self.fc(norm_mean(x))

    def forward_from(self, index: int, tokens: Tensor, grid: tuple[int, int], *,
                     attn_delta: Tensor | None = None) -> Tensor:
        """The stream entering block `index` of `trace.blocks` (b n c on its stage's `grid`) -> logits, for
        activation patching; index = the number of blocks: the classifier alone. There is no attention, so no
        `attn_delta`."""
        if attn_delta is not None:
            raise ValueError("a ResNet has no attention, so there is no attention output to patch")
        x = rearrange(tokens, 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        blocks = [block for stage in self.stages for block in stage]
        for block in blocks[index:]:
            x = block(x)
        return self.fc(norm_mean(x))

    def trace(self, pixels: Tensor, *, grad: bool = False, decompose: bool = False,
              attention: KeptAttention = True, edit: Edit | None = None, units: bool = False) -> Trace:
        """One forward pass that returns every block's output on its grid and each stage's feature map.
        `attention`, `decompose` and `units` are accepted for the methods' sake: a ResNet has no attention and no
        MLP (`BlockTrace.hidden` stays None; a block's output channels are its units).
        edit: `models.trace.Edit`, each block's output tokens replaced before the rest of the forward reads
        them (circuits splice dictionaries in this way).
        """
        blocks, features = [], []
        with torch.set_grad_enabled(grad):
            if grad:
                pixels = graph_pixels(pixels)
            x = self.stem(pixels)
            for s, stage in enumerate(self.stages):
                for block in stage:
                    inputs, input_grid = rearrange(x, 'b c h w -> b (h w) c'), (x.shape[2], x.shape[3])
                    x = edited_map(edit, len(blocks), block(x))
                    grid = (x.shape[2], x.shape[3])
                    blocks.append(BlockTrace(attn=None, tokens=rearrange(x, 'b c h w -> b (h w) c'), stage=s,
                                             query_grid=grid, key_grid=grid, key_window=Window(1, 1, 0),
                                             prefix_kinds=(), inputs=inputs, attends=False,
                                             input_grid=None if input_grid == grid else input_grid))
                features.append(x)
            pooled = blocks[-1].tokens.mean(dim=1)   # from the tokens the trace keeps: Grad-CAM's layer
            logits = self.fc(pooled)
        input_size = (pixels.shape[2], pixels.shape[3])
        return Trace(logits=logits, blocks=blocks, embeddings=self.embeddings(input_size), features=features,
                     input_size=input_size, pooled=pooled, pixels=pixels if grad else None, residual_stream=False)


# transformers' ResNetForImageClassification names -> ours, applied in order
_TRANSFORMERS_RENAMES = [
    (r"^resnet\.embedder\.embedder\.convolution\.", "conv1."),
    (r"^resnet\.embedder\.embedder\.normalization\.", "bn1."),
    (r"^resnet\.encoder\.stages\.(\d+)\.layers\.(\d+)\.", lambda m: f"layer{int(m.group(1)) + 1}.{m.group(2)}."),
    (r"\.shortcut\.convolution\.", ".downsample.0."),
    (r"\.shortcut\.normalization\.", ".downsample.1."),
    (r"\.layer\.(\d)\.convolution\.", lambda m: f".conv{int(m.group(1)) + 1}."),
    (r"\.layer\.(\d)\.normalization\.", lambda m: f".bn{int(m.group(1)) + 1}."),
    (r"^classifier\.1\.", "fc."),
]


def convert_transformers_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """`ResNetForImageClassification.state_dict()` -> a `ResNet` state dict (BatchNorm's counters dropped)."""
    return renamed_state_dict(state_dict, _TRANSFORMERS_RENAMES)
