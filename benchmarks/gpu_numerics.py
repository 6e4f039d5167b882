"""The GPU path is right: vitviz's models against timm / transformers on a CUDA device, in float32
and under bf16 autocast (what the app runs there), and the explanation maps against the CPU's.

    python -m pytest benchmarks/gpu_numerics.py -q          (benchmarks/gpu_check.sh runs it)

Skipped without CUDA. `VITVIZ_NUMERICS_DEVICE=cpu` runs the same comparisons with the CPU standing
in for the GPU (bf16 autocast on the CPU), which checks this file and calibrated the bf16 bounds.
References are ViT-B/16 (timm) and CvT-13 (transformers) with every weight perturbed, as in
tests/test_models.py. The stated tolerances:

- float32 on the device (TF32 off): logits within 1e-4 of the reference's there, relative to the
  largest logit; every attention map within 1e-4 of our CPU trace's; every map of `explain.METHODS`
  (rollout, gradient rollout, Chefer, LeGrad, Grad-CAM, AttnLRP) within 1e-3 of the CPU's, relative to
  the map's largest magnitude.
- bf16 autocast: logits within 3% of the float32 reference's largest logit, and the same top-1 class
  where float32's top-2 gap exceeds twice that bound (two logits may each move by it; in a closer race,
  bf16's top-1 is a class float32 scores within that gap of its best);
  attention probabilities within 0.03; the rollout map the app draws within 2% of the CPU's float32
  map (relative to its maximum) and ranked alike (Spearman >= 0.99). bf16 autocast on the CPU gives
  0.7-0.9%, 0.009, 0.3% and 0.9999 for these models: the bounds leave room for other kernels.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from test_models import CVT_STD, VIT_STD, cvt_pair, perturb_, vit_config_of  # noqa: E402
from vitviz import session  # noqa: E402
from vitviz.explain import METHODS  # noqa: E402
from vitviz.hub import LoadedModel, Source  # noqa: E402
from vitviz.models import ViT, load_weights  # noqa: E402
from vitviz.preprocess import Transform  # noqa: E402
from workbench import CVT_13_PROCESSOR  # noqa: E402

DEVICE = torch.device(os.environ.get("VITVIZ_NUMERICS_DEVICE", "cuda"))
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
FP32_LOGITS, FP32_ATTN, FP32_MAP = 1e-4, 1e-4, 1e-3
BF16_LOGITS, BF16_ATTN, BF16_MAP, BF16_SPEARMAN = 0.03, 0.03, 0.02, 0.99

pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(autouse=True)
def no_tf32():
    """float32 means float32: TF32 matmuls and convolutions would round to 10 mantissa bits."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@functools.cache
def models(family: str):
    """(reference on the CPU, ours on the CPU, the transform) with the same perturbed weights."""
    torch.manual_seed(0)
    if family == "vit":
        import timm
        reference = perturb_(timm.create_model("vit_base_patch16_224", pretrained=False), std=VIT_STD)
        ours = ViT(vit_config_of(reference)).eval()
        load_weights(ours, reference.state_dict())
        return reference, ours, Transform.from_timm(reference.pretrained_cfg)
    from transformers import CvtConfig, CvtForImageClassification
    reference = perturb_(CvtForImageClassification(CvtConfig(num_labels=1000)), std=CVT_STD)
    return reference, cvt_pair(reference), Transform.from_convnext_processor(CVT_13_PROCESSOR)


