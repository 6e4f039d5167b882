"""A checkpoint's own preprocessing: resize, centre crop, normalise; and the way back to image pixels.

One `Transform` describes both timm's eval pipeline (resize the shorter side to
floor(size / crop_pct), bicubic, centre crop) and the CvT image processor (shorter side to 256 then
crop 224; a plain resize to 384x384 at 384), so every view can invert exactly what the model saw.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


@dataclass(frozen=True)
class Transform:
    crop: tuple[int, int]             # (h, w) the model sees
    resize: int | tuple[int, int]     # int: shorter side to this many px; (h, w): exact size (no crop margin)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"

    def __post_init__(self):
        object.__setattr__(self, "crop", tuple(self.crop))
        object.__setattr__(self, "resize", self.resize if isinstance(self.resize, int) else tuple(self.resize))
        object.__setattr__(self, "mean", tuple(self.mean))
        object.__setattr__(self, "std", tuple(self.std))
        if self.interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {sorted(_RESAMPLE)}, not {self.interpolation!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def resized_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """(h, w) of an image of `size` (h, w) after the resize step (torchvision's rounding)."""
        if not isinstance(self.resize, int):
            return self.resize
        h, w = size
        short, long = (h, w) if h <= w else (w, h)
        new_short, new_long = self.resize, int(self.resize * long / short)
        return (new_short, new_long) if h <= w else (new_long, new_short)

    def crop_box(self, size: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the centre crop inside the resized image."""
        rh, rw = self.resized_size(size)
        ch, cw = self.crop
        return int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0)), ch, cw

    def normalize(self, rgb: Tensor) -> Tensor:
        """b 3 h w floats in [0, 1] -> normalised pixels."""
        mean = torch.tensor(self.mean, dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1)
        return (rgb - mean) / std

    def __call__(self, image: Image.Image) -> Tensor:
        """RGB PIL image -> 1 3 h w pixel batch."""
        top, left, ch, cw = self.crop_box((image.height, image.width))
        rh, rw = self.resized_size((image.height, image.width))
        image = image.convert("RGB").resize((rw, rh), _RESAMPLE[self.interpolation])
        image = image.crop((left, top, left + cw, top + ch))
        rgb = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
        return self.normalize(rgb)
