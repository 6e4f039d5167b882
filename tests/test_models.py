"""Our ViT and CvT reproduce timm's VisionTransformer and transformers' CvtForImageClassification.

Every reference is built with random weights, then every parameter (and every BatchNorm running
statistic) is perturbed, so biases, norms, tokens and LayerScale gammas are far from their
initial values and a forgotten one shows. The references' attention probabilities are read with
forward hooks on their attention-dropout modules (identity in eval mode), here in the test; our
models hand theirs over in `trace`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import NamedTuple

import pytest
import timm
import torch
from torch import Tensor, nn
from transformers import CvtConfig, CvtForImageClassification

from vitviz.models import (
    CvT,
    CvTConfig,
    Embedding,
    Trace,
    ViT,
    ViTConfig,
    Window,
    convert_transformers_state_dict,
    load_weights,
)
from vitviz.models.cvt import CVT_13, CVT_21, CVT_W24

VIT_STD = 0.05   # large enough for peaked attention, small enough that float32 logits stay within 1e-5
CVT_STD = 0.1    # CvT's width-wide attention scale needs larger q/k weights to leave near-uniform attention


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def perturb_(model: nn.Module, *, std: float) -> nn.Module:
    """Gaussian noise on every parameter; BatchNorm running means shifted and variances rescaled."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.add_(torch.randn_like(m.running_mean) * std)
                m.running_var.mul_(torch.empty_like(m.running_var).uniform_(0.5, 2.0))
    return model.eval()


