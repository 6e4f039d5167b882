"""transformers' `CvtForImageClassification` layout (microsoft/cvt-*): config.json (`model_type: "cvt"`),
preprocessor_config.json (a ConvNextImageProcessor) and its weights."""
from __future__ import annotations

import torch
from PIL import Image

from ..models import CvT, CvTConfig
from ..models.cvt import convert_transformers_state_dict
from ..preprocess import IMAGENET_MEAN, IMAGENET_STD, Transform
from .files import Files
from .layout import transformers_model
from .loaded import LoadedModel

MODEL_TYPE = "cvt"
# CvT's own evaluation preprocessing (the paper, Microsoft's code), for a CvT repo that has no
# preprocessor_config.json: transformers' processor defaults (384 px, mean/std 0.5) would be wrong
EVAL_PROCESSOR = {"size": {"shortest_edge": 224}, "crop_pct": 224 / 256, "resample": int(Image.BICUBIC),
                  "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD}


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A transformers `CvtForImageClassification` checkpoint as a `LoadedModel`, its weights
    renamed to vitviz's, its preprocessing from preprocessor_config.json (or the processor's defaults)."""
    return transformers_model(files, config, device, family="cvt", model_cls=CvT,
                              from_config=CvTConfig.from_transformers, convert=convert_transformers_state_dict,
                              default_processor=EVAL_PROCESSOR, transform=Transform.from_convnext_processor,
                              resized=convnext_processor_at)


def convnext_processor_at(processor: dict, size: int) -> dict:
    """A ConvNextImageProcessor config at another input size (the same crop_pct)."""
    return {**processor, "size": {"shortest_edge": size}}
