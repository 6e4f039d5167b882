"""AttnLRP (vitviz.explain.attnlrp) against lxt 2.1 on torchvision's ViT with the same weights, the paper's
attention rules written out, conservation on a CvT made homogeneous, thread isolation and refusals."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from test_explain import cvt13_tiny, tiny_cvt, tiny_vit
from test_models import perturb_, vit_config_of
from torchvision_vit import timm_to_torchvision
from vitviz import explain
from vitviz.models import ViT, load_weights
from vitviz.models.relevance import RelevanceRules, relevance_rules
from vitviz.models.vit import Attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LXT_SCRIPT = Path(__file__).with_name("lxt_reference.py")


def timm_vit(seed: int = 0) -> nn.Module:
    """A small class-token ViT with every parameter perturbed (biases, norms and tokens far from their init)."""
    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                              embed_dim=48, num_heads=3, num_classes=7)
    return perturb_(model, std=0.05)


def lxt_relevance(reference: nn.Module, pixels: torch.Tensor, targets: torch.Tensor, gammas, tmp_path: Path):
    """lxt's AttnLRP of torchvision's `reference` (k b h w per gamma pair), computed in a process of its own."""
    block = reference.encoder.layers[0]
    config = torch.tensor([reference.image_size, reference.patch_size, len(reference.encoder.layers),
                           block.self_attention.num_heads, reference.hidden_dim, block.mlp[0].out_features,
                           reference.num_classes])
    job, out = tmp_path / "job.safetensors", tmp_path / "out.safetensors"
    save_file({**{f"model.{k}": v.contiguous() for k, v in reference.state_dict().items()}, "pixels": pixels,
               "targets": targets, "gammas": torch.tensor(gammas, dtype=torch.float32), "config": config}, job)
    done = subprocess.run([sys.executable, str(LXT_SCRIPT), str(job), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(out)


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def test_attnlrp_equals_lxt_on_torchvision_vit_with_the_same_weights(tmp_path):
    reference_timm = timm_vit()
    ours = ViT(vit_config_of(reference_timm)).eval()
    load_weights(ours, reference_timm.state_dict())
    reference = timm_to_torchvision(reference_timm)
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reference(pixels), reference_timm(pixels), rtol=0, atol=1e-5)
        targets = torch.tensor([int(reference(pixels)[0].argmax()), 2, 5])   # a top class and two others
    gammas = [(0.25, 0.05), (0.1, 0.0), (1.0, 0.5)]
    lxt = lxt_relevance(reference, pixels, targets, gammas, tmp_path)
    torch.testing.assert_close(lxt["logits"], reference(pixels).detach(), rtol=0, atol=1e-5)   # lxt leaves values be
    for (gamma_conv, gamma_linear), expected in zip(gammas, lxt["relevance"]):
        pixel_map = explain.attnlrp(ours, pixels, targets, gamma_conv=gamma_conv, gamma_linear=gamma_linear,
                                    pixel_map=True)
        assert relative_error(pixel_map, expected) < 1e-4, (gamma_conv, gamma_linear)
        token_map = explain.attnlrp(ours, pixels, targets, gamma_conv=gamma_conv, gamma_linear=gamma_linear)
        patches = expected.reshape(3, 4, 8, 4, 8).sum(dim=(2, 4))   # 8x8-pixel patches of the 4x4 grid
        assert relative_error(token_map, patches) < 1e-4
    # the gammas matter: a rule that ignored them could not pass the loop above with three pairs
    assert relative_error(lxt["relevance"][0], lxt["relevance"][2]) > 0.05


def paper_attention_relevance(attention: Attention, x: np.ndarray, relevance_out: np.ndarray) -> np.ndarray:
    """The paper's rules through one ViT attention layer, written out for one image (n tokens, d channels):
    LRP-0 through the linear projections, the uniform rule for A v and for q k^T (each factor half of the
    product's relevance), the softmax rule R_S = S (R_A - A sum_k R_A)."""
    qkv_w, qkv_b = (t.detach().double().numpy() for t in (attention.qkv.weight, attention.qkv.bias))
    proj_w, proj_b = (t.detach().double().numpy() for t in (attention.proj.weight, attention.proj.bias))
    h = attention.heads
    n, d = x.shape
    hd = d // h

    def lrp0(inputs, weight, outputs, relevance):   # R_i = sum_j x_i w_ji R_j / z_j
        return inputs * ((relevance / outputs) @ weight)

    qkv = x @ qkv_w.T + qkv_b
    heads_out = np.zeros((n, d))
    parts = []
    for head in range(h):
        q, k, v = (qkv[:, (j * d + head * hd):(j * d + (head + 1) * hd)] for j in range(3))
        scores = q @ k.T * attention.scale
        a = np.exp(scores - scores.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out = a @ v
        heads_out[:, head * hd:(head + 1) * hd] = out
        parts.append((q, k, v, scores, a, out))
    relevance_heads = lrp0(heads_out, proj_w, heads_out @ proj_w.T + proj_b, relevance_out)
    relevance_qkv = np.zeros((n, 3 * d))
    for head, (q, k, v, scores, a, out) in enumerate(parts):
        r_out = relevance_heads[:, head * hd:(head + 1) * hd]
        ratio = r_out / out                                               # n hd
        r_a = np.einsum('ij,jd,id->ij', a, v, ratio) / 2                  # A's half of A v
        r_v = np.einsum('ij,jd,id->jd', a, v, ratio) / 2                  # v's half
        r_s = scores * (r_a - a * r_a.sum(-1, keepdims=True))            # the softmax rule
        ratio_s = r_s / scores
        r_q = np.einsum('id,jd,ij->id', q, k * attention.scale, ratio_s) / 2
        r_k = np.einsum('id,jd,ij->jd', q * attention.scale, k, ratio_s) / 2
        for j, r in enumerate((r_q, r_k, r_v)):
            relevance_qkv[:, (j * d + head * hd):(j * d + (head + 1) * hd)] = r
    return lrp0(x, qkv_w, qkv, relevance_qkv)


def test_attnlrp_attention_rules_equal_the_papers_softmax_and_uniform_rules_written_out():
    torch.manual_seed(0)
    attention = Attention(dim=12, heads=3, qkv_bias=True).double()
    with torch.no_grad():
        for p in attention.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(1, 5, 12, dtype=torch.float64, requires_grad=True)
    relevance_out = torch.randn(1, 5, 12, dtype=torch.float64)
    with relevance_rules(RelevanceRules(attention="attnlrp")):
        out = attention(x)[0]
    grad, = torch.autograd.grad(out, x, grad_outputs=relevance_out / out.detach())
    ours = (x * grad).detach()[0].numpy()
    expected = paper_attention_relevance(attention, x.detach()[0].numpy(), relevance_out[0].numpy())
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-9)
    with relevance_rules(RelevanceRules(attention="cp")):   # CP-LRP: the values alone, A a constant
        out = attention(x)[0]
    grad, = torch.autograd.grad(out, x, grad_outputs=relevance_out / out.detach())
    assert not np.allclose((x * grad).detach()[0].numpy(), expected, rtol=1e-3)


def homogeneous_(model: nn.Module) -> nn.Module:
    """Zero every bias, BatchNorm shift (bias and running mean), LayerNorm shift, class token and position embedding."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("cls_token") or name.endswith("pos_embed"):
                p.zero_()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.zero_()
    return model


@pytest.mark.parametrize("make, size", [(lambda: perturb_(tiny_cvt(), std=0.3), (32, 32)),
                                        (lambda: tiny_vit(depth=2), (32, 48))], ids=["cvt", "vit"])
def test_relevance_of_the_pixels_sums_to_the_target_logit_when_nothing_else_can_absorb_it(make, size):
    """Conservation: every rule passes on what it receives, up to the Gamma rule's 1e-6 stabiliser (zennit's,
    kept to equal lxt), which loses ~1e-6 of each layer's relevance relative to activations of order 1: hence
    1e-4 relative, and weights perturbed to realistic sizes (at init-sized weights of 0.02 the stabiliser
    alone costs 0.1-0.5 %)."""
    model = homogeneous_(make())
    pixels = torch.randn(3, 3, *size)
    logits = model(pixels).detach()
    targets = torch.tensor([0, 3, 4])
    relevance = explain.attnlrp(model, pixels, targets, pixel_map=True)
    torch.testing.assert_close(relevance.sum(dim=(1, 2)), logits.gather(1, targets[:, None])[:, 0],
                               rtol=1e-4, atol=1e-6)
    # the token map redistributes the same pixels, so it conserves too
    torch.testing.assert_close(explain.attnlrp(model, pixels, targets).sum(dim=(1, 2)), relevance.sum(dim=(1, 2)),
                               rtol=1e-5, atol=1e-6)
    # with biases back, they absorb a share: the pixels alone no longer hold the logit
    biased = make()
    held = explain.attnlrp(biased, pixels, targets, pixel_map=True).sum(dim=(1, 2))
    assert (held - biased(pixels).detach().gather(1, targets[:, None])[:, 0]).abs().max() > 1e-2


def test_cvt_token_cells_sum_the_pixels_of_each_stride_16_cell_even_when_the_grid_overhangs_the_image():
    model = cvt13_tiny()   # CvT-13's embeddings: 7x7 stride 4, then 3x3 stride 2 twice: 16 px per stage-3 cell
    pixels = torch.randn(2, 3, 40, 56)   # grids 10x14, 5x7, 3x4: 3 cells of 16 px are 48 > 40, 4 are 64 > 56
    pixel_map = explain.attnlrp(model, pixels, pixel_map=True)
    cells = explain.attnlrp(model, pixels)
    assert cells.shape == (2, 3, 4) and pixel_map.shape == (2, 40, 56)
    for i, (top, bottom) in enumerate([(0, 16), (16, 32), (32, 40)]):
        for j, (left, right) in enumerate([(0, 16), (16, 32), (32, 48), (48, 56)]):
            torch.testing.assert_close(cells[:, i, j], pixel_map[:, top:bottom, left:right].sum(dim=(1, 2)))


def test_the_rules_change_gradients_only_inside_the_block_and_only_in_its_own_thread():
    model = tiny_vit()
    pixels = torch.randn(1, 3, 32, 48, requires_grad=True)

    def input_gradient():
        return torch.autograd.grad(model(pixels)[0, 1], pixels)[0]

    plain = input_gradient()
    seen_in_other_thread = []
    with relevance_rules(RelevanceRules()):
        with torch.no_grad():
            torch.testing.assert_close(model(pixels), model(pixels.detach()))   # values never change
        modified = input_gradient()
        worker = threading.Thread(target=lambda: seen_in_other_thread.append(input_gradient()))
        worker.start()
        worker.join()
    assert (modified - plain).abs().max() > 1e-3 * plain.abs().max()
    torch.testing.assert_close(seen_in_other_thread[0], plain)
    torch.testing.assert_close(input_gradient(), plain)


def test_attnlrp_refuses_a_model_in_training_mode_and_an_unknown_attention_rule():
    model, pixels = tiny_cvt(), torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="model.eval"):
        explain.attnlrp(model.train(), pixels)
    with pytest.raises(ValueError, match="attention must be one of"):
        explain.attnlrp(model.eval(), pixels, attention="softmax")


def test_attnlrp_refuses_a_model_without_a_classifier_and_explains_a_similarity_target_instead():
    headless = tiny_vit(num_classes=0)
    pixels = torch.randn(2, 3, 32, 48)
    with pytest.raises(ValueError, match="no classifier"):
        explain.attnlrp(headless, pixels)
    with torch.no_grad():
        pooled = headless(pixels)
    target = explain.SimilarityTarget(headless, pooled[0])
    relevance = explain.attnlrp(target, pixels, 0)
    assert relevance.shape == (2, 4, 6) and torch.isfinite(relevance).all()
