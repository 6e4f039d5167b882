"""CLIP (Radford et al. 2021): the text tower, the projections into the joint space, and the zero-shot head.

The image tower is `vit.py`'s ViT with CLIP's options (a LayerNorm before the blocks, eps 1e-5, no
patch bias, QuickGELU for OpenAI's weights), headless: its output is the final norm of the class
token (open_clip's `ln_post`). This file has the rest:

    image features   visual_proj(ViT(pixels))                                      open_clip `encode_image`
    text features    ids b n -> token_embedding + pos_embed -> causal blocks -> norm
                     -> the end-of-text token's row -> proj                        open_clip `encode_text`
    zero-shot logit  exp(logit_scale) cos(image features, text features of prompt p)   `logits_per_image`

Both towers use timm's names (`blocks.i.norm1`, `attn.qkv`, `attn.proj`, `mlp.fc1`, `norm`, ...), so
they read alike; `convert_open_clip_state_dict` and `convert_transformers_state_dict` are the one
place where open_clip's and transformers' names are adapted (for the image tower, the swaps of
timm's `checkpoint_filter_fn`). Text features are not normalised, as `encode_text` returns them.

With prompts CLIP *is* a classifier. `CLIP.zero_shot(text_features)` returns the image tower with
`ZeroShotHead` as its head: a ViT (weights shared, nothing copied) whose logits are the scaled
cosines over the prompts, so every explanation method, which reads a ViT's logits and its
`pooled_logits`, explains one prompt unchanged. LeGrad's per-layer score `pooled_logits` becomes
the LeGrad authors' CLIP score (legrad_torch's `compute_legrad_clip`): the mean of the layer's tokens
through ln_post and the projection, its cosine to the prompt, here times exp(logit_scale), a
positive constant that the ReLU and the min-max normalisation of the map cancel.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .relevance import GammaLinear
from .vit import Mlp, ViT, ViTConfig

LN_EPS = 1e-5              # open_clip's and transformers' LayerNorms (torch's default)
LOGIT_SCALE = math.log(1 / 0.07)   # CLIP's initial temperature; every checkpoint stores its own


@dataclass(frozen=True)
class TextConfig:
    """CLIP's text tower: context length, vocabulary, width, heads, layers and activation."""
    context_length: int = 77
    vocab_size: int = 49408
    width: int = 512
    heads: int = 8
    layers: int = 12
    mlp_ratio: float = 4.0
    act: str = "gelu"          # 'quick_gelu' for OpenAI's weights
    ln_eps: float = LN_EPS
    # pooled at the first token with this id; None: at the largest id (open_clip's 'argmax': CLIP's
    # end-of-text token, 49407, is its vocabulary's last)
    eos_id: int | None = None


