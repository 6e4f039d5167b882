"""transformers' `ConvNextForImageClassification` layout (facebook/convnext-*): config.json (`model_type:
"convnext"`), preprocessor_config.json (a ConvNextImageProcessor) and its weights."""
from __future__ import annotations

import torch

from ..models import ConvNeXt, ConvNeXtConfig
from ..models.convnext import convert_transformers_state_dict
from ..preprocess import Transform
from .files import Files
from .layout import transformers_model
from .loaded import LoadedModel
from .transformers_cvt import EVAL_PROCESSOR, convnext_processor_at

MODEL_TYPE = "convnext"


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A transformers `ConvNextForImageClassification` checkpoint as a `LoadedModel`, its weights
    renamed to vitviz's, its preprocessing from preprocessor_config.json (or the processor's defaults)."""
    return transformers_model(files, config, device, family="convnext", model_cls=ConvNeXt,
                              from_config=ConvNeXtConfig.from_transformers, convert=convert_transformers_state_dict,
                              default_processor=EVAL_PROCESSOR, transform=Transform.from_convnext_processor,
                              resized=convnext_processor_at)
