"""The logit lens and the residual share against timm's and transformers' own modules on perturbed weights:
each block's tokens, hooked in the reference, through the reference's final norm and head."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from test_models import assert_max_abs, cvt_run, layers, outputs_of, vit_run
from vitviz.explain import (
    final_class_probability,
    lens_layers,
    logit_lens,
    patch_top_class,
    relative_depth,
    residual_share,
)
from vitviz.models import ViT, ViTConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VIT_CASES = ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "vit_small_patch8_avg_64"]


def timm_block_outputs(run) -> list[Tensor]:
    with torch.no_grad(), outputs_of(list(run.reference.blocks)) as outputs:
        run.reference(run.pixels)
    return outputs


@pytest.mark.parametrize("case", VIT_CASES)
def test_vit_logit_lens_is_each_block_through_timms_norm_and_head(case):
    """timm's `forward_head(norm(x))` on every block's output: the class token through `norm` and `head`; DeiT's
    class and distillation tokens through `head` and `head_dist`, averaged; a mean-pooling model's grid mean
    through `fc_norm`."""
    run = vit_run(case)
    reference = run.reference
    with torch.no_grad():
        expected = torch.stack([reference.forward_head(reference.norm(x)) for x in timm_block_outputs(run)], dim=1)
    lens = logit_lens(run.ours, run.trace)
    assert lens_layers(run.trace) == list(range(len(reference.blocks)))
    assert_max_abs(lens, expected, 1e-5, "logit lens")
    assert_max_abs(lens[:, -1], run.ref_logits, 1e-5, "last row against timm's logits")
    assert_max_abs(lens[:, -1], run.trace.logits, 1e-6, "last row against the trace's logits")


@pytest.mark.parametrize("case", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_vit_per_patch_lens_is_every_grid_token_through_timms_norm_and_head(case):
    run = vit_run(case)
    r = run.reference
    prefix = run.trace.blocks[0].prefix
    h, w = run.trace.blocks[0].query_grid
    with torch.no_grad():
        expected = []
        for x in timm_block_outputs(run):
            grid = r.fc_norm(r.norm(x[:, prefix:]))
            logits = r.head(grid) if getattr(r, "head_dist", None) is None else (r.head(grid) + r.head_dist(grid)) / 2
            expected.append(logits.unflatten(1, (h, w)))
    lens = logit_lens(run.ours, run.trace, per_patch=True)
    assert lens.shape == (len(run.pixels), len(expected), h, w, run.ref_logits.shape[-1])
    assert_max_abs(lens, torch.stack(expected, dim=1), 1e-5, "per-patch lens")


def test_cvt_logit_lens_reads_the_last_stage_through_transformers_layernorm_and_classifier():
    run = cvt_run("cvt13_150x262_stage3_depth3")
    r = run.reference
    with torch.no_grad(), outputs_of(layers(r)) as outputs:
        r(run.pixels)
    stage3 = outputs[-len(r.cvt.encoder.stages[-1].layers):]
    with torch.no_grad():
        expected = torch.stack([r.classifier(r.layernorm(x[:, :1]).mean(dim=1)) for x in stage3], dim=1)
        h, w = run.trace.blocks[-1].query_grid
        per_patch = torch.stack([r.classifier(r.layernorm(x[:, 1:])).unflatten(1, (h, w)) for x in stage3], dim=1)
    assert lens_layers(run.trace) == [3, 4, 5]   # stages of 1, 2 and 3 blocks: the class token is in the last
    tol = 1e-5 * expected.abs().max().item()
    assert_max_abs(logit_lens(run.ours, run.trace), expected, tol, "CvT logit lens")
    assert_max_abs(logit_lens(run.ours, run.trace, per_patch=True), per_patch, 1e-5 * per_patch.abs().max().item(),
                   "CvT per-patch lens")
    assert_max_abs(logit_lens(run.ours, run.trace)[:, -1], run.ref_logits, tol, "last row against the logits")
    assert relative_depth(run.trace, lens_layers(run.trace)) == [4 / 6, 5 / 6, 1.0]


def test_a_model_without_a_classifier_has_no_logit_lens():
    model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, num_classes=0, embed_dim=32, depth=2, num_heads=2)).eval()
    trace = model.trace(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="no classifier"):
        logit_lens(model, trace)


def test_final_class_probability_and_per_patch_top_class_read_the_lens():
    run = vit_run("vit_tiny_patch16_224")
    lens = logit_lens(run.ours, run.trace).softmax(dim=-1)
    final = run.trace.logits.argmax(dim=-1)
    curve = final_class_probability(run.ours, run.trace)
    assert curve.shape == lens.shape[:2]
    assert_max_abs(curve[:, -1], run.trace.logits.softmax(dim=-1).max(dim=-1).values, 1e-6, "last point")
    assert_max_abs(curve[:, 3], lens[torch.arange(len(final)), 3, final], 1e-7, "block 4")
    classes, probs = patch_top_class(run.ours, run.trace, 5)
    per_patch = logit_lens(run.ours, run.trace, per_patch=True)[:, 5].softmax(dim=-1)
    assert torch.equal(classes, per_patch.argmax(dim=-1)) and classes.shape == per_patch.shape[:3]
    assert_max_abs(probs, per_patch.max(dim=-1).values, 1e-7, "top-class probability")
    cvt = cvt_run("cvt13_150x262_stage3_depth3")
    with pytest.raises(ValueError, match="no logit-lens reading"):
        patch_top_class(cvt.ours, cvt.trace, 0)   # stage 1: no class token, not the classifier's width


def ratios(inputs: list[Tensor], outputs: list[Tensor], prefix: int) -> tuple[Tensor, Tensor]:
    """||x_in|| / ||x_out - x_in|| written out: (class token, mean over grid tokens), b L each."""
    r = [x.norm(dim=-1) / (y - x).norm(dim=-1) for x, y in zip(inputs, outputs)]
    return torch.stack([t[:, 0] for t in r], dim=1), torch.stack([t[:, prefix:].mean(dim=1) for t in r], dim=1)


def test_vit_residual_share_equals_timm_block_inputs_and_outputs():
    run = vit_run("deit_tiny_distilled_patch16_224")
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in run.reference.blocks]
    try:
        outputs = timm_block_outputs(run)
    finally:
        for hook in hooks:
            hook.remove()
    cls, grid = ratios(inputs, outputs, prefix=2)
    share = residual_share(run.trace)
    assert_max_abs(share.cls, cls, 1e-4, "class token")
    assert_max_abs(share.grid, grid, 1e-4, "grid tokens")
    assert (share.grid > 0).all()


def test_cvt_residual_share_equals_transformers_layer_inputs_and_outputs():
    run = cvt_run("cvt13_150x262_stage3_depth3")
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for layer in layers(run.reference)]
    try:
        with torch.no_grad(), outputs_of(layers(run.reference)) as outputs:
            run.reference(run.pixels)
    finally:
        for hook in hooks:
            hook.remove()
    share = residual_share(run.trace)
    for i, block in enumerate(run.trace.blocks):
        cls, grid = ratios(inputs[i:i + 1], outputs[i:i + 1], prefix=block.prefix)
        assert_max_abs(share.grid[:, i], grid[:, 0], 1e-4 * grid.abs().max().item(), f"block {i} grid")
        if block.prefix:
            assert_max_abs(share.cls[:, i], cls[:, 0], 1e-4 * cls.abs().max().item(), f"block {i} class token")
        else:
            assert share.cls[:, i].isnan().all(), "stages 1 and 2 have no class token"