@dataclass(frozen=True)
class CLIPConfig:
    """A CLIP model: its image tower (a headless ViT), its text tower and the joint space's width."""
    vision: ViTConfig          # the image tower, headless (num_classes 0)
    text: TextConfig
    embed_dim: int = 512       # the joint space

    def __post_init__(self):
        if self.vision.num_classes:
            raise ValueError("CLIP's image tower is headless (num_classes 0): its projection is `visual_proj`")

    @classmethod
    def from_open_clip(cls, model_cfg: dict) -> CLIPConfig:
        """From open_clip's `model_cfg` (open_clip_config.json's, or a `model_configs/*.json`); a ValueError
        names every option vitviz's CLIP does not have."""
        vision, text = dict(model_cfg.get("vision_cfg") or {}), dict(model_cfg.get("text_cfg") or {})
        unsupported = [f"{where}{key}={value!r}" for where, cfg, known in (
            ("", model_cfg, {"embed_dim", "quick_gelu", "vision_cfg", "text_cfg"}),
            ("vision_cfg.", vision, {"image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio"}),
            ("text_cfg.", text, {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}))
            for key, value in cfg.items() if key not in known and value not in _OPEN_CLIP_NEUTRAL.get(key, ())]
        if not isinstance(vision.get("layers", 12), int):
            unsupported.append("vision_cfg.layers as a ResNet's stages")
        if unsupported:
            raise ValueError(f"unsupported open_clip options: {', '.join(unsupported)}")
        act = "quick_gelu" if model_cfg.get("quick_gelu") else "gelu"
        size = vision.get("image_size", 224)
        width = vision.get("width", 768)
        return cls(
            vision=ViTConfig(img_size=(size, size) if isinstance(size, int) else tuple(size),
                             patch_size=vision.get("patch_size", 16), num_classes=0, embed_dim=width,
                             depth=vision.get("layers", 12), num_heads=width // vision.get("head_width", 64),
                             mlp_ratio=vision.get("mlp_ratio", 4.0), pre_norm=True, act=act, ln_eps=LN_EPS),
            text=TextConfig(context_length=text.get("context_length", 77), vocab_size=text.get("vocab_size", 49408),
                            width=text.get("width", 512), heads=text.get("heads", 8), layers=text.get("layers", 12),
                            mlp_ratio=text.get("mlp_ratio", 4.0), act=act),
            embed_dim=model_cfg.get("embed_dim", 512))

    @classmethod
    def from_transformers(cls, config: dict) -> CLIPConfig:
        """From a transformers `CLIPConfig` as config.json stores it (keys it leaves out take the config
        classes' defaults, as transformers does)."""
        vision = {**_TRANSFORMERS_VISION, **(config.get("vision_config") or {})}
        text = {**_TRANSFORMERS_TEXT, **(config.get("text_config") or {})}
        acts = {vision["hidden_act"], text["hidden_act"]}
        if not acts <= {"gelu", "quick_gelu"}:
            raise ValueError(f"unsupported activation {sorted(acts - {'gelu', 'quick_gelu'})}")
        size = vision["image_size"]
        return cls(
            vision=ViTConfig(img_size=(size, size) if isinstance(size, int) else tuple(size),
                             patch_size=vision["patch_size"], num_classes=0, embed_dim=vision["hidden_size"],
                             depth=vision["num_hidden_layers"], num_heads=vision["num_attention_heads"],
                             mlp_ratio=vision["intermediate_size"] / vision["hidden_size"], pre_norm=True,
                             act=vision["hidden_act"], ln_eps=vision["layer_norm_eps"]),
            text=TextConfig(context_length=text["max_position_embeddings"], vocab_size=text["vocab_size"],
                            width=text["hidden_size"], heads=text["num_attention_heads"],
                            layers=text["num_hidden_layers"], mlp_ratio=text["intermediate_size"] / text["hidden_size"],
                            act=text["hidden_act"], ln_eps=text["layer_norm_eps"],
                            # transformers pools at argmax for configs saved before its PR #24773 (eos id 2)
                            eos_id=None if text["eos_token_id"] == 2 else text["eos_token_id"]),
            embed_dim=config.get("projection_dim", 512))


# open_clip options at the values that leave the model as this file builds it
_OPEN_CLIP_NEUTRAL = {
    "ls_init_value": (None,), "patch_dropout": (0, 0.0), "attentional_pool": (False,), "no_ln_pre": (False,),
    "pos_embed_type": ("learnable",), "final_ln_after_pool": (False,), "pool_type": ("tok", "argmax"),
    "output_tokens": (False,), "act_kwargs": (None, {}), "norm_kwargs": (None, {}), "block_type": (None, "default"),
    "qk_norm": (False,), "scaled_cosine_attn": (False,), "scale_heads": (False,), "scale_attn_inner": (False,),
    "scale_attn": (False,), "scale_fc": (False,), "timm_model_name": (None, ""), "hf_model_name": (None, ""),
    "hf_tokenizer_name": (None, ""), "tokenizer_mode": (None,), "tokenizer_kwargs": (None, {}),
    "embed_cls": (False,), "pad_id": (0,), "no_causal_mask": (False,), "proj_bias": (False,),
    "proj_type": ("linear",), "custom_text": (False,), "init_logit_bias": (None,), "nonscalar_logit_scale": (False,),
}
# transformers' CLIPVisionConfig and CLIPTextConfig defaults
_TRANSFORMERS_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                        "num_attention_heads": 12, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu",
                        "layer_norm_eps": 1e-5}
_TRANSFORMERS_TEXT = {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                      "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
                      "layer_norm_eps": 1e-5, "eos_token_id": 49407}


