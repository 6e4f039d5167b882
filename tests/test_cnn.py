"""Our ResNet and ConvNeXt reproduce timm's and transformers' models, and load from the Hub's layouts.

The references get random weights, then every parameter and BatchNorm statistic is moved off its
initial value (`perturb_`), so a forgotten bias, norm or layer scale shows in the logits.
"""
from __future__ import annotations

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file
from timm.data import create_transform, resolve_data_config
from transformers import (
    ConvNextConfig as HFConvNextConfig,
    ConvNextForImageClassification,
    ResNetConfig as HFResNetConfig,
    ResNetForImageClassification,
)
from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil

import vitviz
from hub_server import cvt_processor_config, files_of, timm_checkpoint, transformers_checkpoint
from test_models import assert_max_abs, perturb_
from vitviz.models import (
    ConvNeXt,
    ConvNeXtConfig,
    ResNet,
    ResNetConfig,
    convnext as convnext_module,
    load_weights,
    resnet as resnet_module,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMM_CASES = {   # timm name -> (our config, what it exercises)
    "resnet50": (ResNetConfig(), "bottleneck blocks, 7x7 stem with max pool"),
    "resnet18": (ResNetConfig(block="basic", layers=(2, 2, 2, 2)), "basic blocks"),
    "convnext_tiny": (ConvNeXtConfig(), "patchify stem, depthwise 7x7, LayerNorm, layer scale"),
}


def timm_reference(name: str, std: float = 0.02) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb_(timm.create_model(name, pretrained=False), std=std)


@pytest.mark.parametrize("name", list(TIMM_CASES), ids=[case[1] for case in TIMM_CASES.values()])
def test_logits_and_stage_features_match_timm_with_perturbed_weights_and_batchnorm_statistics(name):
    reference = timm_reference(name)
    config = TIMM_CASES[name][0]
    ours = (ResNet if isinstance(config, ResNetConfig) else ConvNeXt)(config).eval()
    load_weights(ours, reference.state_dict())
    pixels = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = reference(pixels)
        assert_max_abs(ours(pixels), expected, 1e-5, f"{name} forward")
        trace = ours.trace(pixels)
        assert_max_abs(trace.logits, expected, 1e-5, f"{name} traced forward")
        stages = reference.forward_intermediates(pixels, intermediates_only=True)
    assert expected.std() > 0.1
    for ours_map, theirs in zip(trace.features, stages[-len(trace.features):]):
        assert_max_abs(ours_map, theirs, 1e-4 * max(1.0, theirs.abs().max().item()), f"{name} stage features")
    assert all(not b.attends and b.attn is None for b in trace.blocks)
    assert [e.grid for e in trace.embeddings] == [(56, 56), (28, 28), (14, 14), (7, 7)]


@pytest.mark.parametrize("kind", ["resnet", "convnext"])
def test_transformers_layouts_with_random_weights_match_after_conversion(tmp_path, kind):
    if kind == "resnet":
        reference = transformers_checkpoint(tmp_path, ResNetForImageClassification, HFResNetConfig(
            depths=[1, 2, 1, 1], hidden_sizes=[32, 48, 64, 80], embedding_size=16, num_labels=5))
        ours = ResNet(ResNetConfig.from_transformers(reference.config.to_dict()))
        convert = resnet_module.convert_transformers_state_dict
    else:
        reference = transformers_checkpoint(tmp_path, ConvNextForImageClassification, HFConvNextConfig(
            depths=[1, 1, 2, 1], hidden_sizes=[16, 24, 32, 40], num_labels=5))
        ours = ConvNeXt(ConvNeXtConfig.from_transformers(reference.config.to_dict()))
        convert = convnext_module.convert_transformers_state_dict
    load_weights(ours, convert(load_file(tmp_path / "model.safetensors")))   # the names the Hub's files have
    ours.eval()
    pixels = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        expected = reference(pixel_values=pixels).logits
        assert_max_abs(ours(pixels), expected, 1e-4, f"transformers' {kind}")
    assert expected.std() > 0.05


# ---------------------------------------------------------------- through vitviz.load and the fake Hub

@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return Image.open("/work/shared/examples/cat_chelsea.jpg").convert("RGB")


@pytest.mark.parametrize("name, args", [("resnet50.a1_in1k", dict(layers=(1, 1, 1, 1))),
                                        ("resnet18.a1_in1k", dict(layers=(1, 1, 1, 1))),
                                        ("convnext_tiny.fb_in1k", dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40)))])
@pytest.mark.usefixtures("own_caches")
def test_timm_checkpoints_load_with_timms_logits_and_preprocessing(hub, tmp_path, photo, name, args):
    reference = timm_checkpoint(tmp_path, name, **args).eval()
    repo_id = f"test/{name}"
    hub.publish(repo_id, files_of(tmp_path))
    loaded = vitviz.load(repo_id, device="cpu")
    pixels = loaded.preprocess(photo)
    assert (pixels - create_transform(**resolve_data_config({}, model=reference))(photo)[None]).abs().max() <= 1e-5
    with torch.no_grad():
        assert_max_abs(loaded.model(pixels), reference(pixels), 1e-5, name)
    assert loaded.family == ("convnext" if name.startswith("convnext") else "resnet") and len(loaded.labels) == 1000


