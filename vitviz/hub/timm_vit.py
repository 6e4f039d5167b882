"""timm's ViTs (`VisionTransformer`, DeiT's `VisionTransformerDistilled`): plain ViT, DeiT, DINO, DINOv2 with
and without registers, CLIP's image tower (read through open_clip's files where a repo has them)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import ViT, ViTConfig
from ..models.vit import LN_EPS as VIT_LN_EPS
from .layout import same_shapes, unsupported

MODULES = ("timm.models.vision_transformer", "timm.models.deit")
FAMILY, MODEL = "vit", ViT
# only whether a timm ViT has LayerScale shows in its modules; the checkpoint's gammas replace this value
LAYER_SCALE_PRESENT = 1e-5


def converted(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm's state dict as vitviz's model takes it: unchanged."""
    return weights   # timm's names are vitviz's


def config_of(reference: nn.Module, name: str) -> ViTConfig:
    """Our ViTConfig for timm's model, or a LoadError naming every part our ViT doesn't have."""
    from timm.layers import LayerScale, Mlp
    from timm.layers.activations import GELU as TimmGELU
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Block, VisionTransformer

    r, blocks = reference, list(getattr(reference, "blocks", []))
    patch = getattr(r, "patch_embed", None)
    proj = getattr(patch, "proj", None)
    checks = {
        f"a {type(r).__name__}": type(r) in (VisionTransformer, VisionTransformerDistilled),
        f"global_pool {getattr(r, 'global_pool', None)!r}": getattr(r, "global_pool", None) in ("token", "avg"),
        "a classifier other than one linear layer": isinstance(getattr(r, "head", None), nn.Linear)
        or (getattr(r, "num_classes", None) == 0 and isinstance(getattr(r, "head", None), nn.Identity)),
        "no learned position embedding": getattr(r, "pos_embed", None) is not None,
        "a patch embedding other than one conv": isinstance(proj, nn.Conv2d) and proj.kernel_size == proj.stride
        and proj.kernel_size[0] == proj.kernel_size[1] and not getattr(patch, "dynamic_img_pad", False),
        "no blocks, or blocks other than timm's plain Block": bool(blocks) and all(type(b) is Block for b in blocks),
        "an MLP other than fc1, exact GELU, fc2": all(type(b.mlp) is Mlp and isinstance(b.mlp.act, (nn.GELU, TimmGELU))
                                                       and getattr(b.mlp.act, "approximate", "none") == "none"
                                                       for b in blocks),
        f"norms other than LayerNorm(eps={VIT_LN_EPS})": all(isinstance(m, nn.LayerNorm) and m.eps == VIT_LN_EPS
                                                             for m in r.modules() if "Norm" in type(m).__name__),
    }
    missing = [what for what, ok in checks.items() if not ok]
    if missing:
        raise unsupported(name, f"a timm model with {', '.join(missing)}")
    config = ViTConfig(
        img_size=tuple(patch.img_size), patch_size=proj.kernel_size[0], in_chans=proj.in_channels,
        num_classes=r.num_classes, embed_dim=r.embed_dim, depth=len(blocks), num_heads=blocks[0].attn.num_heads,
        mlp_ratio=blocks[0].mlp.fc1.out_features / r.embed_dim, qkv_bias=blocks[0].attn.qkv.bias is not None,
        class_token=r.cls_token is not None, dist_token=isinstance(r, VisionTransformerDistilled),
        reg_tokens=r.num_reg_tokens, no_embed_class=r.no_embed_class, global_pool=r.global_pool,
        fc_norm=not isinstance(r.fc_norm, nn.Identity),
        init_values=LAYER_SCALE_PRESENT if isinstance(blocks[0].ls1, LayerScale) else None)
    with torch.device("meta"):
        same_shapes(ViT(config), r, name, "ViT")
    return config
