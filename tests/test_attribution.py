"""LeGrad and Grad-CAM against their reference packages on the same weights, and, for CvT (which no package
handles), against their formulas written out here; then the randomised-weights check.

References: torchcam 0.5's `LeGrad` on torchvision's ViT holding a perturbed timm ViT's weights
(`torchvision_vit.py`), and grad-cam 1.5.7's `GradCAM` on the timm model itself with its ViT recipe
(target layer `blocks[-1].norm1`, a reshape_transform dropping the prefix tokens).
"""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import scale_cam_image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from torch import nn
from torchcam.methods import LeGrad

from test_explain import block_operator, cvt13_tiny, spearman, tiny_cvt, tiny_vit
from test_models import perturb_, vit_config_of
from torchvision_vit import timm_to_torchvision
from vitviz import explain
from vitviz.models import ViT, load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STD = 0.1   # weight noise: peaked attention and sizeable gradients in a tiny random model
TINY = dict(patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)


def timm_and_ours(name: str, **kwargs) -> tuple[nn.Module, ViT]:
    """A perturbed timm model and vitviz's ViT holding the same weights."""
    torch.manual_seed(0)
    reference = perturb_(timm.create_model(name, pretrained=False, **{**TINY, **kwargs}), std=STD)
    ours = ViT(vit_config_of(reference)).eval()
    load_weights(ours, reference.state_dict())
    return reference, ours


# ---------------------------------------------------------------- the torchvision copy

@pytest.mark.parametrize("geometry", [dict(img_size=32), dict(img_size=48, patch_size=16, embed_dim=48, num_heads=3,
                                                                 depth=2, num_classes=7)])
def test_torchvision_copy_of_a_timm_vit_computes_the_same_logits(geometry):
    reference, _ = timm_and_ours("vit_tiny_patch16_224", **geometry)
    copy = timm_to_torchvision(reference)
    pixels = torch.randn(2, 3, geometry["img_size"], geometry["img_size"])
    with torch.no_grad():
        expected = reference(pixels)
        torch.testing.assert_close(copy(pixels), expected, rtol=0, atol=1e-5)
    assert expected.std() > 0.1   # the perturbed weights give logits far apart, so the comparison can fail


def test_torchvision_copy_refuses_a_timm_model_it_cannot_express():
    reference, _ = timm_and_ours("deit_tiny_distilled_patch16_224", img_size=32)
    with pytest.raises(ValueError, match="prefix tokens other than one class token"):
        timm_to_torchvision(reference)


# ---------------------------------------------------------------- LeGrad

@pytest.mark.parametrize("start_layer", [0, 1, 2])
def test_legrad_equals_torchcam_on_the_same_weights(start_layer):
    reference, ours = timm_and_ours("vit_tiny_patch16_224", img_size=32)
    copy = timm_to_torchvision(reference)
    pixels, target = torch.randn(2, 3, 32, 32), [1, 3]
    with LeGrad(copy, list(copy.encoder.layers)[start_layer:]) as extractor:
        expected = extractor(target, copy(pixels))[0]
    actual = explain.legrad(ours, pixels, torch.tensor(target), start_layer=start_layer)
    assert actual.shape == expected.shape == (2, 4, 4)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)
    assert (expected.flatten(1).std(-1) > 0.1).all()   # a map with structure, not a constant


def test_legrad_and_gradcam_refuse_a_trace_without_gradients():
    model = tiny_vit()
    trace = model.trace(torch.randn(1, 3, 32, 48))
    with pytest.raises(ValueError, match="grad=True"):
        explain.legrad_from_trace(trace, model.pooled_logits)
    with pytest.raises(ValueError, match="grad=True"):
        explain.gradcam_from_trace(trace)


# ---------------------------------------------------------------- Grad-CAM

def prefix_dropped(prefix: int, grid: tuple[int, int]):
    """grad-cam's ViT reshape_transform (its tutorial's), with the prefix token count as a parameter."""
    def reshape_transform(tensor):
        result = tensor[:, prefix:, :].reshape(tensor.size(0), *grid, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)
    return reshape_transform


class GradCAMOnTheGrid(GradCAM):
    """grad-cam's GradCAM stopped at its resize: the layer's map from `compute_cam_per_layer` (ReLU, then
    `scale_cam_image` with the target size set to the token grid itself, where cv2.resize copies), before
    `aggregate_multi_layers` normalises it a second time."""

    def __init__(self, *args, grid: tuple[int, int], **kwargs):
        super().__init__(*args, **kwargs)
        self.grid = grid

    def get_target_width_height(self, input_tensor):
        return self.grid[1], self.grid[0]

    def aggregate_multi_layers(self, cam_per_target_layer):
        (layer,) = cam_per_target_layer   # b 1 h w: the one target layer
        return layer[:, 0]


@pytest.mark.parametrize("name, prefix", [("vit_tiny_patch16_224", 1), ("deit_tiny_distilled_patch16_224", 2)])
def test_gradcam_equals_grad_cam_on_the_timm_model_at_the_grid_and_after_its_resize(name, prefix):
    reference, ours = timm_and_ours(name, img_size=(32, 48))
    pixels, target = torch.randn(2, 3, 32, 48), [4, 0]
    targets = [ClassifierOutputTarget(t) for t in target]
    layers, reshape = [reference.blocks[-1].norm1], prefix_dropped(prefix, (4, 6))
    with GradCAMOnTheGrid(reference, layers, reshape_transform=reshape, grid=(4, 6)) as cam:
        on_grid = cam(pixels, targets)
    with GradCAM(reference, layers, reshape_transform=reshape) as cam:
        resized = cam(pixels, targets)
    actual = explain.gradcam(ours, pixels, torch.tensor(target))
    assert actual.shape == on_grid.shape == (2, 4, 6) and resized.shape == (2, 32, 48)
    np.testing.assert_allclose(actual.numpy(), on_grid, rtol=0, atol=1e-5)
    # grad-cam's own resize and normalisation (BaseCAM.compute_cam_per_layer, then aggregate_multi_layers)
    np.testing.assert_allclose(scale_cam_image(scale_cam_image(actual.numpy(), (48, 32))), resized, rtol=0, atol=1e-5)
    assert (on_grid.reshape(2, -1).std(-1) > 0.1).all()


