"""transformers' `SwinForImageClassification` layout (microsoft/swin-*): config.json (`model_type: "swin"`),
preprocessor_config.json (a ViTImageProcessor: a plain resize, no crop) and its weights, with the patch
merging at the end of stages 1-3 and q, k and v apart (`models.swin.convert_transformers_state_dict`)."""
from __future__ import annotations

import torch

from ..models import Swin, SwinConfig
from ..models.swin import convert_transformers_state_dict
from ..preprocess import Transform
from .files import Files
from .layout import transformers_model
from .loaded import LoadedModel

MODEL_TYPE = "swin"


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A transformers `SwinForImageClassification` checkpoint as a `LoadedModel`, its weights
    renamed to vitviz's, its preprocessing from preprocessor_config.json (or the processor's defaults)."""
    size = config.get("image_size", 224)
    return transformers_model(files, config, device, family="swin", model_cls=Swin,
                              from_config=SwinConfig.from_transformers, convert=convert_transformers_state_dict,
                              default_processor={"size": size}, transform=Transform.from_vit_processor,
                              resized=vit_processor_at)


def vit_processor_at(processor: dict, size: int) -> dict:
    """A ViTImageProcessor config at another input size (resized straight to it, no crop)."""
    return {**processor, "size": {"height": size, "width": size}}
