"""Our Swin reproduces timm's SwinTransformer and transformers' SwinForImageClassification, and every method
reads its windowed attention as timm's own attention, assembled into dense matrices here, says it should.

The references: timm's model with perturbed weights; its post-softmax attention probabilities read with
forward hooks on each `WindowAttention.softmax` (timm's explicit path, `fused_attn = False`), placed into
N x N matrices through timm's own `window_partition` and `torch.roll` of a grid of token numbers, and the
methods' formulas (Abnar & Zuidema's product, Chefer's rule) multiplied out densely, the way the paper
writes them and the way vitviz never computes them.
"""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import scale_cam_image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from safetensors.torch import load_file
from timm.models.swin_transformer import window_partition
from torch import Tensor, nn

from test_attribution import GradCAMOnTheGrid
from test_explain import spearman
from test_models import (
    assert_a_slice_of_blocks_keeps_attention_and_graph_only_there,
    assert_max_abs,
    perturb_,
)
from vitviz import explain
from vitviz.models import Swin, SwinConfig, load_weights
from vitviz.models.swin import convert_transformers_state_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STD = 0.02   # Swin-T's 28 M weights: the logits stay within float32's 1e-5 of timm's
SMALL = dict(img_size=112, patch_size=4, embed_dim=16, depths=(2, 2, 2), num_heads=(1, 2, 4), window_size=7,
             num_classes=6)   # 28x28, 14x14 (shifted windows in both) and a 7x7 last stage (one window, no shift)


def timm_swin(seed: int = 0, std: float = 0.1, **kwargs) -> nn.Module:
    torch.manual_seed(seed)
    reference = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kwargs)
    for module in reference.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False   # the explicit softmax, which the hooks read
    return perturb_(reference, std=std)


def ours_of(reference: nn.Module) -> Swin:
    config = SwinConfig(img_size=tuple(reference.patch_embed.img_size), patch_size=reference.patch_embed.patch_size[0],
                        num_classes=reference.num_classes, embed_dim=reference.embed_dim,
                        depths=tuple(len(stage.blocks) for stage in reference.layers),
                        num_heads=tuple(stage.blocks[0].attn.num_heads for stage in reference.layers),
                        window_size=reference.layers[0].blocks[0].window_size[0])
    with torch.device("meta"):
        ours = Swin(config)
    ours = ours.to_empty(device="cpu")
    ours.load_state_dict(reference.state_dict(), strict=False)   # timm's index buffers are not persistent anyway
    return ours.eval()


def small_pair(seed: int = 0) -> tuple[nn.Module, Swin]:
    reference = timm_swin(seed, **SMALL)
    return reference, ours_of(reference)


# ---------------------------------------------------------------- the model

def test_a_trace_of_the_last_blocks_keeps_their_attention_and_graph_only():
    _, ours = small_pair()
    assert_a_slice_of_blocks_keeps_attention_and_graph_only_there(ours, torch.randn(2, 3, 112, 112), -3)   # stage 2's
    # second block onwards: its downsampling and first block run without a graph


def test_swin_tiny_logits_and_trace_match_timm_with_perturbed_weights():
    reference = timm_swin(std=STD)
    ours = ours_of(reference)
    pixels = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = reference(pixels)
        assert_max_abs(ours(pixels), expected, 1e-5, "forward")
        trace = ours.trace(pixels)
        assert_max_abs(trace.logits, expected, 1e-5, "traced forward")
        features = reference.forward_intermediates(pixels, intermediates_only=True)
    assert expected.std() > 0.1
    assert [b.attn.shape for b in trace.blocks][:2] == [torch.Size([2, 64, 3, 49, 49])] * 2
    assert [b.windows.shift for b in trace.blocks] == [0, 3, 0, 3] + [0, 3] * 3 + [0, 0]   # stage 4: 7x7, no shift
    for ours_map, theirs in zip(trace.features, features):
        assert_max_abs(ours_map, theirs, 1e-5, "stage feature map")


@pytest.mark.slow
def test_swin_base_window_12_at_384_matches_timm():
    torch.manual_seed(0)
    reference = perturb_(timm.create_model("swin_base_patch4_window12_384", pretrained=False), std=0.01)
    ours = ours_of(reference)
    assert ours.config.stage_windows == (12, 12, 12, 12)
    pixels = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        assert_max_abs(ours(pixels), reference(pixels), 1e-5, "forward at 384 px")