def on(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy on `device` (the CPU originals stay the references)."""
    import copy
    return copy.deepcopy(module).to(device)


def logits_of(reference, pixels):
    out = reference(pixels) if not hasattr(reference, "cvt") else reference(pixel_values=pixels)
    return getattr(out, "logits", out)


def loaded(family: str, device: torch.device) -> LoadedModel:
    _, ours, transform = models(family)
    return LoadedModel(f"{family}-perturbed", on(ours, device), family, tuple(f"class {i}" for i in range(1000)),
                       transform, Source("folder", "-", "timm" if family == "vit" else "transformers", "-"))


def on_host(x) -> torch.Tensor:
    """A float32 CPU tensor of an array or a tensor on any device (numpy cannot read a CUDA tensor)."""
    return x.detach().float().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(x).float()


def relative_error(actual, expected) -> float:
    actual, expected = on_host(actual), on_host(expected)
    scale = expected.abs().max()   # 0 for a map that is 0 everywhere (Grad-CAM's ReLU can leave nothing)
    return ((actual - expected).abs().max() / (scale if scale > 0 else 1)).item()


def spearman(a, b) -> float:
    ranks = [np.argsort(np.argsort(on_host(x).numpy().ravel())) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


@pytest.fixture(scope="module")
def image() -> Image.Image:
    return Image.open(PHOTO).convert("RGB")


@pytest.mark.parametrize("family", ["vit", "cvt"])
def test_logits_and_attention_match_the_reference_and_the_cpu_in_float32_on_the_device(family, image):
    reference, ours, transform = models(family)
    pixels = transform(image)
    with torch.inference_mode():
        theirs = logits_of(on(reference, DEVICE), pixels.to(DEVICE))
        mine = on(ours, DEVICE)
        cpu_trace, trace = ours.trace(pixels), mine.trace(pixels.to(DEVICE))
        assert relative_error(mine(pixels.to(DEVICE)), theirs) <= FP32_LOGITS
        assert relative_error(trace.logits, theirs) <= FP32_LOGITS
    for i, (a, b) in enumerate(zip(trace.attentions, cpu_trace.attentions)):
        error = (a.cpu() - b).abs().max().item()
        assert error <= FP32_ATTN, f"block {i}: attention differs from the CPU's by {error:.3g}"


@pytest.mark.parametrize("family", ["vit", "cvt"])
def test_bf16_autocast_logits_and_attention_stay_close_to_float32(family, image):
    reference, ours, transform = models(family)
    pixels = transform(image).to(DEVICE)
    mine = on(ours, DEVICE)
    with torch.inference_mode():
        exact = logits_of(on(reference, DEVICE), pixels).float()
        exact_trace = mine.trace(pixels)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            fast, trace = mine(pixels).float(), mine.trace(pixels)
    error = relative_error(fast, exact)
    assert error <= BF16_LOGITS, f"bf16 logits off by {error:.3g} of the largest logit"
    top2 = exact[0].topk(2).values
    # each of two logits may move by the bound, so bf16 can swap two classes closer than twice the bound
    gap, reach = (top2[0] - top2[1]).item(), 2 * BF16_LOGITS * exact.abs().max().item()
    if gap > reach:
        assert fast.argmax() == exact.argmax(), f"bf16 changed the top-1 class (float32 top-2 gap {gap:.3g})"
    else:   # a near tie may flip: then bf16's top-1 must be a class float32 scores within that reach of its best
        behind = top2[0].item() - exact[0, fast.argmax()].item()
        assert behind <= reach, f"bf16's top-1 is {behind:.3g} behind float32's, beyond bf16's reach {reach:.3g}"
    for i, (a, b) in enumerate(zip(trace.attentions, exact_trace.attentions)):
        error = (a.float() - b).abs().max().item()
        assert error <= BF16_ATTN, f"block {i}: bf16 attention off by {error:.3g}"


@pytest.mark.parametrize("family", ["vit", "cvt"])
def test_the_apps_bf16_rollout_on_the_device_agrees_with_the_cpus_float32_map(family, image, monkeypatch):
    cpu_map = session.ModelRun(loaded(family, torch.device("cpu")), image).token_map("rollout")   # float32
    if DEVICE.type == "cpu":   # the CPU stands in for the GPU: the session's bf16 autocast made explicit
        monkeypatch.setattr(session, "autocast", lambda device: torch.autocast("cpu", dtype=torch.bfloat16))
    on_device = session.ModelRun(loaded(family, DEVICE), image).token_map("rollout")
    assert on_device.dtype == np.float32 and on_device.shape == cpu_map.shape
    assert relative_error(on_device, cpu_map) <= BF16_MAP
    assert spearman(on_device, cpu_map) >= BF16_SPEARMAN


@pytest.mark.parametrize("family", ["vit", "cvt"])
@pytest.mark.parametrize("method", list(METHODS))
def test_float32_maps_on_the_device_equal_the_cpus(family, method, image, monkeypatch):
    monkeypatch.setattr(session, "autocast", lambda device: torch.autocast(device.type, enabled=False))
    on_device = session.ModelRun(loaded(family, DEVICE), image).token_map(method)
    on_cpu = session.ModelRun(loaded(family, torch.device("cpu")), image).token_map(method)
    error = relative_error(on_device, on_cpu)
    assert error <= FP32_MAP, f"{method}: the device's map is off by {error:.3g} of its maximum"
