"""timm's Swin Transformers (`SwinTransformer`: swin_{tiny,small,base}_patch4_window7_224,
swin_base_patch4_window12_384), in timm's names; the original Microsoft checkpoints' layout (patch merging
at the end of a stage, `head.weight`) is moved as timm's `checkpoint_filter_fn` moves it."""
from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from ..models import Swin, SwinConfig
from ..models.swin import LN_EPS
from .layout import same_shapes, unsupported

MODULES = ("timm.models.swin_transformer",)
FAMILY, MODEL = "swin", Swin


def converted(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm's state dict, less the index buffers; Microsoft's own layout moved to timm's first."""
    original = "layers.0.downsample.reduction.weight" in weights
    out = {}
    for key, value in weights.items():
        if key.endswith(("relative_position_index", "attn_mask")):
            continue
        if original:
            key = re.sub(r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) + 1}.downsample", key)
            key = re.sub(r"^head\.(weight|bias)$", r"head.fc.\1", key)
        out[key] = value
    return out


def config_of(reference: nn.Module, name: str) -> SwinConfig:
    """Our SwinConfig for timm's model, or a LoadError naming every part our Swin doesn't have."""
    from timm.layers import Mlp
    from timm.layers.activations import GELU as TimmGELU
    from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock

    r = reference
    blocks = [block for stage in getattr(r, "layers", []) for block in stage.blocks]
    proj = getattr(getattr(r, "patch_embed", None), "proj", None)
    windows = {tuple(b.window_size) for b in blocks}
    checks = {
        f"a {type(r).__name__}": type(r) is SwinTransformer,
        f"global_pool {getattr(r, 'global_pool', None)!r}": getattr(r, "global_pool", None) == "avg",
        "a patch embedding other than one square conv": isinstance(proj, nn.Conv2d) and proj.kernel_size == proj.stride
        and proj.kernel_size[0] == proj.kernel_size[1],
        "blocks other than timm's SwinTransformerBlock": bool(blocks) and all(type(b) is SwinTransformerBlock
                                                                              for b in blocks),
        "windows that are not square": all(w[0] == w[1] for w in windows),
        "windows that always partition (always_partition)": not any(getattr(b, "always_partition", False)
                                                                    for b in blocks),
        "an MLP other than fc1, exact GELU, fc2": all(type(b.mlp) is Mlp and isinstance(b.mlp.act, (nn.GELU, TimmGELU))
                                                       and getattr(b.mlp.act, "approximate", "none") == "none"
                                                       for b in blocks),
        f"norms other than LayerNorm(eps={LN_EPS})": all(isinstance(m, nn.LayerNorm) and m.eps == LN_EPS
                                                         for m in r.modules() if "Norm" in type(m).__name__),
    }
    missing = [what for what, ok in checks.items() if not ok]
    if missing:
        raise unsupported(name, f"a timm model with {', '.join(missing)}")
    config = SwinConfig(
        img_size=tuple(r.patch_embed.img_size), patch_size=proj.kernel_size[0], in_chans=proj.in_channels,
        num_classes=r.num_classes, embed_dim=r.embed_dim, depths=tuple(len(stage.blocks) for stage in r.layers),
        num_heads=tuple(stage.blocks[0].attn.num_heads for stage in r.layers),
        window_size=max(w[0] for w in windows),   # the largest: a stage no larger than its window shrinks it
        mlp_ratio=blocks[0].mlp.fc1.out_features / r.embed_dim, qkv_bias=blocks[0].attn.qkv.bias is not None)
    if config.stage_windows != tuple(stage.blocks[0].window_size[0] for stage in r.layers):
        raise unsupported(name, "a timm Swin whose stages' windows follow another rule than the grid's")
    with torch.device("meta"):
        same_shapes(Swin(config), r, name, "Swin")
    return config