def test_a_grid_that_is_not_a_multiple_of_the_window_is_padded_as_timm_pads_it():
    reference = timm_swin(**{**SMALL, "img_size": 128})   # 32x32 and 16x16 grids under 7x7 windows
    ours = ours_of(reference)
    pixels = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        assert_max_abs(ours(pixels), reference(pixels), 1e-5, "padded windows")
        trace = ours.trace(pixels)
    assert trace.blocks[0].windows.padded == (35, 35) and trace.blocks[0].attn.shape[1] == 25


def test_an_input_the_stages_cannot_merge_is_refused_in_words():
    _, ours = small_pair()
    with pytest.raises(ValueError, match="multiple of 16 px"):
        ours(torch.randn(1, 3, 120, 120))


def test_transformers_swin_with_random_weights_matches_after_conversion(tmp_path):
    from transformers import SwinConfig as HFSwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    config = HFSwinConfig(image_size=112, patch_size=4, embed_dim=16, depths=[2, 2, 2], num_heads=[1, 2, 4],
                          window_size=7, num_labels=6)
    reference = perturb_(SwinForImageClassification(config), std=0.1)
    reference.save_pretrained(tmp_path)
    reloaded = SwinForImageClassification.from_pretrained(tmp_path).eval()
    with torch.device("meta"):
        ours = Swin(SwinConfig(**SMALL))
    ours = ours.to_empty(device="cpu")
    load_weights(ours, convert_transformers_state_dict(load_file(tmp_path / "model.safetensors")))   # the Hub's names
    ours.eval()
    pixels = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        expected = reloaded(pixel_values=pixels).logits
        assert_max_abs(ours(pixels), expected, 1e-4, "transformers' layout")
    assert expected.std() > 0.1


# ---------------------------------------------------------------- timm's attention, dense

def token_windows(grid: tuple[int, int], window: int, shift: int) -> Tensor:
    """nw t: the token number at each window position, through timm's own roll and window_partition."""
    numbers = torch.arange(grid[0] * grid[1], dtype=torch.float64).reshape(1, *grid, 1)
    if shift:
        numbers = torch.roll(numbers, shifts=(-shift, -shift), dims=(1, 2))
    return window_partition(numbers, (window, window)).reshape(-1, window * window).long()


def dense_attentions(reference: nn.Module, pixels: Tensor, *, grad_of: int | None = None):
    """Per timm block, (b h N N attention, its gradient or None, grid): assembled from the per-window softmax."""
    blocks = [block for stage in reference.layers for block in stage.blocks]
    recorded = []

    def keep(module, args, out):
        if out.requires_grad:
            out.retain_grad()
        recorded.append(out)

    hooks = [b.attn.softmax.register_forward_hook(keep) for b in blocks]
    try:
        with torch.set_grad_enabled(grad_of is not None):
            logits = reference(pixels)
            if grad_of is not None:
                logits[:, grad_of].sum().backward()
    finally:
        for h in hooks:
            h.remove()

    def dense(x, index, n):
        nw, t = index.shape
        x = x.detach().reshape(pixels.shape[0], nw, -1, t, t)
        full = x.new_zeros(pixels.shape[0], x.shape[2], n, n)
        for w in range(nw):
            full[:, :, index[w][:, None], index[w][None, :]] = x[:, w]
        return full.double()

    out = []
    for block, attn in zip(blocks, recorded):
        grid, window, shift = block.input_resolution, block.window_size[0], block.shift_size[0]
        index = token_windows(grid, window, shift)   # nw t
        n = grid[0] * grid[1]
        out.append((dense(attn, index, n), None if grad_of is None else dense(attn.grad, index, n), grid))
    return out


