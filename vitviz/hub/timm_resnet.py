"""timm's ResNets (`ResNet` with `BasicBlock` or `Bottleneck`: resnet18, resnet50 and the like, the plain
7x7 stem with max pool), whose names are torchvision's too."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import ResNet, ResNetConfig
from .layout import same_shapes, unsupported

MODULES = ("timm.models.resnet",)
FAMILY, MODEL = "resnet", ResNet


def converted(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm's state dict as vitviz's model takes it: unchanged."""
    return weights   # timm's names are vitviz's


def config_of(reference: nn.Module, name: str) -> ResNetConfig:
    """Our ResNetConfig for timm's model, or a LoadError naming every part our ResNet doesn't have."""
    from timm.models.resnet import BasicBlock, Bottleneck, ResNet as TimmResNet

    r = reference
    stages = [getattr(r, f"layer{i}", None) for i in range(1, 5)]
    stages = [s for s in stages if s is not None]
    blocks = [b for s in stages for b in s]
    conv1 = getattr(r, "conv1", None)
    kinds = {type(b) for b in blocks}
    checks = {
        f"a {type(r).__name__}": type(r) is TimmResNet,
        "a stem other than one 7x7 stride-2 convolution and a max pool": isinstance(conv1, nn.Conv2d)
        and conv1.kernel_size == (7, 7) and conv1.stride == (2, 2) and isinstance(getattr(r, "maxpool", None),
                                                                                 nn.MaxPool2d),
        "blocks other than basic or bottleneck": kinds in ({BasicBlock}, {Bottleneck}),
        "squeeze-excitation, anti-aliasing, attention or drop-block parts": all(
            getattr(b, "se", None) is None and isinstance(getattr(b, "aa", nn.Identity()), nn.Identity)
            and isinstance(getattr(b, "drop_block", nn.Identity()), nn.Identity) for b in blocks),
        "a shortcut other than a 1x1 convolution and BatchNorm": all(
            b.downsample is None or (len(b.downsample) == 2 and isinstance(b.downsample[0], nn.Conv2d)
                                     and b.downsample[0].kernel_size == (1, 1)) for b in blocks),
        "grouped or widened bottlenecks (ResNeXt, wide ResNets)": all(
            getattr(b, "conv2", None) is not None and b.conv2.groups == 1 for b in blocks),
        f"global_pool {getattr(getattr(r, 'global_pool', None), 'pool_type', None)!r}":
            getattr(getattr(r, "global_pool", None), "pool_type", None) == "avg",
    }
    missing = [what for what, ok in checks.items() if not ok]
    if missing:
        raise unsupported(name, f"a timm model with {', '.join(missing)}")
    bottleneck = Bottleneck in kinds
    config = ResNetConfig(block="bottleneck" if bottleneck else "basic", layers=tuple(len(s) for s in stages),
                          widths=tuple(s[0].conv2.out_channels if bottleneck else s[0].conv1.out_channels
                                       for s in stages),
                          stem_width=conv1.out_channels, stem_kernel=7, in_chans=conv1.in_channels,
                          num_classes=r.num_classes)
    if bottleneck and any(s[0].conv3.out_channels != 4 * s[0].conv2.out_channels for s in stages):
        raise unsupported(name, "a timm ResNet whose bottlenecks do not expand 4x")
    with torch.device("meta"):
        same_shapes(ResNet(config), r, name, "ResNet")
    return config
