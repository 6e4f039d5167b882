"""timm's ConvNeXts (`ConvNeXt`: convnext_tiny, convnext_small, convnext_base; the patch stem, LayerNorm
blocks with layer scale, the norm-then-linear head)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import ConvNeXt, ConvNeXtConfig
from ..models.convnext import LN_EPS
from .layout import same_shapes, unsupported

MODULES = ("timm.models.convnext",)
FAMILY, MODEL = "convnext", ConvNeXt


def converted(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm's state dict as vitviz's model takes it: unchanged."""
    return weights   # timm's names are vitviz's


def config_of(reference: nn.Module, name: str) -> ConvNeXtConfig:
    """Our ConvNeXtConfig for timm's model, or a LoadError naming every part our ConvNeXt doesn't have."""
    from timm.layers import Mlp
    from timm.layers.activations import GELU as TimmGELU
    from timm.models.convnext import ConvNeXt as TimmConvNeXt, ConvNeXtBlock

    r = reference
    stages = list(getattr(r, "stages", []))
    blocks = [b for s in stages for b in s.blocks]
    stem = getattr(r, "stem", None)
    head = getattr(r, "head", None)
    checks = {
        f"a {type(r).__name__}": type(r) is TimmConvNeXt,
        "a stem other than one patchify convolution and a LayerNorm": isinstance(stem, nn.Sequential) and len(stem) == 2
        and isinstance(stem[0], nn.Conv2d) and stem[0].kernel_size == stem[0].stride,
        "blocks other than timm's ConvNeXtBlock with a linear MLP": bool(blocks) and all(
            type(b) is ConvNeXtBlock and not b.use_conv_mlp and type(b.mlp) is Mlp for b in blocks),
        "an MLP other than fc1, exact GELU, fc2 (ConvNeXt-V2's GRN)": all(
            isinstance(b.mlp.act, (nn.GELU, TimmGELU))
            and getattr(b.mlp.act, "approximate", "none") == "none" for b in blocks),
        "dilated or strided blocks": all(isinstance(b.shortcut, nn.Identity) for b in blocks),
        "a head other than pool, LayerNorm, linear": type(getattr(r, "norm_pre", None)) is nn.Identity
        and isinstance(getattr(head, "pre_logits", None), nn.Identity) and isinstance(getattr(head, "fc", None),
                                                                                    nn.Linear),
        f"norms other than LayerNorm(eps={LN_EPS})": all(m.eps == LN_EPS for m in r.modules()
                                                         if "Norm" in type(m).__name__ and hasattr(m, "eps")),
    }
    missing = [what for what, ok in checks.items() if not ok]
    if missing:
        raise unsupported(name, f"a timm model with {', '.join(missing)}")
    config = ConvNeXtConfig(depths=tuple(len(s.blocks) for s in stages),
                            dims=tuple(s.blocks[0].conv_dw.out_channels for s in stages), in_chans=stem[0].in_channels,
                            num_classes=r.num_classes, patch_size=stem[0].kernel_size[0],
                            kernel_size=blocks[0].conv_dw.kernel_size[0],
                            mlp_ratio=blocks[0].mlp.fc1.out_features / blocks[0].mlp.fc1.in_features,
                            layer_scale=blocks[0].gamma is not None)
    with torch.device("meta"):
        same_shapes(ConvNeXt(config), r, name, "ConvNeXt")
    return config