def merging(grid: tuple[int, int]) -> np.ndarray:
    """(gh/2 gw/2) x (gh gw): a merged token's weight shared equally among its 2x2 tokens."""
    h, w = grid
    m = np.zeros((h // 2 * (w // 2), h * w))
    for i in range(h):
        for j in range(w):
            m[(i // 2) * (w // 2) + j // 2, i * w + j] = 0.25
    return m


def dense_product(attns, step, *, to_stage0: bool) -> np.ndarray:
    """The readout row (mean of the last tokens) through every block's matrix `step(A, G)`, backwards, and
    through each patch merging (b N_1 on the first grid, or b N_last on the last)."""
    b, last_grid = attns[-1][0].shape[0], attns[-1][2]
    n = last_grid[0] * last_grid[1]
    row = np.full((b, n), 1.0 / n)
    grid = last_grid
    for attn, grad, block_grid in reversed(attns):
        if block_grid != grid:
            if not to_stage0:
                break
            row = row @ merging(block_grid)
            grid = block_grid
        row = np.einsum('bq,bqk->bk', row, step(attn.numpy(), None if grad is None else grad.numpy()))
    return row.reshape(b, *grid)


def rollout_matrix(a, _):
    fused = a.mean(axis=1)
    eye = np.eye(fused.shape[-1])
    return (eye + fused) / (eye + fused).sum(axis=-1, keepdims=True)


def chefer_matrix(a, g):
    return np.eye(a.shape[-1]) + np.clip(g * a, 0, None).mean(axis=1)


@pytest.mark.parametrize("to_stage", [0, -1])
def test_rollout_equals_the_dense_product_of_timms_attention_through_windows_shifts_and_merging(to_stage):
    reference, ours = small_pair()
    pixels = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        attns = dense_attentions(reference, pixels)
        actual = explain.attention_rollout(ours.trace(pixels), to_stage=to_stage)
    expected = dense_product(attns, rollout_matrix, to_stage0=to_stage == 0)
    assert actual.shape == expected.shape == ((2, 28, 28) if to_stage == 0 else (2, 7, 7))
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=0, atol=1e-5 * expected.max())
    assert (expected.reshape(2, -1).std(-1) > 0.01 * expected.reshape(2, -1).mean(-1)).all()   # not flat


@pytest.mark.parametrize("to_stage", [0, -1])
def test_chefer_relevance_equals_the_dense_rule_on_timms_attention_gradients(to_stage):
    reference, ours = small_pair()
    pixels, target = torch.randn(1, 3, 112, 112), 2
    attns = dense_attentions(reference, pixels, grad_of=target)
    actual = explain.chefer_relevance(ours, pixels, target, to_stage=to_stage)
    expected = dense_product(attns, chefer_matrix, to_stage0=to_stage == 0)
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    assert expected.std() > 0


def test_a_shifted_blocks_attention_is_exactly_zero_between_the_sub_windows_the_mask_separates():
    _, ours = small_pair()
    with torch.no_grad():
        trace = ours.trace(torch.randn(1, 3, 112, 112))
    shifted = trace.blocks[1]
    assert shifted.windows.shift == 3
    masked = shifted.windows.masked
    separated = shifted.attn.permute(0, 2, 1, 3, 4)[:, :, masked]   # b h pairs
    assert separated.numel() and bool((separated == 0).all())
    kept = shifted.attn.permute(0, 2, 1, 3, 4)[:, :, ~masked]
    assert bool((kept > 0).all())
    # the last window of the first row holds the columns the roll wrapped around (24-27 beside 0-2), kept apart
    last = ours.blocks[1].partition((28, 28)).index[3]
    assert sorted(set((last % 28).tolist())) == [0, 1, 2, 24, 25, 26, 27]
    wrapped = (last % 28)[None, :] < 3
    assert torch.equal(masked[3], wrapped.T != wrapped)


def test_gradient_rollout_equals_its_dense_formula_on_timms_attention_gradients():
    reference, ours = small_pair()
    pixels, target = torch.randn(1, 3, 112, 112), 4
    attns = dense_attentions(reference, pixels, grad_of=target)

    def gradient_rollout_matrix(a, g):
        fused = np.clip((g * a).mean(axis=1), 0, None)
        eye = np.eye(fused.shape[-1])
        return (eye + fused) / (eye + fused).sum(axis=-1, keepdims=True)

    expected = dense_product(attns, gradient_rollout_matrix, to_stage0=True)
    actual = explain.gradient_rollout(ours, pixels, target, to_stage=0)
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=0, atol=1e-5 * expected.max())


def test_gradcam_equals_grad_cam_with_its_swin_recipe_on_the_timm_model():
    reference, ours = small_pair()
    pixels, target = torch.randn(2, 3, 112, 112), [1, 5]
    targets = [ClassifierOutputTarget(t) for t in target]
    layers = [reference.layers[-1].blocks[-1].norm1]
    reshape = lambda t: t.permute(0, 3, 1, 2)   # grad-cam's Swin tutorial: B H W C -> B C H W
    with GradCAMOnTheGrid(reference, layers, reshape_transform=reshape, grid=(7, 7)) as cam:
        on_grid = cam(pixels, targets)
    with GradCAM(reference, layers, reshape_transform=reshape) as cam:
        resized = cam(pixels, targets)
    actual = explain.gradcam(ours, pixels, torch.tensor(target))
    np.testing.assert_allclose(actual.numpy(), on_grid, rtol=0, atol=1e-4)
    # grad-cam's own resize and normalisation (BaseCAM.compute_cam_per_layer, then aggregate_multi_layers)
    np.testing.assert_allclose(scale_cam_image(scale_cam_image(actual.numpy(), (112, 112))), resized, rtol=0, atol=1e-4)
    assert (on_grid.reshape(2, -1).std(-1) > 0.05).all()


def test_raw_attention_of_a_clicked_token_is_its_windows_row_of_the_dense_matrix():
    reference, ours = small_pair()
    pixels = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        attns = dense_attentions(reference, pixels)
        trace = ours.trace(pixels)
    for layer in (0, 1, 3):
        dense, _, grid = attns[layer]
        for token in ((0, 0), (27 if grid[0] == 28 else 13, 2), (5, 6)):
            q = token[0] * grid[1] + token[1]
            rows = explain.head_attention(trace, layer=layer, query=token)   # b h gh gw
            np.testing.assert_allclose(rows.double().reshape(1, -1, grid[0] * grid[1]).numpy(), dense[:, :, q].numpy(),
                                       rtol=0, atol=1e-6)
            column = explain.key_attention(trace, layer=layer, patch=token)
            np.testing.assert_allclose(column.double().reshape(1, -1).numpy(), dense.mean(dim=1)[:, :, q].numpy(),
                                       rtol=0, atol=1e-6)


def test_mean_attention_distance_is_bounded_by_the_window():
    _, ours = small_pair()
    with torch.no_grad():
        trace = ours.trace(torch.randn(1, 3, 112, 112))
    distances = explain.mean_attention_distance(trace)
    for block, distance in zip(trace.blocks, distances):
        stride = 4 * 2 ** block.stage
        assert (distance > 0).all() and (distance <= stride * (block.windows.size - 1) * 2 ** 0.5).all()


def test_the_bias_picture_holds_timms_bias_for_each_key_at_its_offset_below_and_right_of_the_query():
    """Tile [h, dy + w - 1, dx + w - 1] is the bias timm's attention adds for a key dy rows below and dx columns
    right of its query (timm's table is indexed by query minus key: the picture turns it round)."""
    from vitviz.render.anatomy import relative_position_biases

    reference, ours = small_pair()
    windowed = [block.attn for stage in reference.layers for block in stage.blocks]
    pictures = relative_position_biases(ours)
    assert len(pictures) == len(windowed)
    w = SMALL["window_size"]
    rows, cols = np.divmod(np.arange(w * w), w)
    for attn, picture in zip(windowed, pictures):
        with torch.no_grad():
            bias = attn._get_rel_pos_bias()[0].numpy()   # h q k
        dy, dx = rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]   # q k: key minus query
        np.testing.assert_array_equal(picture[:, dy + w - 1, dx + w - 1], bias)


def test_legrad_of_a_mean_pooled_swin_reads_its_last_stage():
    _, ours = small_pair()
    cam = explain.legrad(ours, torch.randn(2, 3, 112, 112), torch.tensor([0, 3]))
    assert cam.shape == (2, 7, 7) and float(cam.amin()) == 0.0 and float(cam.amax()) == pytest.approx(1.0, abs=1e-5)


def test_reinitialising_the_weights_changes_every_map_that_explains_a_class():
    """Adebayo et al. 2018's model-randomisation check, for Swin."""
    (_, model), (_, reinitialised) = small_pair(0), small_pair(123)
    pixels = torch.randn(3, 3, 112, 112, generator=torch.Generator().manual_seed(0))
    target = model(pixels).argmax(-1)
    methods = {"gradient rollout": lambda *a: explain.gradient_rollout(*a, to_stage=0),
               "Chefer": lambda *a: explain.chefer_relevance(*a, to_stage=0), "LeGrad": explain.legrad,
               "Grad-CAM": explain.gradcam, "AttnLRP": explain.attnlrp}
    for name, method in methods.items():
        original, randomised = method(model, pixels, target), method(reinitialised, pixels, target)
        for b in range(len(pixels)):
            assert spearman(original[b], randomised[b]) < 0.5, f"{name}, image {b}"


# ---------------------------------------------------------------- through vitviz.load and the fake Hub

@pytest.mark.usefixtures("own_caches")
def test_a_timm_swin_checkpoint_loads_with_timms_logits_preprocessing_and_labels(hub, tmp_path):
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    import vitviz
    from hub_server import files_of, timm_checkpoint

    reference = timm_checkpoint(tmp_path, "swin_tiny_patch4_window7_224.ms_in1k", embed_dim=16, depths=(2, 2, 2, 2),
                                num_heads=(1, 2, 2, 4)).eval()
    hub.publish("test/swin-tiny", files_of(tmp_path))
    loaded = vitviz.load("test/swin-tiny", device="cpu")
    photo = Image.open("/work/shared/examples/cat_chelsea.jpg").convert("RGB")
    pixels = loaded.preprocess(photo)
    assert (pixels - create_transform(**resolve_data_config({}, model=reference))(photo)[None]).abs().max() <= 1e-5
    with torch.no_grad():
        assert_max_abs(loaded.model(pixels), reference(pixels), 1e-5, "timm Swin through the Hub")
    assert loaded.family == "swin" and len(loaded.labels) == 1000 and loaded.source.layout == "timm"


@pytest.mark.usefixtures("own_caches")
def test_a_transformers_swin_checkpoint_loads_with_its_processor_and_id2label(hub, tmp_path):
    from PIL import Image
    from transformers import SwinConfig as HFSwinConfig, SwinForImageClassification
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    import vitviz
    from hub_server import SWIN_PROCESSOR, files_of, transformers_checkpoint

    labels = {0: "tabby", 1: "beagle", 2: "ship"}
    reference = transformers_checkpoint(tmp_path, SwinForImageClassification, HFSwinConfig(
        embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4], id2label=labels), processor=SWIN_PROCESSOR)
    hub.publish("test/hf-swin", files_of(tmp_path))
    loaded = vitviz.load("test/hf-swin", device="cpu")
    photo = Image.open("/work/shared/examples/cat_chelsea.jpg").convert("RGB")
    pixels = loaded.preprocess(photo)
    expected = ViTImageProcessorPil.from_dict(SWIN_PROCESSOR)(photo, return_tensors="pt")["pixel_values"]
    assert (pixels - expected).abs().max() <= 1e-5
    with torch.no_grad():
        assert_max_abs(loaded.model(pixels), reference(pixel_values=pixels).logits, 1e-4, "transformers' Swin")
    assert loaded.family == "swin" and loaded.labels == ("tabby", "beagle", "ship")