# ---------------------------------------------------------------- CvT, where no package exists

@pytest.mark.parametrize("size", [224, 384])
def test_cvt13_geometry_legrad_and_gradcam_are_on_the_stage3_grid(size):
    model = cvt13_tiny()
    trace = model.trace(torch.randn(1, 3, size, size), grad=True)
    g3 = size // 16
    for cam in (explain.legrad_from_trace(trace, model.pooled_logits), explain.gradcam_from_trace(trace)):
        assert cam.shape == (1, g3, g3) and torch.isfinite(cam).all()
        assert cam.min() == 0 and 0 < cam.max() <= 1   # (the eps keeps a near-zero map below 1)


def legrad_formula(model, pixels, target: list[int], start_layer: int) -> np.ndarray:
    """Per last-stage block l: m_l = mean_{h,q} relu(d head(norm(mean_n X_l))[t] / d A_l), then (m_l · D) / (1 · D),
    class key dropped; mean over l; min-max with torchcam's eps. b n, dense D."""
    trace = model.trace(pixels, grad=True)
    last = [i for i, b in enumerate(trace.blocks) if b.stage == len(trace.embeddings) - 1 and i >= start_layer]
    out = []
    for b, t in enumerate(target):
        maps = []
        for i in last:
            block = trace.blocks[i]
            score = model.head(model.norm(block.tokens[b].mean(dim=0)))[t]
            (grad,) = torch.autograd.grad(score, block.attn, retain_graph=True)
            keys = np.clip(grad[b].double().numpy(), 0, None).mean(axis=(0, 1))
            d = block_operator(block)
            maps.append((keys @ d / d.sum(axis=0))[block.prefix:])
        cam = np.mean(maps, axis=0)
        cam = cam - cam.min()
        out.append(cam / (cam.max() + 1e-8))
    return np.stack(out)


@pytest.mark.parametrize("start_layer", [0, 4])   # every stage-3 block (blocks 3-5); the last two
def test_cvt_legrad_equals_its_formula_with_the_dense_key_operator(start_layer):
    model, pixels, target = tiny_cvt(), torch.randn(2, 3, 64, 64), [2, 0]   # 8x8 queries, 4x4 keys
    actual = explain.legrad(model, pixels, torch.tensor(target), start_layer=start_layer)
    assert actual.shape == (2, 8, 8)
    expected = legrad_formula(model, pixels, target, start_layer)
    np.testing.assert_allclose(actual.flatten(1).numpy(), expected, rtol=0, atol=1e-6)
    assert (expected.std(-1) > 0.1).all()


def test_cvt_gradcam_equals_a_direct_computation_on_the_last_blocks_first_norm():
    model, pixels, target = tiny_cvt(), torch.randn(2, 3, 32, 32), [3, 1]
    outputs = []
    handle = model.stages[-1].blocks[-1].norm1.register_forward_hook(lambda m, args, out: outputs.append(out))
    try:
        logits = model(pixels)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[[0, 1], target].sum(), outputs[0])
    expected = []
    for b in range(2):
        x, g = outputs[0][b, 1:].detach().double().numpy(), grad[b, 1:].double().numpy()   # class token dropped
        cam = np.maximum(x @ g.mean(axis=0), 0)
        cam = cam - cam.min()
        expected.append(cam / (cam.max() + 1e-7))
    actual = explain.gradcam(model, pixels, torch.tensor(target))
    assert actual.shape == (2, 4, 4)
    np.testing.assert_allclose(actual.flatten(1).numpy(), np.stack(expected), rtol=0, atol=1e-6)
    assert (np.stack(expected).std(-1) > 0.1).all()


# ---------------------------------------------------------------- sanity

@pytest.mark.parametrize("family", ["vit", "cvt"])
def test_reinitialising_the_weights_changes_every_map_that_explains_a_class(family):
    """Adebayo et al. 2018's model-randomisation check: a map that ignores the weights would survive it."""
    if family == "vit":
        size = 64
        model, reinitialised = (tiny_vit(seed=s, img_size=(64, 64), patch_size=4, depth=4) for s in (0, 123))
    else:
        size = 128   # a 16x16 stage-3 grid, its keys on 8x8
        model, reinitialised = tiny_cvt(seed=0), tiny_cvt(seed=123)
    pixels = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(0))
    target = model(pixels).argmax(-1)
    methods = {"gradient rollout": explain.gradient_rollout, "Chefer": explain.chefer_relevance,
               "LeGrad": explain.legrad, "Grad-CAM": explain.gradcam,
               "AttnLRP (CP)": lambda *args: explain.attnlrp(*args, attention="cp"),
               "AttnLRP (the paper's attention rules)": lambda *args: explain.attnlrp(*args, attention="attnlrp")}
    for name, method in methods.items():
        original, again = method(model, pixels, target), method(model, pixels, target)
        randomised = method(reinitialised, pixels, target)
        for b in range(len(pixels)):
            assert spearman(original[b], again[b]) > 0.999
            assert spearman(original[b], randomised[b]) < 0.5, f"{name}, image {b}"