@pytest.mark.parametrize("kind", ["resnet", "convnext"])
@pytest.mark.usefixtures("own_caches")
def test_transformers_checkpoints_load_with_their_processor_and_labels(hub, tmp_path, photo, kind):
    labels = {0: "tabby", 1: "beagle", 2: "ship"}
    model_cls, config = ((ResNetForImageClassification, HFResNetConfig(depths=[1, 1, 1, 1],
                                                                       hidden_sizes=[32, 48, 64, 80],
                                                                       embedding_size=16, id2label=labels))
                         if kind == "resnet" else
                         (ConvNextForImageClassification, HFConvNextConfig(depths=[1, 1, 1, 1],
                                                                           hidden_sizes=[16, 24, 32, 40],
                                                                           id2label=labels)))
    reference = transformers_checkpoint(tmp_path, model_cls, config, processor=cvt_processor_config(224))
    hub.publish(f"test/hf-{kind}", files_of(tmp_path))
    loaded = vitviz.load(f"test/hf-{kind}", device="cpu")
    pixels = loaded.preprocess(photo)
    expected_pixels = ConvNextImageProcessorPil.from_dict(cvt_processor_config(224))(photo, return_tensors="pt")
    assert (pixels - expected_pixels["pixel_values"]).abs().max() <= 1e-5
    with torch.no_grad():
        assert_max_abs(loaded.model(pixels), reference(pixel_values=pixels).logits, 1e-4, kind)
    assert loaded.family == kind and loaded.labels == ("tabby", "beagle", "ship")


# ---------------------------------------------------------------- relevance

def test_resnet_lrp_equals_zennits_epsilon_plus_flat_with_its_resnet_canonizer_on_torchvision():
    from torchvision.models import resnet50
    from zennit.attribution import Gradient
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer

    from vitviz import explain

    reference = timm_reference("resnet50", std=0.05)
    torchvision_model = resnet50()
    torchvision_model.load_state_dict(reference.state_dict())   # timm's and torchvision's names are the same
    torchvision_model.eval()
    # zennit's MergeBatchNorm leaves each BatchNorm as x / sqrt(1 + eps), not the identity it means: with eps
    # moved into the running variance the network computes the same, and the merged one exactly that
    for m in torchvision_model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var.add_(m.eps)
            m.eps = 0.0
    ours = ResNet(ResNetConfig()).eval()
    load_weights(ours, reference.state_dict())
    pixels, targets = torch.randn(2, 3, 112, 112), torch.tensor([3, 811])
    with torch.no_grad():
        logits = torchvision_model(pixels)
    one_hot = torch.zeros_like(logits).scatter(1, targets[:, None], logits.gather(1, targets[:, None]))
    with Gradient(model=torchvision_model, composite=EpsilonPlusFlat(canonizers=[ResNetCanonizer()])) as attributor:
        _, relevance = attributor(pixels, one_hot)   # started at the target logit, as vitviz starts
    expected = relevance.sum(dim=1)
    actual = explain.attnlrp(ours, pixels, targets, pixel_map=True)
    scale = expected.abs().amax(dim=(1, 2), keepdim=True)
    assert ((actual - expected).abs() / scale).max() <= 1e-4
    assert (expected.flatten(1).std(-1) > 0.01 * scale.flatten()).all()


def test_convnext_relevance_of_the_pixels_sums_to_the_target_logit_when_biases_are_zero():
    """AttnLRP's rules conserve through ConvNeXt. (zennit's z+ rule on a ResNet does not quite: an output whose
    positive contributions vanish keeps its relevance in the stabiliser; on this test's tiny ResNet the pixels
    hold 97-103 % of the logit, in zennit as in vitviz.)"""
    from test_relevance import homogeneous_
    from vitviz import explain

    torch.manual_seed(0)
    model = homogeneous_(perturb_(ConvNeXt(ConvNeXtConfig(depths=(1, 1, 1), dims=(8, 16, 24), num_classes=5)), std=0.3))
    pixels, targets = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 4])
    logits = model(pixels).detach().gather(1, targets[:, None])[:, 0]
    relevance = explain.attnlrp(model, pixels, targets, pixel_map=True).sum(dim=(1, 2))
    assert ((relevance - logits).abs() / logits.abs()).max() <= 0.01


# ---------------------------------------------------------------- Grad-CAM, attribution, patching

