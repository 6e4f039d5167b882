"""open_clip's Hub layout (`push_to_hf_hub`): open_clip_config.json (`model_cfg`, `preprocess_cfg`) and
open_clip_model.safetensors (or open_clip_pytorch_model.bin). Read first wherever config.json names a CLIP
model or is absent: only open_clip's files have the text tower (timm's CLIP repos ship both layouts)."""
from __future__ import annotations

import torch

from ..models.clip import CLIP, CLIPConfig, convert_open_clip_state_dict
from ..preprocess import Tokenizer, Transform
from .files import OPEN_CLIP_CONFIG, OPEN_CLIP_PICKLED, OPEN_CLIP_SAFETENSORS, Files, HubFiles
from .layout import build, unsupported
from .loaded import LoadedModel, LoadError


def may_have(config: dict | None) -> bool:
    """Whether to ask for open_clip's files: config.json is absent or names a CLIP model (no extra request else)."""
    return config is None or config.get("model_type") == "clip" or "clip" in str(config.get("architecture", ""))


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """An open_clip checkpoint as a `LoadedModel`: its image tower classifies once `with_prompts` gives it
    texts; `LoadError` for a model or preprocessing vitviz cannot build."""
    model_cfg = config.get("model_cfg", config)
    if "quick_gelu" not in model_cfg and isinstance(files, HubFiles):
        model_cfg = {**model_cfg, "quick_gelu": registry_quick_gelu(files.repo_id)}
    try:
        clip_config = CLIPConfig.from_open_clip(model_cfg)
    except (TypeError, ValueError) as e:
        raise unsupported(files.name, f"an open_clip model vitviz cannot build ({e})") from None
    size = clip_config.vision.img_size
    try:
        if size[0] != size[1]:
            raise ValueError(f"a {size[0]}x{size[1]} input is not square")
        transform = Transform.from_open_clip(config.get("preprocess_cfg") or {}, size[0])
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its preprocessing is not supported ({e}).") from None
    weights, weights_file = files.weights(OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED)
    clip = build(CLIP, clip_config, convert_open_clip_state_dict(weights), device, files, weights_file,
                 config_file=OPEN_CLIP_CONFIG)
    return clip_model(files, clip, transform, "open_clip", weights_file)


def registry_quick_gelu(repo_id: str) -> bool:
    """Whether open_clip's pretrained registry trains the weights in `repo_id` with QuickGELU (OpenAI's, as
    `create_model('ViT-B-16', pretrained='openai')` reads it), for an open_clip_config.json that does not say."""
    import open_clip

    tags = [open_clip.get_pretrained_cfg(*pair) for pair in open_clip.list_pretrained()]
    return any(tag.get("hf_hub", "").rstrip("/") == repo_id and tag.get("quick_gelu", False) for tag in tags)


def clip_model(files: Files, clip: CLIP, transform: Transform, layout: str, weights_file: str) -> LoadedModel:
    """A CLIP model before any prompt: its image tower, without a classifier (like DINO) until `with_prompts`."""
    return LoadedModel(files.name, clip.visual, "vit", (), transform, files.source(layout, weights_file),
                       takes_prompts=True, clip=clip, tokenizer=Tokenizer(clip.config.text.context_length))
