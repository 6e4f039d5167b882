"""A timm ViT's weights in torchvision's `VisionTransformer`: the model torchcam's LeGrad and lxt's
AttnLRP are written for, so the tests and the benchmark can run them on vitviz's weights.

torchvision's ViT is the class-token ViT of the paper: square images, a qkv bias, LayerNorm eps
1e-6, exact GELU, the final norm on every token, the head on the class token. The names map 1:1
(timm's fused `qkv` is `in_proj_weight` with the same q, k, v order); a timm model with anything
torchvision lacks is refused, naming it.
"""
from __future__ import annotations

from torch import nn
from torchvision.models.vision_transformer import VisionTransformer


def timm_to_torchvision(timm_vit: nn.Module) -> VisionTransformer:
    """torchvision's VisionTransformer (eval mode) computing the same logits as `timm_vit`, any depth, width,
    patch and (square) image size."""
    blocks = list(timm_vit.blocks)
    image, patch = timm_vit.patch_embed.img_size, timm_vit.patch_embed.patch_size
    unsupported = {
        "a non-square image size": image[0] != image[1],
        "a non-square patch": patch[0] != patch[1],
        "prefix tokens other than one class token": timm_vit.cls_token is None or timm_vit.num_prefix_tokens != 1,
        f"global_pool {timm_vit.global_pool!r}": timm_vit.global_pool != "token",
        "an fc_norm": not isinstance(timm_vit.fc_norm, nn.Identity),
        "LayerScale": not isinstance(blocks[0].ls1, nn.Identity),
        "no qkv bias": blocks[0].attn.qkv.bias is None,
        "position embeddings outside the class token": timm_vit.no_embed_class,
        "a norm before the blocks": not isinstance(timm_vit.norm_pre, nn.Identity),
        "q/k norms": not isinstance(blocks[0].attn.q_norm, nn.Identity),
        "LayerNorms with eps other than 1e-6": any(isinstance(m, nn.LayerNorm) and m.eps != 1e-6
                                                   for m in timm_vit.modules()),
    }
    if problems := [what for what, present in unsupported.items() if present]:
        raise ValueError(f"torchvision's VisionTransformer has no equivalent of this timm model's "
                         f"{', '.join(problems)}")
    model = VisionTransformer(image_size=image[0], patch_size=patch[0], num_layers=len(blocks),
                              num_heads=blocks[0].attn.num_heads, hidden_dim=timm_vit.embed_dim,
                              mlp_dim=blocks[0].mlp.fc1.out_features, num_classes=timm_vit.num_classes)
    source = timm_vit.state_dict()
    state = {"class_token": source["cls_token"], "encoder.pos_embedding": source["pos_embed"]}
    for kind in ("weight", "bias"):
        state |= {f"conv_proj.{kind}": source[f"patch_embed.proj.{kind}"],
                  f"encoder.ln.{kind}": source[f"norm.{kind}"], f"heads.head.{kind}": source[f"head.{kind}"]}
        for i in range(len(blocks)):
            layer, block = f"encoder.layers.encoder_layer_{i}.", f"blocks.{i}."   # torchvision's, timm's
            state |= {f"{layer}ln_1.{kind}": source[f"{block}norm1.{kind}"],
                      f"{layer}self_attention.in_proj_{kind}": source[f"{block}attn.qkv.{kind}"],
                      f"{layer}self_attention.out_proj.{kind}": source[f"{block}attn.proj.{kind}"],
                      f"{layer}ln_2.{kind}": source[f"{block}norm2.{kind}"],
                      f"{layer}mlp.0.{kind}": source[f"{block}mlp.fc1.{kind}"],
                      f"{layer}mlp.3.{kind}": source[f"{block}mlp.fc2.{kind}"]}
    model.load_state_dict(state)   # strict: a name this mapping misses fails here
    return model.eval()