@pytest.mark.parametrize("name", ["resnet50", "convnext_tiny"])
def test_gradcam_equals_grad_cam_at_the_last_stage_on_the_timm_model(name):
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.image import scale_cam_image
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from test_attribution import GradCAMOnTheGrid
    from vitviz import explain

    reference = timm_reference(name, std=0.05)
    config = TIMM_CASES[name][0]
    ours = (ResNet if isinstance(config, ResNetConfig) else ConvNeXt)(config).eval()
    load_weights(ours, reference.state_dict())
    layers = [reference.layer4[-1]] if name.startswith("resnet") else [reference.stages[-1]]
    pixels = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        target = reference(pixels).argmax(-1).tolist()   # each image's top class: a map with structure
    targets = [ClassifierOutputTarget(t) for t in target]
    with GradCAMOnTheGrid(reference, layers, grid=(4, 4)) as cam:
        on_grid = cam(pixels, targets)
    with GradCAM(reference, layers) as cam:
        resized = cam(pixels, targets)
    actual = explain.gradcam(ours, pixels, torch.tensor(target))
    import numpy as np
    np.testing.assert_allclose(actual.numpy(), on_grid, rtol=0, atol=1e-4)
    np.testing.assert_allclose(scale_cam_image(scale_cam_image(actual.numpy(), (128, 128))), resized, rtol=0, atol=1e-4)
    assert (on_grid.reshape(2, -1).std(-1) > 0.05).all()


def small_cnn(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "resnet":
        return perturb_(ResNet(ResNetConfig(block="basic", layers=(1, 1, 1), widths=(8, 16, 24), stem_width=8,
                                            stem_kernel=3, num_classes=5)), std=0.2)
    return perturb_(ConvNeXt(ConvNeXtConfig(depths=(1, 1, 2), dims=(8, 16, 24), num_classes=5)), std=0.2)


def test_convnext_direct_logit_attribution_parts_sum_to_the_logit_and_a_resnet_is_refused_in_words():
    from vitviz import explain

    model = small_cnn("convnext")
    pixels = torch.randn(2, 3, 32, 32)
    trace = model.trace(pixels, decompose=True)
    target = trace.logits.argmax(-1)
    parts = explain.direct_logit_attribution(model, trace, target, foil=(target + 1) % 5)
    assert_max_abs(parts.total(), parts.logit, 1e-4 * float(parts.logit.abs().max()), "ConvNeXt parts")
    assert parts.heads.shape[-1] == 0 and len(parts.layers) == 2 and parts.table(0)["top_head"] is None
    resnet = small_cnn("resnet")
    with pytest.raises(ValueError, match="a ReLU follows each addition"):
        explain.direct_logit_attribution(resnet, resnet.trace(pixels, decompose=True))
    with pytest.raises(explain.NoAttention, match="convolutional network"):
        explain.attention_rollout(resnet.trace(pixels))


def test_resnet_residual_patching_matches_forward_hooks_on_timms_blocks():
    from test_decide import inputs_of, reference_effect, replaced_input
    from vitviz import explain

    reference = timm_reference("resnet18", std=0.05)
    ours = ResNet(TIMM_CASES["resnet18"][0]).eval()
    load_weights(ours, reference.state_dict())
    torch.manual_seed(1)
    clean = torch.randn(1, 3, 64, 64)
    corrupted = explain.corrupt(clean, "noise", strength=1.0)
    blocks = [b for stage in (reference.layer1, reference.layer2, reference.layer3, reference.layer4) for b in stage]
    with torch.no_grad(), inputs_of(blocks) as clean_inputs:
        reference(clean)
    result = explain.patch_activations(ours, clean, corrupted, site="resid", group=2)
    m = result.metric
    for layer, block in enumerate(blocks):
        h, w = clean_inputs[layer].shape[-2:]
        for i in range(-(-h // 2)):
            for j in range(-(-w // 2)):
                square = (..., slice(2 * i, 2 * i + 2), slice(2 * j, 2 * j + 2))

                def replace(x, square=square, clean=clean_inputs[layer]):
                    x[square] = clean[square]
                    return x
                expected = reference_effect(lambda: reference(corrupted), m, replaced_input(block, replace))
                assert abs(float(result.grid[layer][i, j]) - expected) <= 1e-5, f"block {layer}, square {i, j}"
    with pytest.raises(explain.NoAttention):
        explain.patch_activations(ours, clean, corrupted, site="head")


@pytest.mark.parametrize("kind", ["resnet", "convnext"])
def test_reinitialising_the_weights_changes_every_map_that_explains_a_class(kind):
    """Adebayo et al. 2018's model-randomisation check, for the CNNs' methods."""
    from test_explain import spearman
    from vitviz import explain

    model, reinitialised = small_cnn(kind, 0), small_cnn(kind, 123)
    pixels = torch.randn(4, 3, 128, 128, generator=torch.Generator().manual_seed(0))   # an 8x8 last grid
    target = model(pixels).argmax(-1)
    for name, method in {"Grad-CAM": explain.gradcam, "LRP": explain.attnlrp}.items():
        original, randomised = method(model, pixels, target), method(reinitialised, pixels, target)
        for b in range(len(pixels)):
            assert spearman(original[b], randomised[b]) < 0.5, f"{name}, image {b}"
