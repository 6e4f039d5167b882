"""Effective receptive fields (`explain.receptive_field`) against the gradients taken here with forward hooks on
timm's own modules and `torch.autograd.grad`, for every family; and a convolution stack's field stays inside the
theoretical one its geometry allows."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from torch import nn

from test_models import perturb_, vit_config_of
from test_swin import ours_of as swin_of, timm_swin
from vitviz import explain
from vitviz.models import ConvNeXt, ConvNeXtConfig, ResNet, ResNetConfig, ViT, load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hooked_fields(reference: nn.Module, blocks: list[nn.Module], pixels: torch.Tensor, tokens: list[tuple[int, int]],
                  layout: str) -> torch.Tensor:
    """blocks H W: for each block, sum over the batch's images of |d (sum_c output[token]) / d pixels| summed over
    colours, averaged; the output read by a forward hook; layout: 'bnc' (ViT, prefix first), 'bhwc' (Swin) or
    'bchw' (CNNs). tokens: the (row, col) of each block's centre token (a ViT's with its prefix offset)."""
    outputs = []
    handles = [b.register_forward_hook(lambda m, args, out: outputs.append(out)) for b in blocks]
    x = pixels.clone().requires_grad_(True)
    try:
        reference(x)
    finally:
        for h in handles:
            h.remove()
    maps = []
    for k, (out, (i, j)) in enumerate(zip(outputs, tokens)):
        token = {"bnc": (slice(None), i), "bhwc": (slice(None), i, j), "bchw": (slice(None), slice(None), i, j)}[layout]
        y = out[token]
        (grad,) = torch.autograd.grad(y.sum(), x, retain_graph=k < len(outputs) - 1)
        maps.append(grad.abs().sum(dim=1).mean(dim=0))
    return torch.stack(maps)


def nearest(n: int, stride: float, first: float, middle: float) -> int:
    """The index of the token whose centre first + stride * i is nearest `middle` (the first of equally near)."""
    centres = first + stride * np.arange(n)
    return int(np.argmin(np.abs(centres - middle)))


def test_vit_fields_equal_gradients_through_hooks_on_timms_blocks():
    torch.manual_seed(0)
    reference = perturb_(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=3,
                                           num_classes=5), std=0.05)
    ours = ViT(vit_config_of(reference)).eval()
    load_weights(ours, reference.state_dict())
    pixels = torch.randn(2, 3, 64, 64)
    found = explain.receptive_field(ours, pixels)
    k = nearest(4, 16, 8, 32)   # a 4x4 patch grid, centres 8 + 16 i: the centre 32 is between 1 and 2
    expected = hooked_fields(reference, list(reference.blocks), pixels, [(1 + k * 4 + k, 0)] * 3, "bnc")
    torch.testing.assert_close(found.maps, expected, rtol=0, atol=1e-5 * float(expected.max()))
    assert found.maps.shape == (3, 64, 64) and (found.r50 <= found.r90).all() and (found.r90 > 0).all()


def test_swin_fields_equal_gradients_through_hooks_on_timms_blocks():
    reference = timm_swin(**{"img_size": 64, "patch_size": 4, "embed_dim": 16, "depths": (2, 2), "num_heads": (1, 2),
                             "window_size": 4, "num_classes": 5})
    ours = swin_of(reference)
    pixels = torch.randn(2, 3, 64, 64)
    found = explain.receptive_field(ours, pixels)
    blocks = [b for stage in reference.layers for b in stage.blocks]
    tokens = [(nearest(16, 4, 2, 32),) * 2] * 2 + [(nearest(8, 8, 4, 32),) * 2] * 2
    expected = hooked_fields(reference, blocks, pixels, tokens, "bhwc")
    torch.testing.assert_close(found.maps, expected, rtol=0, atol=1e-5 * float(expected.max()))


@pytest.mark.parametrize("name", ["resnet18", "convnext_tiny"])
def test_cnn_fields_equal_gradients_through_hooks_on_timms_blocks(name):
    torch.manual_seed(0)
    kwargs = {} if name == "resnet18" else dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40))
    reference = perturb_(timm.create_model(name, pretrained=False, num_classes=5, **kwargs), std=0.05)
    ours = (ResNet(ResNetConfig(block="basic", layers=(2, 2, 2, 2), num_classes=5)) if name == "resnet18" else
            ConvNeXt(ConvNeXtConfig(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40), num_classes=5))).eval()
    load_weights(ours, reference.state_dict())
    pixels = torch.randn(2, 3, 96, 96)
    found = explain.receptive_field(ours, pixels)
    if name == "resnet18":
        blocks = [b for stage in (reference.layer1, reference.layer2, reference.layer3, reference.layer4)
                  for b in stage]
        # stem 11x11 at stride 4 from -5 (centre 0.5), then 3x3/2 from -1 per stage: centres 0.5 + 4 (2^s) i ...
        first = [0.5, 2.5, 6.5, 14.5]
    else:
        blocks = [b for stage in reference.stages for b in stage.blocks]
        first = [2.0, 4.0, 8.0, 16.0]   # 4x4 patches, then 2x2 merges: centres (4 * 2^s) (i + 1/2)
    tokens, sizes = [], [24, 12, 6, 3]
    per_stage = [1, 1, 1, 1] if name != "resnet18" else [2, 2, 2, 2]
    for s, count in enumerate(per_stage):
        k = nearest(sizes[s], 4 * 2 ** s, first[s], 48)
        tokens += [(k, k)] * count
    expected = hooked_fields(reference, blocks, pixels, tokens, "bchw")
    torch.testing.assert_close(found.maps, expected, rtol=0, atol=1e-5 * float(expected.max()))
    assert (found.r90[-1] > found.r90[0]) and (found.r50 <= found.r90).all()


def test_a_stack_of_3x3_convolutions_reads_nothing_outside_its_theoretical_field():
    """A CIFAR ResNet's stem and blocks: stride 1, 3x3 convolutions; after k of them a token reads at most
    k pixels away on each side (the 1x1 shortcuts add nothing), so the map is zero outside that square."""
    torch.manual_seed(0)
    model = perturb_(ResNet(ResNetConfig(block="basic", layers=(2,), widths=(8,), stem_width=8, stem_kernel=3,
                                         num_classes=3)), std=0.3)
    pixels = torch.randn(2, 3, 33, 33)
    found = explain.receptive_field(model, pixels)
    for block, convs in zip(range(2), (3, 5)):   # the stem and 2 convolutions per block
        support = (found.maps[block] > 0).nonzero()
        assert int(support.min()) == 16 - convs and int(support.max()) == 16 + convs   # the centre pixel is 16
        outside = found.maps[block].clone()
        outside[16 - convs:17 + convs, 16 - convs:17 + convs] = 0
        assert float(outside.abs().max()) == 0.0
    assert found.r90[0] <= 3 * 2 ** 0.5 + 0.5


def test_the_radii_hold_their_share_of_the_mass():
    values = torch.zeros(1, 9, 9)
    values[0, 4, 4], values[0, 4, 6] = 1.0, 1.0   # half at the centre, half 2 px to the right
    [[r50, r90]] = explain.receptive.radii(values, [(4.5, 4.5)], (0.5, 0.9)).tolist()
    assert r50 == 0.0 and r90 == 2.0
