"""`Transform.from_timm` and `Transform.from_convnext_processor` give the pixels the checkpoints' own
pipelines give: timm's `create_transform(**resolve_data_config(...))` and transformers' PIL image
processor for CvT, on real photos and on a generated non-square image whose odd crop margins
tell timm's rounding (torchvision's round-half-to-even) from transformers' (floor).

transformers' default `ConvNextImageProcessor` resizes with torchvision's antialiased kernel on
uint8 tensors, which lands one or two 8-bit levels away from PIL on about 1% of the pixels (measured
on the example photos); its PIL backend is the one the CvT checkpoints' `ConvNextFeatureExtractor`
configs were made with, and the one matched exactly. The torchvision backend is held to that bound.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.models import get_pretrained_cfg
from transformers import ConvNextImageProcessor
from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil

from hub_server import cvt_processor_config
from vitviz.preprocess import Transform

EXAMPLES = sorted(Path("/work/shared/examples").glob("*.jpg"))
TOL = 1e-5   # on normalised pixels


def odd_margin_image() -> Image.Image:
    """199x301 (h x w): after timm's resize to 248 and CvT's to 256 the width's crop margins are
    151 and 163, odd, where round-half-to-even and floor disagree by a pixel."""
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((301, 199), Image.BILINEAR)


def images() -> list[Image.Image]:
    assert EXAMPLES, "the example photos are expected in /work/shared/examples"
    return [Image.open(p).convert("RGB") for p in EXAMPLES] + [odd_margin_image()]


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return (a.float() - b.float()).abs().max().item()


TIMM_CFGS = {
    "augreg2 vit-base (crop 0.9, mean 0.5)": get_pretrained_cfg("vit_base_patch16_224.augreg2_in21k_ft_in1k").to_dict(),
    "deit-small (crop 0.9, ImageNet mean)": get_pretrained_cfg("deit_small_patch16_224.fb_in1k").to_dict(),
    "bamboo vit-base (crop 1.0 at 224)": get_pretrained_cfg("vit_base_patch16_224.bamboo").to_dict(),
    "augreg vit-base 384 (crop 1.0 at 384)": get_pretrained_cfg("vit_base_patch16_384.augreg_in21k_ft_in1k").to_dict(),
    "no preprocessing keys (timm's defaults)": {"num_classes": 1000},
}


@pytest.mark.parametrize("cfg", TIMM_CFGS.values(), ids=TIMM_CFGS.keys())
def test_from_timm_equals_timms_create_transform_on_photos_and_an_odd_margin_image(cfg):
    reference = create_transform(**resolve_data_config({}, pretrained_cfg=cfg))
    ours = Transform.from_timm(cfg)
    for image in images():
        assert max_abs(ours(image)[0], reference(image)) <= TOL


def test_from_timm_reads_crop_pct_and_size_as_timm_does():
    assert Transform.from_timm(TIMM_CFGS["augreg2 vit-base (crop 0.9, mean 0.5)"]).resize == 248   # floor(224 / 0.9)
    assert Transform.from_timm(TIMM_CFGS["augreg vit-base 384 (crop 1.0 at 384)"]).resize == 384
    assert Transform.from_timm({}).resize == 256   # timm's DEFAULT_CROP_PCT 0.875


@pytest.mark.parametrize("size", [224, 384])
def test_from_convnext_processor_equals_transformers_pil_processor_on_photos_and_an_odd_margin_image(size):
    config = cvt_processor_config(size)
    reference = ConvNextImageProcessorPil.from_dict(config)
    ours = Transform.from_convnext_processor(config)
    for image in images():
        expected = reference(image, return_tensors="pt")["pixel_values"][0]
        assert max_abs(ours(image)[0], expected) <= TOL


def test_cvt_224_resizes_to_256_and_crops_while_384_resizes_plainly():
    assert Transform.from_convnext_processor(cvt_processor_config(224)).resize == 256
    at_384 = Transform.from_convnext_processor(cvt_processor_config(384))
    assert at_384.resize == (384, 384) and at_384.crop == (384, 384)


@pytest.mark.parametrize("size", [224, 384])
def test_from_convnext_processor_is_within_two_8bit_levels_on_few_pixels_of_transformers_torchvision_processor(size):
    config = cvt_processor_config(size)
    reference = ConvNextImageProcessor.from_dict(config)   # AutoImageProcessor's default backend
    ours = Transform.from_convnext_processor(config)
    std = torch.tensor(config["image_std"]).view(3, 1, 1)
    for image in images():
        expected = reference(image, return_tensors="pt")["pixel_values"][0]
        levels = ((ours(image)[0] - expected) * std * 255).abs()   # back to 8-bit steps
        assert levels.max() <= 2 + 1e-3 and (levels > 0.5).float().mean() <= 0.02


def test_crop_rounding_matters_on_the_odd_margin_image_so_the_comparisons_can_tell():
    image = odd_margin_image()
    timm_cfg = TIMM_CFGS["augreg2 vit-base (crop 0.9, mean 0.5)"]
    timm_reference = create_transform(**resolve_data_config({}, pretrained_cfg=timm_cfg))(image)
    as_floor = Transform(**{**Transform.from_timm(timm_cfg).to_dict(), "crop_rounding": "floor"})
    assert max_abs(as_floor(image)[0], timm_reference) > 0.1
    config = cvt_processor_config(224)
    cvt_reference = ConvNextImageProcessorPil.from_dict(config)(image, return_tensors="pt")["pixel_values"][0]
    as_round = Transform(**{**Transform.from_convnext_processor(config).to_dict(), "crop_rounding": "round"})
    assert max_abs(as_round(image)[0], cvt_reference) > 0.1


def test_transform_round_trips_through_its_dict_and_reads_dicts_saved_before_crop_rounding():
    t = Transform.from_convnext_processor(cvt_processor_config(224))
    assert Transform(**t.to_dict()) == t
    old = {"crop": [32, 32], "resize": 32, "mean": [0.5] * 3, "std": [0.25] * 3, "interpolation": "bicubic"}
    assert Transform(**old).crop_rounding == "round"


@pytest.mark.parametrize("cfg, problem", [
    ({"input_size": (3, 224, 256)}, "square"),
    ({"crop_mode": "squash"}, "center"),
    ({"crop_pct": 1.2}, "at least the crop"),
    ({"interpolation": "lanczos"}, "interpolation"),
])
def test_from_timm_refuses_what_it_cannot_reproduce(cfg, problem):
    with pytest.raises(ValueError, match=problem):
        Transform.from_timm(cfg)


@pytest.mark.parametrize("change, problem", [
    ({"do_center_crop": True}, "do_center_crop"),
    ({"do_normalize": False}, "do_normalize"),
    ({"rescale_factor": 1.0}, "rescale_factor"),
    ({"size": {"height": 224, "width": 224}}, "size"),
    ({"resample": 1}, "resample"),
    ({"image_processor_type": "ViTImageProcessor"}, "ConvNextImageProcessor"),
])
def test_from_convnext_processor_refuses_what_it_cannot_reproduce(change, problem):
    with pytest.raises(ValueError, match=problem):
        Transform.from_convnext_processor({**cvt_processor_config(224), **change})