@contextlib.contextmanager
def outputs_of(modules: list[nn.Module]):
    """Records the forward outputs of `modules`, in call order, while the block is open (hooks on the reference)."""
    outputs = []
    handles = [m.register_forward_hook(lambda module, args, out: outputs.append(out)) for m in modules]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def assert_max_abs(actual: Tensor, expected: Tensor, tol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    err = (actual - expected).abs().max().item()
    assert err <= tol, f"{what}: max abs difference {err:.3g} > {tol:g}"


def conv_out(n: int, window: Window) -> int:
    """Output length of a convolution (floor division), written out independently of the models."""
    return (n + 2 * window.padding - window.kernel) // window.stride + 1


class Run(NamedTuple):
    reference: nn.Module
    ours: ViT | CvT
    pixels: Tensor
    ref_logits: Tensor
    ref_attentions: list[Tensor]
    ref_features: list[Tensor]    # CvT: transformers' output_hidden_states; empty for ViT
    logits: Tensor                # our fast forward
    trace: Trace


# ----------------------------------------------------------------------------------------- ViT

def vit_config_of(m: nn.Module) -> ViTConfig:
    """Our config read off a timm VisionTransformer's attributes (no per-name table)."""
    block = m.blocks[0]
    assert isinstance(m.norm_pre, nn.Identity) and m.attn_pool is None and isinstance(block.attn.q_norm, nn.Identity), \
        "reference uses a timm feature our ViT does not implement"
    return ViTConfig(
        img_size=m.patch_embed.img_size, patch_size=m.patch_embed.patch_size[0],
        in_chans=m.patch_embed.proj.in_channels,
        num_classes=m.num_classes, embed_dim=m.embed_dim, depth=len(m.blocks), num_heads=block.attn.num_heads,
        mlp_ratio=block.mlp.fc1.out_features / m.embed_dim, qkv_bias=block.attn.qkv.bias is not None,
        class_token=m.cls_token is not None, dist_token=getattr(m, "dist_token", None) is not None,
        reg_tokens=m.num_reg_tokens, no_embed_class=m.no_embed_class, global_pool=m.global_pool,
        fc_norm=not isinstance(m.fc_norm, nn.Identity), init_values=getattr(block.ls1, "init_values", None))


# id: (timm name, create_model kwargs, input (h, w), batch)
VIT_CASES = {
    "vit_tiny_patch16_224": ("vit_tiny_patch16_224", {}, (224, 224), 2),
    "vit_small_patch32_224": ("vit_small_patch32_224", {}, (224, 224), 2),
    "vit_base_patch16_384": ("vit_base_patch16_384", dict(depth=2), (384, 384), 1),
    "deit_tiny_distilled_patch16_224": ("deit_tiny_distilled_patch16_224", {}, (224, 224), 2),
    # class token kept, mean of patch tokens, final norm moved to fc_norm; patch size 8
    "vit_small_patch8_avg_64": (
        "vit_small_patch8_224", dict(global_pool="avg", img_size=64, num_classes=1000), (64, 64), 2),
    # no class token, no qkv bias, LayerScale, fc_norm=False (final norm over all tokens, then mean)
    "vit_medium_patch16_gap_256": ("vit_medium_patch16_gap_256", dict(depth=3), (256, 256), 1),
    "vit_base_patch16_reg4_gap_256": ("vit_base_patch16_reg4_gap_256", dict(depth=2), (256, 256), 1),
    # [cls, reg x4], no_embed_class, LayerScale; patch size 14
    "vit_small_patch14_reg4_dinov2_126": (
        "vit_small_patch14_reg4_dinov2", dict(img_size=126, num_classes=1000), (126, 126), 2),
    # non-square inputs: pos_embed resampled from the trained square grid (timm's dynamic_img_size as reference)
    "vit_tiny_patch16_224_at_160x288": ("vit_tiny_patch16_224", dict(dynamic_img_size=True), (160, 288), 2),
    "vit_small_patch14_reg4_dinov2_126_at_98x168": (
        "vit_small_patch14_reg4_dinov2", dict(img_size=126, num_classes=1000, dynamic_img_size=True), (98, 168), 1),
}


@functools.cache
def vit_run(case: str) -> Run:
    name, kwargs, size, batch = VIT_CASES[case]
    torch.manual_seed(0)
    reference = perturb_(timm.create_model(name, pretrained=False, **kwargs), std=VIT_STD)
    ours = ViT(vit_config_of(reference)).eval()
    load_weights(ours, reference.state_dict())
    for block in reference.blocks:
        block.attn.fused_attn = False   # the explicit softmax path, whose probabilities pass through attn_drop
    pixels = torch.randn(batch, 3, *size)
    with torch.no_grad(), outputs_of([block.attn.attn_drop for block in reference.blocks]) as ref_attentions:
        ref_logits, logits = reference(pixels), ours(pixels)
    return Run(reference, ours, pixels, ref_logits, ref_attentions, [], logits, ours.trace(pixels))


@pytest.mark.parametrize("case", VIT_CASES)
def test_vit_logits_and_attention_match_timm_with_perturbed_weights(case):
    run = vit_run(case)
    assert len(run.ref_attentions) == len(run.trace.attentions) == len(run.reference.blocks)
    assert_max_abs(run.logits, run.ref_logits, 1e-5, "forward logits")
    assert_max_abs(run.trace.logits, run.ref_logits, 1e-5, "trace logits")
    for i, (attn, ref) in enumerate(zip(run.trace.attentions, run.ref_attentions)):
        assert_max_abs(attn, ref, 1e-6, f"block {i} attention")


def test_vit_perturbed_attention_is_far_from_uniform():
    """Guards the test above: near-uniform attention would hide scale and ordering mistakes."""
    attn = vit_run("vit_base_patch16_384").ref_attentions[-1]
    assert attn.max() > 0.5


@pytest.mark.parametrize("case, prefix_kinds", [
    ("vit_tiny_patch16_224", ("cls",)),
    ("deit_tiny_distilled_patch16_224", ("cls", "dist")),
    ("vit_medium_patch16_gap_256", ()),
    ("vit_base_patch16_reg4_gap_256", ("reg",) * 4),
    ("vit_small_patch14_reg4_dinov2_126", ("cls",) + ("reg",) * 4),
    ("vit_tiny_patch16_224_at_160x288", ("cls",)),
    ("vit_small_patch14_reg4_dinov2_126_at_98x168", ("cls",) + ("reg",) * 4),
])
def test_vit_trace_records_patch_grid_and_prefix_tokens(case, prefix_kinds):
    run = vit_run(case)
    trace, reference = run.trace, run.reference
    b, _, h, w = run.pixels.shape
    p = reference.patch_embed.patch_size[0]
    grid = (h // p, w // p)
    n = len(prefix_kinds) + grid[0] * grid[1]
    heads, dim = reference.blocks[0].attn.num_heads, reference.embed_dim
    assert trace.input_size == (h, w)
    assert trace.embeddings == [Embedding(window=Window(p, p, 0), in_grid=(h, w), grid=grid)]
    assert len(trace.blocks) == len(reference.blocks)
    for block in trace.blocks:
        assert (block.stage, block.query_grid, block.key_grid) == (0, grid, grid)
        assert block.key_window == Window(1, 1, 0)
        assert block.prefix_kinds == prefix_kinds and block.prefix == len(prefix_kinds)
        assert block.attn.shape == (b, heads, n, n)
        assert block.tokens.shape == (b, n, dim)
    assert len(trace.features) == 1 and trace.features[0].shape == (b, dim, *grid)
    # the feature map is the last block's grid tokens, laid out row-major
    last = trace.blocks[-1].tokens
    assert torch.equal(trace.features[0][:, :, -1, 0], last[:, len(prefix_kinds) + (grid[0] - 1) * grid[1]])


def test_vit_tokens_are_timm_block_outputs():
    run = vit_run("deit_tiny_distilled_patch16_224")
    with torch.no_grad(), outputs_of(list(run.reference.blocks)) as outputs:
        run.reference(run.pixels)
    assert len(outputs) == len(run.trace.blocks)
    for i, (block, ref) in enumerate(zip(run.trace.blocks, outputs)):
        assert_max_abs(block.tokens, ref, 1e-5, f"block {i} tokens")


def test_vit_patch_sizes_8_14_16_32_are_covered():
    assert {vit_run(case).ours.config.patch_size for case in VIT_CASES} >= {8, 14, 16, 32}


# ----------------------------------------------------------------------------------------- CvT

def transformers_cvt(depth: tuple[int, int, int], **config) -> CvtForImageClassification:
    # transformers indexes its per-layer drop-path list by the stage index, so stage i needs depth > i
    return perturb_(CvtForImageClassification(CvtConfig(num_labels=1000, depth=list(depth), **config)), std=CVT_STD)


W24 = dict(embed_dim=[192, 768, 1024], num_heads=[3, 12, 16])

# id: (stage depths, extra CvtConfig fields, input (h, w), batch)
CVT_CASES = {
    "cvt13_224": ((1, 2, 10), {}, (224, 224), 1),
    "cvt21_224": ((1, 4, 16), {}, (224, 224), 1),
    "cvt13_384_stage3_depth3": ((1, 2, 3), {}, (384, 384), 1),
    "cvt21_384_stage3_depth3": ((1, 4, 3), {}, (384, 384), 1),
    # odd, non-square: grids 37x65 -> 19x33 -> 10x17 where a (n - 1) // stride formula would be off by one
    "cvt13_150x262_stage3_depth3": ((1, 2, 3), {}, (150, 262), 2),
    "cvtw24_96x128_depth2x2x3": ((2, 2, 3), W24, (96, 128), 1),
}


def layers(reference: CvtForImageClassification) -> list[nn.Module]:
    return [layer for stage in reference.cvt.encoder.stages for layer in stage.layers]


def cvt_pair(reference: CvtForImageClassification, **overrides) -> CvT:
    config = dataclasses.replace(CvTConfig.from_transformers(reference.config.to_dict()), **overrides)
    ours = CvT(config).eval()
    load_weights(ours, convert_transformers_state_dict(reference.state_dict()))
    return ours


@functools.cache
def cvt_run(case: str) -> Run:
    depth, config, size, batch = CVT_CASES[case]
    torch.manual_seed(0)
    reference = transformers_cvt(depth, **config)
    ours = cvt_pair(reference)
    pixels = torch.randn(batch, 3, *size)
    # each layer's attention dropout is fed the post-softmax probabilities
    dropouts = [layer.attention.attention.dropout for layer in layers(reference)]
    with torch.no_grad(), outputs_of(dropouts) as ref_attentions:
        out = reference(pixels, output_hidden_states=True)
        logits = ours(pixels)
    return Run(reference, ours, pixels, out.logits, ref_attentions, list(out.hidden_states), logits, ours.trace(pixels))


@pytest.mark.parametrize("case", CVT_CASES)
def test_cvt_logits_features_and_attention_match_transformers_with_perturbed_weights_and_bn_stats(case):
    run = cvt_run(case)
    assert len(run.ref_attentions) == len(run.trace.attentions) == sum(CVT_CASES[case][0])
    assert_max_abs(run.logits, run.ref_logits, 1e-4, "forward logits")
    assert_max_abs(run.trace.logits, run.ref_logits, 1e-4, "trace logits")
    assert len(run.trace.features) == len(run.ref_features) == 3
    for i, (fmap, ref) in enumerate(zip(run.trace.features, run.ref_features)):
        # float32 rounding grows with the residual stream (|x| ~ 100 in stage 3): compare relative to its size
        assert_max_abs(fmap, ref, 1e-5 * ref.abs().max().item(), f"stage {i} feature map")
    for i, (attn, ref) in enumerate(zip(run.trace.attentions, run.ref_attentions)):
        assert_max_abs(attn, ref, 1e-5, f"block {i} attention")


def test_cvt_perturbed_attention_is_far_from_uniform():
    """Guards the test above: near-uniform attention would hide scale mistakes."""
    assert max(attn.max() for attn in cvt_run("cvt13_224").ref_attentions) > 0.1


def test_cvt_quick_gelu_option_matches_a_quick_gelu_reference():
    class QuickGELU(nn.Module):   # Microsoft's original CvT activation, x * sigmoid(1.702 x)
        def forward(self, x: Tensor) -> Tensor:
            return x * torch.sigmoid(1.702 * x)

    torch.manual_seed(0)
    reference = transformers_cvt((1, 2, 3))
    gelu_model = cvt_pair(reference)
    ours = cvt_pair(reference, act="quick_gelu")
    for layer in layers(reference):
        layer.intermediate.activation = QuickGELU()
    pixels = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        expected = reference(pixels).logits
        assert_max_abs(ours(pixels), expected, 1e-4, "quick_gelu forward logits")
        assert (gelu_model(pixels) - expected).abs().max() > 1e-2, "activations too small to tell GELU apart"
    assert_max_abs(ours.trace(pixels).logits, expected, 1e-4, "quick_gelu trace logits")


@pytest.mark.parametrize("case", ["cvt13_224", "cvt13_150x262_stage3_depth3"])
def test_cvt_trace_records_stage_grids_stride2_key_grids_and_class_token(case):
    run = cvt_run(case)
    trace, hf = run.trace, run.reference.config
    b, _, h, w = run.pixels.shape
    assert trace.input_size == (h, w)
    in_grid, expected_blocks = (h, w), []
    for i in range(3):
        window = Window(hf.patch_sizes[i], hf.patch_stride[i], hf.patch_padding[i])
        grid = (conv_out(in_grid[0], window), conv_out(in_grid[1], window))
        kv = Window(hf.kernel_qkv[i], hf.stride_kv[i], hf.padding_kv[i])
        key_grid = (conv_out(grid[0], kv), conv_out(grid[1], kv))
        prefix = ("cls",) if hf.cls_token[i] else ()
        dim, heads = hf.embed_dim[i], hf.num_heads[i]
        assert trace.embeddings[i] == Embedding(window=window, in_grid=in_grid, grid=grid)
        assert trace.features[i].shape == (b, dim, *grid)
        expected_blocks += [(i, grid, key_grid, kv, prefix, (b, heads, len(prefix) + grid[0] * grid[1],
                                                             len(prefix) + key_grid[0] * key_grid[1]),
                             (b, len(prefix) + grid[0] * grid[1], dim))] * hf.depth[i]
        in_grid = grid
    assert [(blk.stage, blk.query_grid, blk.key_grid, blk.key_window, blk.prefix_kinds, tuple(blk.attn.shape),
             tuple(blk.tokens.shape)) for blk in trace.blocks] == expected_blocks


def test_cvt13_at_224_has_56x56_queries_attending_to_28x28_keys():
    blocks = cvt_run("cvt13_224").trace.blocks
    first, last = blocks[0], blocks[-1]
    assert (first.query_grid, first.key_grid, first.attn.shape[-2:]) == ((56, 56), (28, 28), (3136, 784))
    assert (last.query_grid, last.key_grid, last.attn.shape[-2:]) == ((14, 14), (7, 7), (197, 50))


def test_cvt_tokens_are_transformers_layer_outputs():
    run = cvt_run("cvt13_150x262_stage3_depth3")
    with torch.no_grad(), outputs_of(layers(run.reference)) as outputs:
        run.reference(run.pixels)
    assert len(outputs) == len(run.trace.blocks)
    for i, (block, ref) in enumerate(zip(run.trace.blocks, outputs)):
        assert_max_abs(block.tokens, ref, 1e-5 * ref.abs().max().item(), f"block {i} tokens")


@pytest.mark.parametrize("stages, depth, config", [(CVT_13, (1, 2, 10), {}), (CVT_21, (1, 4, 16), {}),
                                                   (CVT_W24, (2, 2, 20), W24)], ids=["cvt13", "cvt21", "cvtw24"])
def test_cvt_presets_equal_the_published_transformers_configs(stages, depth, config):
    published = CvtConfig(num_labels=1000, depth=list(depth), **config).to_dict()
    assert CvTConfig(stages=stages) == CvTConfig.from_transformers(published)


@pytest.mark.parametrize("keep", [("id2label",), ("num_labels",), ()], ids=["id2label", "num_labels", "neither"])
def test_cvt_class_count_is_read_as_transformers_reads_it(keep):
    saved = CvtConfig(num_labels=7).to_dict()
    for key in {"id2label", "label2id", "num_labels"} - set(keep):
        saved.pop(key, None)
    if keep == ("num_labels",):
        saved["num_labels"] = 7
    assert CvTConfig.from_transformers(saved).num_classes == CvtConfig.from_dict(saved).num_labels


# ----------------------------------------------------------------------------------------- trace, both models

def test_trace_is_the_fast_forward_for_both_models():
    for run in (vit_run("deit_tiny_distilled_patch16_224"), cvt_run("cvt13_224")):
        assert_max_abs(run.trace.logits, run.logits, 1e-5, f"{type(run.ours).__name__} trace vs forward logits")


@pytest.mark.parametrize("model", ["vit", "cvt"])
def test_trace_with_grad_gives_nonzero_logit_gradients_wrt_every_attention(model):
    run = vit_run("vit_small_patch14_reg4_dinov2_126") if model == "vit" else cvt_run("cvt13_150x262_stage3_depth3")
    trace = run.ours.trace(run.pixels, grad=True)
    target = trace.logits[0].argmax()
    grads = torch.autograd.grad(trace.logits[0, target], trace.attentions)
    assert len(grads) == len(trace.blocks)
    for i, (grad, attn) in enumerate(zip(grads, trace.attentions)):
        assert grad.shape == attn.shape
        assert grad[0].abs().max() > 0, f"block {i}: zero gradient"
        assert grad[1:].abs().max() == 0, f"block {i}: another image's attention moved this image's logit"


def assert_a_slice_of_blocks_keeps_attention_and_graph_only_there(model: nn.Module, pixels: Tensor, start: int):
    """trace(attention=slice(start, None), grad=True): the same logits and the same gradients of the kept attention
    maps as a full grad trace; no maps, no graph and no pixel gradient before them (LeGrad's trace)."""
    full, lean = model.trace(pixels, grad=True), model.trace(pixels, grad=True, attention=slice(start, None))
    kept = range(len(full.blocks))[start:]
    assert [b.attn is not None for b in lean.blocks] == [i in kept for i in range(len(full.blocks))]
    assert not any(b.tokens.requires_grad for b in lean.blocks[:kept.start]) and lean.pixels is None
    assert_max_abs(lean.logits, full.logits, 1e-5, "logits")
    score = lambda trace: trace.logits[:, 0].sum()
    ours = torch.autograd.grad(score(lean), [lean.blocks[i].attn for i in kept])
    theirs = torch.autograd.grad(score(full), [full.blocks[i].attn for i in kept])
    for i, a, b in zip(kept, ours, theirs):
        assert b.abs().max() > 0
        assert_max_abs(a, b, 1e-5 * float(b.abs().max()), f"block {i}'s attention gradient")


@pytest.mark.parametrize("model", ["vit", "cvt"])
def test_a_trace_of_the_last_blocks_keeps_their_attention_and_graph_only(model):
    run = vit_run("vit_small_patch14_reg4_dinov2_126") if model == "vit" else cvt_run("cvt13_150x262_stage3_depth3")
    assert_a_slice_of_blocks_keeps_attention_and_graph_only_there(run.ours, run.pixels, -2)


@pytest.mark.parametrize("model", ["vit", "cvt"])
def test_trace_keeps_no_graph_by_default(model):
    run = vit_run("vit_tiny_patch16_224") if model == "vit" else cvt_run("cvt13_150x262_stage3_depth3")
    assert all(p.requires_grad for p in run.ours.parameters())   # so a kept graph would show
    trace = run.ours.trace(run.pixels)
    assert trace.logits.grad_fn is None and not trace.logits.requires_grad
    assert not any(t.requires_grad for blk in trace.blocks for t in (blk.attn, blk.tokens))
    assert not any(f.requires_grad for f in trace.features)


# ----------------------------------------------------------------------------------------- load_weights

def small_vit() -> ViT:
    return ViT(ViTConfig(img_size=(32, 32), patch_size=16, embed_dim=24, depth=1, num_heads=2, num_classes=10))


def test_load_weights_names_a_wrongly_shaped_tensor():
    model = small_vit()
    state = model.state_dict() | {"head.weight": torch.zeros(1000, 24)}
    with pytest.raises(ValueError, match=r"head\.weight.*\[1000, 24\].*\[10, 24\]"):
        load_weights(model, state)


def test_load_weights_names_a_missing_key():
    model = small_vit()
    state = {k: v for k, v in model.state_dict().items() if k != "blocks.0.attn.qkv.weight"}
    with pytest.raises(ValueError, match=r"missing \['blocks\.0\.attn\.qkv\.weight'\]"):
        load_weights(model, state)


def test_load_weights_names_keys_the_model_has_no_place_for():
    # LayerScale weights into a ViT configured without LayerScale
    dinov2 = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=28, depth=1, num_classes=10)
    model = ViT(dataclasses.replace(vit_config_of(dinov2), init_values=None))
    with pytest.raises(ValueError, match=r"unexpected \['blocks\.0\.ls1\.gamma', 'blocks\.0\.ls2\.gamma'\]"):
        load_weights(model, dinov2.state_dict())


def small_transformers_cvt() -> CvtForImageClassification:
    return CvtForImageClassification(CvtConfig(num_labels=10, depth=[1, 2, 3], embed_dim=[8, 16, 24],
                                               num_heads=[1, 2, 3]))


def test_load_weights_takes_a_converted_transformers_cvt_without_batchnorm_counters():
    reference = small_transformers_cvt()
    state = reference.state_dict()
    assert any(k.endswith("num_batches_tracked") for k in state)
    load_weights(CvT(CvTConfig.from_transformers(reference.config.to_dict())), convert_transformers_state_dict(state))


def test_load_weights_names_the_blocks_a_cvt_checkpoint_lacks():
    reference = small_transformers_cvt()
    deeper = CvT(CvTConfig.from_transformers(reference.config.to_dict() | {"depth": [1, 2, 4]}))
    with pytest.raises(ValueError, match=r"missing \['stages\.2\.blocks\.3\."):
        load_weights(deeper, convert_transformers_state_dict(reference.state_dict()))
