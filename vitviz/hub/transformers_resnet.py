"""transformers' `ResNetForImageClassification` layout (microsoft/resnet-*): config.json (`model_type:
"resnet"`), preprocessor_config.json (a ConvNextImageProcessor) and its weights."""
from __future__ import annotations

import torch

from ..models import ResNet, ResNetConfig
from ..models.resnet import convert_transformers_state_dict
from ..preprocess import Transform
from .files import Files
from .layout import transformers_model
from .loaded import LoadedModel
from .transformers_cvt import EVAL_PROCESSOR, convnext_processor_at

MODEL_TYPE = "resnet"


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A transformers `ResNetForImageClassification` checkpoint as a `LoadedModel`, its weights
    renamed to vitviz's, its preprocessing from preprocessor_config.json (or the processor's defaults)."""
    return transformers_model(files, config, device, family="resnet", model_cls=ResNet,
                              from_config=ResNetConfig.from_transformers, convert=convert_transformers_state_dict,
                              default_processor=EVAL_PROCESSOR, transform=Transform.from_convnext_processor,
                              resized=convnext_processor_at)