# ---------------------------------------------------------------- what decides, relevance

def test_direct_logit_attribution_parts_sum_to_the_logit_and_token_effects_to_the_heads():
    _, ours = small_pair()
    pixels = torch.randn(2, 3, 112, 112)
    trace = ours.trace(pixels, decompose=True)
    target = trace.logits.argmax(-1)
    parts = explain.direct_logit_attribution(ours, trace, target, foil=(target + 1) % 6)
    scale = float(parts.logit.abs().max())
    assert_max_abs(parts.total(), parts.logit, 1e-4 * scale, "parts against the logit")
    assert_max_abs(parts.token_effects.sum(dim=-1), parts.heads, 1e-5 * scale, "token effects against heads")
    assert parts.layers == [4, 5] and parts.heads.shape[-1] == 4   # the last stage's two blocks, 4 heads
    maps = explain.token_effect_maps(parts, trace)
    assert maps.shape == (2, 2, 4, 7, 7)


def test_residual_patching_matches_forward_hooks_on_timms_blocks():
    from test_decide import inputs_of, reference_effect, replaced_input

    reference, ours = small_pair()
    torch.manual_seed(1)
    clean = torch.randn(1, 3, 112, 112)
    corrupted = explain.corrupt(clean, "noise", strength=1.0)
    blocks = [block for stage in reference.layers for block in stage.blocks]
    with torch.no_grad(), inputs_of(blocks) as clean_inputs:   # timm's blocks read b h w c
        reference(clean)
    result = explain.patch_activations(ours, clean, corrupted, site="resid", group=4)
    m = result.metric
    for layer, block in enumerate(blocks):
        h, w = clean_inputs[layer].shape[1:3]
        assert result.grid[layer].shape == (-(-h // 4), -(-w // 4))
        for i, j in ((0, 0), (h // 8, w // 8), (-(-h // 4) - 1, 0)):
            def replace(x, i=i, j=j, layer=layer):
                x[:, 4 * i:4 * i + 4, 4 * j:4 * j + 4] = clean_inputs[layer][:, 4 * i:4 * i + 4, 4 * j:4 * j + 4]
                return x
            expected = reference_effect(lambda: reference(corrupted), m, replaced_input(block, replace))
            # float32 through six blocks of windows (fused attention kernels on both sides, summing in their own
            # orders), divided by the metric's difference: 5e-5
            assert abs(float(result.grid[layer][i, j]) - expected) <= 5e-5 * max(1.0, abs(expected)), \
                f"block {layer}, {i, j}"


def test_head_patching_matches_forward_hooks_on_timms_output_projection():
    from test_decide import inputs_of, reference_effect, replaced_input

    reference, ours = small_pair()
    torch.manual_seed(2)
    clean = torch.randn(1, 3, 112, 112)
    corrupted = explain.corrupt(clean, "blur", strength=4.0)
    result = explain.patch_activations(ours, clean, corrupted, site="head")
    blocks = [block for stage in reference.layers for block in stage.blocks]
    with torch.no_grad(), inputs_of([b.attn.proj for b in blocks]) as clean_z:   # b*nw t (h d), window order
        reference(clean)
    for layer, block in enumerate(blocks):
        heads = block.attn.num_heads
        d = block.attn.proj.in_features // heads
        for h in range(heads):
            def replace(z, layer=layer, h=h, d=d):
                z[..., h * d:(h + 1) * d] = clean_z[layer][..., h * d:(h + 1) * d]
                return z
            expected = reference_effect(lambda: reference(corrupted), result.metric,
                                        replaced_input(block.attn.proj, replace))
            assert abs(float(result.heads[layer, h]) - expected) <= 1e-5, f"block {layer}, head {h}"


def test_relevance_of_the_pixels_sums_to_the_target_logit_when_biases_are_zero():
    from test_relevance import homogeneous_

    _, ours = small_pair()
    model = homogeneous_(ours)
    pixels, targets = torch.randn(2, 3, 112, 112), torch.tensor([1, 4])
    logits = model(pixels).detach().gather(1, targets[:, None])[:, 0]
    relevance = explain.attnlrp(model, pixels, targets, pixel_map=True).sum(dim=(1, 2))
    assert ((relevance - logits).abs() / logits.abs()).max() <= 0.01


def test_a_pass_in_inference_mode_first_leaves_nothing_that_breaks_a_later_pass_with_gradients():
    """The window indices and masks are made once and kept (per geometry): made in inference mode, they could not
    be saved for a backward pass later (the app traces in inference mode, then explains a class)."""
    from vitviz.models import swin

    _, ours = small_pair()
    swin._partition.cache_clear()   # made afresh below, in inference mode
    swin.relative_position_index.cache_clear()
    pixels = torch.randn(1, 3, 112, 112)
    with torch.inference_mode():
        ours.trace(pixels)
    assert explain.gradcam(ours, pixels, 0).shape == (1, 7, 7)