class CausalAttention(nn.Module):
    """Multi-head self-attention in which token i reads tokens 0 to i only."""
    def __init__(self, *, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = rearrange(self.qkv(x), 'b n (three h d) -> three b h n d', three=3, h=self.heads)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # token i reads tokens 0..i
        return self.proj(rearrange(out, 'b h n d -> b n (h d)'))


class TextBlock(nn.Module):
    """A pre-norm transformer block of the text tower, with causal attention."""
    def __init__(self, *, dim: int, heads: int, mlp_ratio: float, act: str, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = CausalAttention(dim=dim, heads=heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim=dim, hidden_dim=int(dim * mlp_ratio), act=act)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TextTransformer(nn.Module):
    """CLIP's text tower: token and position embeddings, causal blocks, the final norm and the
    projection into the joint space, read at the end-of-text token."""
    def __init__(self, config: TextConfig, *, embed_dim: int):
        super().__init__()
        c = self.config = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.width)
        self.pos_embed = nn.Parameter(torch.randn(1, c.context_length, c.width) * 0.01)
        self.blocks = nn.ModuleList([TextBlock(dim=c.width, heads=c.heads, mlp_ratio=c.mlp_ratio, act=c.act,
                                               eps=c.ln_eps) for _ in range(c.layers)])
        self.norm = nn.LayerNorm(c.width, eps=c.ln_eps)
        self.proj = nn.Linear(c.width, embed_dim, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        """b n token ids -> b embed_dim text features (unnormalised, as open_clip's `encode_text`)."""
        end = ids.argmax(dim=-1) if self.config.eos_id is None else (ids == self.config.eos_id).int().argmax(dim=-1)
        # causal attention: the end-of-text token reads only the tokens before it, so the padding after the
        # longest text is never computed ("a photo of a dog": 7 of 77 positions)
        ids = ids[:, :int(end.max()) + 1]
        x = self.token_embedding(ids) + self.pos_embed[:, :ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.proj(self.norm(x[torch.arange(x.shape[0], device=x.device), end]))


class ZeroShotHead(nn.Module):
    """Pre-logits b c -> b prompts: exp(logit_scale) cos(proj(x), text features), CLIP's `logits_per_image`."""

    def __init__(self, proj: nn.Linear, text_features: Tensor, logit_scale: Tensor):
        super().__init__()
        self.proj = proj   # the CLIP model's own `visual_proj`, shared
        self.register_buffer("prompts", F.normalize(text_features.detach(), dim=-1), persistent=False)
        self.register_buffer("scale", logit_scale.detach().exp(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * F.normalize(self.proj(x), dim=-1) @ self.prompts.T


class CLIP(nn.Module):
    """CLIP: both towers and their projections into the joint space; `zero_shot` makes the image tower a
    classifier over prompts."""
    def __init__(self, config: CLIPConfig):
        super().__init__()
        c = self.config = config
        self.visual = ViT(c.vision)
        self.visual_proj = GammaLinear(c.vision.embed_dim, c.embed_dim, bias=False)
        self.text = TextTransformer(c.text, embed_dim=c.embed_dim)
        self.logit_scale = nn.Parameter(torch.tensor(LOGIT_SCALE))

    def image_features(self, pixels: Tensor) -> Tensor:
        """b 3 h w -> b embed_dim, unnormalised (open_clip's `encode_image`)."""
        return self.visual_proj(self.visual(pixels))

    def text_features(self, ids: Tensor) -> Tensor:
        """b n token ids -> b embed_dim, unnormalised (open_clip's `encode_text`)."""
        return self.text(ids)

    def forward(self, pixels: Tensor, ids: Tensor) -> Tensor:
        """-> b_images b_texts: exp(logit_scale) times the cosines (open_clip's `get_logits`, image side)."""
        image, text = (F.normalize(f, dim=-1) for f in (self.image_features(pixels), self.text_features(ids)))
        return self.logit_scale.exp() * image @ text.T

    def zero_shot(self, text_features: Tensor) -> ViT:
        """The image tower as a classifier over prompts with these p c text features: the same modules and
        weights, its head a `ZeroShotHead`."""
        if not len(text_features):
            raise ValueError("a zero-shot classifier needs at least one prompt")
        classifier = copy.copy(self.visual)
        classifier._modules = dict(self.visual._modules)   # its own module table (a new head), the same modules
        classifier.config = replace(self.visual.config, num_classes=len(text_features))
        classifier.head = ZeroShotHead(self.visual_proj, text_features, self.logit_scale)
        return classifier


# ---- foreign state dicts --------------------------------------------------------------------------------

_OPEN_CLIP_BLOCK = [("ln_1", "norm1"), ("ln_2", "norm2"), ("attn.in_proj_", "attn.qkv."),
                    ("attn.out_proj", "attn.proj"), ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]
_OPEN_CLIP_TOP = {"conv1": "patch_embed.proj", "ln_pre": "norm_pre", "ln_post": "norm", "ln_final": "norm",
                  "class_embedding": "cls_token", "positional_embedding": "pos_embed"}
_TRANSFORMERS_BLOCK = [("layer_norm1", "norm1"), ("layer_norm2", "norm2"), ("self_attn.out_proj", "attn.proj")]
_TRANSFORMERS_TOP = {"embeddings.class_embedding": "cls_token", "embeddings.patch_embedding": "patch_embed.proj",
                     "embeddings.position_embedding.weight": "pos_embed",
                     "embeddings.token_embedding": "token_embedding", "pre_layrnorm": "norm_pre",
                     "post_layernorm": "norm", "final_layer_norm": "norm"}


def _renamed(key: str, names: dict[str, str]) -> str:
    """`key` with its leading dotted part renamed by `names`, if one is there."""
    for theirs, ours in names.items():
        if key == theirs or key.startswith(theirs + "."):
            return ours + key[len(theirs):]
    return key


def convert_open_clip_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """open_clip's CLIP state dict (`CLIP`, built-in text tower) -> `CLIP`'s. Keys it does not know pass
    through renamed as far as they match, so a strict load names them."""
    out = {}
    for key, value in state.items():
        tower, key = ("visual", key[len("visual."):]) if key.startswith("visual.") else ("text", key)
        if key.startswith("transformer.resblocks."):
            key = "blocks." + key[len("transformer.resblocks."):]
            for theirs, ours in _OPEN_CLIP_BLOCK:
                key = key.replace(theirs, ours)
        elif key == "proj":                  # x @ proj: a bias-free linear layer's weight, transposed
            tower, key, value = "visual_proj", "weight", value.T
        elif key == "text_projection":
            key, value = "proj.weight", value.T
        elif key == "logit_scale":
            out[key] = value.reshape(())
            continue
        else:
            key = _renamed(key, _OPEN_CLIP_TOP)
            if key in ("cls_token", "pos_embed"):   # w or n w -> 1 n w
                value = value.reshape(1, -1, value.shape[-1])
        out[f"{tower}.{key}"] = value
    return out


def convert_transformers_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' `CLIPModel` state dict -> `CLIP`'s (q, k and v projections joined into qkv; the
    `position_ids` buffers older checkpoints store dropped)."""
    out, qkv = {}, {}
    for key, value in state.items():
        if key.endswith("position_ids"):
            continue
        if key in ("visual_projection.weight", "text_projection.weight", "logit_scale"):
            out[{"visual_projection.weight": "visual_proj.weight", "text_projection.weight": "text.proj.weight"}
                .get(key, key)] = value
            continue
        tower, key = ("visual" if key.startswith("vision_model.") else "text"), key.split(".", 1)[1]
        if match := re.fullmatch(r"encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", key):
            qkv.setdefault((tower, match[1], match[3]), {})[match[2]] = value
            continue
        if key.startswith("encoder.layers."):
            key = "blocks." + key[len("encoder.layers."):]
            for theirs, ours in _TRANSFORMERS_BLOCK:
                key = key.replace(theirs, ours)
        else:
            key = _renamed(key, _TRANSFORMERS_TOP)
            if key in ("cls_token", "pos_embed"):   # w or n w -> 1 n w
                value = value.reshape(1, -1, value.shape[-1])
        out[f"{tower}.{key}"] = value
    for (tower, block, kind), parts in qkv.items():
        out[f"{tower}.blocks.{block}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out
