"""transformers' `CLIPModel` layout: config.json (`model_type: "clip"`), preprocessor_config.json, its
tokenizer's vocab.json and merges.txt (checked to be CLIP's, which open_clip's tokenizer then reproduces),
model.safetensors."""
from __future__ import annotations

import torch

from ..models.clip import CLIP, CLIPConfig, convert_transformers_state_dict
from ..preprocess import Tokenizer, Transform
from .files import CLIP_MERGES, CLIP_VOCAB, CONFIG, PROCESSOR, Files
from .layout import build
from .loaded import LoadedModel, LoadError
from .openclip import clip_model

MODEL_TYPE = "clip"


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A transformers `CLIPModel` checkpoint as a `LoadedModel` that takes prompts; `LoadError` for a
    config, preprocessing or tokenizer vitviz cannot use."""
    try:
        clip_config = CLIPConfig.from_transformers(config)
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its CLIP {CONFIG} is not one vitviz can build ({e!r}).") from None
    try:
        transform = Transform.from_clip_processor(files.json(PROCESSOR, optional=True) or {})
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its {PROCESSOR} is not supported ({e}).") from None
    merges = [line for line in files.get(CLIP_MERGES).read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    if not Tokenizer(clip_config.text.context_length).has_vocabulary(files.json(CLIP_VOCAB), merges):
        raise LoadError(f"{files.name!r}: its tokenizer ({CLIP_VOCAB}, {CLIP_MERGES}) is not CLIP's byte-pair "
                        f"vocabulary, the one vitviz tokenizes with.")
    weights, weights_file = files.weights()
    clip = build(CLIP, clip_config, convert_transformers_state_dict(weights), device, files, weights_file)
    return clip_model(files, clip, transform, "transformers", weights_file)
