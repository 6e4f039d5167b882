"""vitviz.explain against the papers' formulas, written out here independently (numpy loops and dense matrices)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vitviz import explain
from vitviz.explain.rollout import discard_lowest
from vitviz.models import BlockTrace, CvT, CvTConfig, CvTStageConfig, Embedding, Trace, ViT, ViTConfig, Window
from vitviz.models.cvt import CVT_13

REPO = Path(__file__).parents[1]
FUSIONS = ("mean", "max", "min")


# ---------------------------------------------------------------- references, written from the papers

def fuse(attn: np.ndarray, fusion: str) -> np.ndarray:
    """h n m -> n m."""
    return {"mean": attn.mean(0), "max": attn.max(0), "min": attn.min(0)}[fusion]


def discard_rows(a: np.ndarray, ratio: float, class_column: int | None) -> np.ndarray:
    """Zero the lowest `ratio` of each row's entries other than the class column (one image)."""
    a = a.copy()
    for q in range(a.shape[0]):
        cols = [c for c in range(a.shape[1]) if c != class_column]
        lowest = sorted(cols, key=lambda c: a[q, c])[:int(ratio * len(cols))]
        a[q, lowest] = 0.0
    return a


def paper_rollout(attns: list[np.ndarray], *, fusion="mean", discard=0.0, start=0, prefix=1) -> np.ndarray:
    """Abnar & Zuidema: aug = (A + I) / rowsum, joint_i = aug_i @ joint_(i-1); class row, grid columns. b n."""
    out = []
    for b in range(attns[0].shape[0]):
        n = attns[0].shape[-1]
        joint = np.eye(n)
        for attn in attns[start:]:
            a = discard_rows(fuse(attn[b], fusion), discard, 0) if discard else fuse(attn[b], fusion)
            aug = a + np.eye(n)
            aug = aug / aug.sum(-1, keepdims=True)
            joint = aug @ joint
        out.append(joint[0, prefix:])
    return np.stack(out)


def window_operator(window: Window, grid: tuple[int, int], in_grid: tuple[int, int]) -> np.ndarray:
    """(h w) x (h' w'): output token j spread uniformly over the valid in-grid positions of its window."""
    k, s, p = window.kernel, window.stride, window.padding
    op = np.zeros((grid[0] * grid[1], in_grid[0] * in_grid[1]))
    for oy in range(grid[0]):
        for ox in range(grid[1]):
            ys = [y for y in range(s * oy - p, s * oy - p + k) if 0 <= y < in_grid[0]]
            xs = [x for x in range(s * ox - p, s * ox - p + k) if 0 <= x < in_grid[1]]
            for y in ys:
                for x in xs:
                    op[oy * grid[1] + ox, y * in_grid[1] + x] = 1.0 / (len(ys) * len(xs))
    return op


def block_operator(block: BlockTrace) -> np.ndarray:
    """Dense D for a block: prefix keys to themselves, grid keys over their window."""
    grid = window_operator(block.key_window, block.key_grid, block.query_grid)
    p = block.prefix
    d = np.zeros((p + grid.shape[0], p + grid.shape[1]))
    d[:p, :p] = np.eye(p)
    d[p:, p:] = grid
    return d


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = (x.flatten().argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


# ---------------------------------------------------------------- fixtures

def random_trace(*, prefix_kinds=("cls",), grid=(3, 5), depth=4, heads=3, batch=2, seed=0, uniform=False) -> Trace:
    """A ViT-shaped trace with random (or uniform) row-stochastic attentions."""
    g = torch.Generator().manual_seed(seed)
    n = len(prefix_kinds) + grid[0] * grid[1]
    blocks = []
    for _ in range(depth):
        logits = torch.zeros(batch, heads, n, n) if uniform else 3 * torch.randn(batch, heads, n, n, generator=g)
        blocks.append(BlockTrace(attn=logits.softmax(-1), tokens=torch.randn(batch, n, 8, generator=g), stage=0,
                                 query_grid=grid, key_grid=grid, key_window=Window(1, 1, 0),
                                 prefix_kinds=prefix_kinds))
    return Trace(logits=torch.randn(batch, 4, generator=g), blocks=blocks,
                 embeddings=[Embedding(Window(4, 4, 0), (4 * grid[0], 4 * grid[1]), grid)],
                 features=[torch.zeros(batch, 8, *grid)], input_size=(4 * grid[0], 4 * grid[1]))


def tiny_vit(seed=0, **overrides) -> ViT:
    torch.manual_seed(seed)
    config = dict(img_size=(32, 48), patch_size=8, num_classes=5, embed_dim=32, depth=3, num_heads=2)
    model = ViT(ViTConfig(**{**config, **overrides})).eval()
    with torch.no_grad():   # away from the init, so attentions are peaked and gradients sizeable
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def tiny_cvt(seed=0, **stage_overrides) -> CvT:
    """32 px in: 16x16, 8x8 and 4x4 (+ class token) token grids; keys at stride 2 unless overridden."""
    torch.manual_seed(seed)
    stages = tuple(CvTStageConfig(embed_dim=d, depth=n, num_heads=h, patch_size=3, patch_stride=2, patch_padding=1,
                                  cls_token=i == 2, **stage_overrides)
                   for i, (d, h, n) in enumerate(zip((8, 16, 16), (1, 2, 2), (1, 2, 3))))
    model = CvT(CvTConfig(stages=stages, num_classes=5)).eval()
    with torch.no_grad():   # non-trivial BatchNorm statistics, so the k/v projections are not near-identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
    return model


def cvt13_tiny() -> CvT:
    """CvT-13's geometry (embeddings, windows, depths) with tiny widths."""
    torch.manual_seed(0)
    stages = tuple(dataclasses.replace(s, embed_dim=8 * (i + 1), num_heads=i + 1) for i, s in enumerate(CVT_13))
    return CvT(CvTConfig(stages=stages, num_classes=5)).eval()


def np_attns(trace: Trace, blocks=None) -> list[np.ndarray]:
    return [trace.blocks[i].attn.detach().double().numpy() for i in (blocks or range(len(trace.blocks)))]


# ---------------------------------------------------------------- ViT rollout

@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("discard", [0.0, 0.4])
@pytest.mark.parametrize("start_layer", [0, 2])
def test_rollout_equals_paper_formula_for_every_head_fusion_and_discard(fusion, discard, start_layer):
    trace = random_trace()
    ours = explain.attention_rollout(trace, head_fusion=fusion, discard_ratio=discard, start_layer=start_layer)
    reference = paper_rollout(np_attns(trace), fusion=fusion, discard=discard, start=start_layer)
    assert ours.shape == (2, 3, 5)
    np.testing.assert_allclose(ours.flatten(1).numpy(), reference, atol=1e-6)


def test_discard_is_per_query_row_keeps_the_class_column_and_covers_every_image():
    # the class column holds each row's smallest value, and image 1 differs from image 0
    fused = torch.rand(2, 4, 6) + 0.1
    fused[:, :, 0] = 0.01
    out = discard_lowest(fused, 0.5, keep_column=0)
    assert (out[:, :, 0] == 0.01).all()
    assert ((out[:, :, 1:] == 0).sum(-1) == int(0.5 * 5)).all()   # in every row of every image
    for b in range(2):
        for q in range(4):
            survivors = fused[b, q, 1:][out[b, q, 1:] > 0]
            assert survivors.min() >= fused[b, q, 1:][out[b, q, 1:] == 0].max()


def test_uniform_attention_gives_a_uniform_map():
    for prefix_kinds in [("cls",), ("cls", "dist"), ("reg",) * 4]:
        rollout = explain.attention_rollout(random_trace(prefix_kinds=prefix_kinds, uniform=True))
        torch.testing.assert_close(rollout, rollout[:, :1, :1].expand_as(rollout))


@pytest.mark.parametrize("overrides", [
    dict(dist_token=True),
    dict(reg_tokens=4),
    dict(class_token=False, reg_tokens=4, global_pool="avg"),
], ids=["distilled", "registers", "registers-no-class-token"])
def test_distilled_and_register_vits_give_finite_non_negative_maps_on_their_non_square_grid(overrides):
    model = tiny_vit(**overrides)
    pixels = torch.randn(2, 3, 32, 48)
    trace = model.trace(pixels, grad=True)
    maps = [explain.attention_rollout(trace), explain.attention_rollout(trace, head_fusion="max", discard_ratio=0.5),
            explain.gradient_rollout_from_trace(trace), explain.chefer_relevance_from_trace(trace),
            explain.gradient_rollout(model, pixels), explain.chefer_relevance(model, pixels, target=1)]
    for m in maps:
        assert m.shape == (2, 4, 6)
        assert torch.isfinite(m).all() and (m >= 0).all()


def test_rollout_of_a_model_without_class_token_reads_the_mean_grid_row():
    trace = random_trace(prefix_kinds=("reg",) * 4)
    joint = np.eye(19)
    for attn in np_attns(trace):
        aug = attn[0].mean(0) + np.eye(19)
        joint = aug / aug.sum(-1, keepdims=True) @ joint
    np.testing.assert_allclose(explain.attention_rollout(trace)[0].flatten().numpy(), joint[4:, 4:].mean(0), atol=1e-6)


# ---------------------------------------------------------------- gradient methods

def own_gradients(model, pixels, target: torch.Tensor):
    trace = model.trace(pixels, grad=True)
    grads = torch.autograd.grad(trace.logits.gather(1, target[:, None]).sum(), trace.attentions)
    return trace, [a.detach().double().numpy() for a in trace.attentions], [g.double().numpy() for g in grads]


def gradient_rollout_formula(attns, grads, operators=None, prefix=1):
    """Per block: clamp(mean_h(grad * A), 0) [then · D], rolled out; class row, grid columns. b n."""
    out = []
    for b in range(attns[0].shape[0]):
        joint = None
        for i, (a, g) in enumerate(zip(attns, grads)):
            weighted = np.clip((g[b] * a[b]).mean(0), 0, None)
            weighted = weighted if operators is None else weighted @ operators[i]
            aug = weighted + np.eye(len(weighted))
            aug = aug / aug.sum(-1, keepdims=True)
            joint = aug if joint is None else aug @ joint
        out.append(joint[0, prefix:])
    return np.stack(out)


def chefer_formula(attns, grads, operators=None, prefix=1):
    """R = I; for each block: R <- R + mean_h(clamp(grad * A, min=0)) [· D] @ R; class row, grid columns. b n."""
    out = []
    for b in range(attns[0].shape[0]):
        relevance = np.eye(attns[0].shape[2])
        for i, (a, g) in enumerate(zip(attns, grads)):
            cam = np.clip(g[b] * a[b], 0, None).mean(0)
            relevance = relevance + (cam if operators is None else cam @ operators[i]) @ relevance
        out.append(relevance[0, prefix:])
    return np.stack(out)


def test_gradient_rollout_weighs_each_layer_by_its_own_gradient_not_the_reversed_one():
    model, pixels = tiny_vit(), torch.randn(2, 3, 32, 48)
    target = torch.tensor([1, 3])
    _, attns, grads = own_gradients(model, pixels, target)
    ours = explain.gradient_rollout(model, pixels, target).flatten(1).numpy()
    np.testing.assert_allclose(ours, gradient_rollout_formula(attns, grads), rtol=1e-5, atol=1e-9)
    reversed_pairing = gradient_rollout_formula(attns, grads[::-1])   # vit-explain's bug
    assert (np.abs(ours - reversed_pairing).max(-1) > 0.1 * ours.max(-1)).all()


def test_chefer_relevance_equals_its_formula_with_the_rows_clamped_before_the_head_mean():
    model, pixels = tiny_vit(seed=1), torch.randn(2, 3, 32, 48)
    target = torch.tensor([0, 4])
    _, attns, grads = own_gradients(model, pixels, target)
    ours = explain.chefer_relevance(model, pixels, target).flatten(1).numpy()
    np.testing.assert_allclose(ours, chefer_formula(attns, grads), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["chefer_relevance", "gradient_rollout", "legrad", "gradcam", "attnlrp"])
def test_methods_that_explain_a_class_default_to_each_images_top_prediction(method):
    model, pixels = tiny_vit(), torch.randn(3, 3, 32, 48)
    top = model(pixels).argmax(-1)
    assert len(set(top.tolist())) > 1   # otherwise the test could not tell "per image" from "image 0's"
    maps = getattr(explain, method)
    torch.testing.assert_close(maps(model, pixels), maps(model, pixels, top))


def test_gradient_methods_refuse_a_trace_without_gradients_and_a_model_in_training_mode():
    model, pixels = tiny_vit(), torch.randn(1, 3, 32, 48)
    with pytest.raises(ValueError, match="grad=True"):
        explain.chefer_relevance_from_trace(model.trace(pixels))
    with pytest.raises(ValueError, match="model.eval"):
        explain.gradient_rollout(model.train(), pixels)


# ---------------------------------------------------------------- CvT

@pytest.mark.parametrize("window, in_grid", [(Window(3, 2, 1), (7, 5)), (Window(3, 1, 1), (4, 6)),
                                             (Window(7, 4, 2), (15, 9)), (Window(1, 1, 0), (3, 4))])
def test_key_operator_rows_sum_to_one_and_spread_over_the_valid_window(window, in_grid):
    grid = tuple((n + 2 * window.padding - window.kernel) // window.stride + 1 for n in in_grid)
    n_out = grid[0] * grid[1]
    ours = explain.spread_to_input(torch.eye(n_out, dtype=torch.float64), window, grid=grid, in_grid=in_grid)
    torch.testing.assert_close(ours.sum(-1), torch.ones(n_out, dtype=torch.float64))
    np.testing.assert_allclose(ours.numpy(), window_operator(window, grid, in_grid), atol=1e-12)


def test_key_operator_applied_to_columns_is_the_same_matrix():
    block = tiny_cvt().trace(torch.randn(1, 3, 32, 32)).blocks[-1]   # 4x4 queries, 2x2 keys, class token
    d = torch.from_numpy(block_operator(block))
    u = torch.randn(3, d.shape[1], dtype=torch.float64)
    v = torch.randn(3, d.shape[0], dtype=torch.float64)
    torch.testing.assert_close(explain.queries_to_keys(u, block), u @ d.T)
    torch.testing.assert_close(explain.keys_to_queries(v, block), v @ d)


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("discard", [0.0, 0.3])
def test_cvt_rollout_with_key_value_stride_1_reduces_to_plain_rollout(fusion, discard):
    model = tiny_cvt(kernel_qkv=1, padding_q=0, stride_kv=1, padding_kv=0)
    trace = model.trace(torch.randn(2, 3, 32, 32))
    last = [i for i, b in enumerate(trace.blocks) if b.stage == 2]
    assert all(trace.blocks[i].key_grid == trace.blocks[i].query_grid for i in last)
    ours = explain.attention_rollout(trace, head_fusion=fusion, discard_ratio=discard)
    reference = paper_rollout(np_attns(trace, last), fusion=fusion, discard=discard)
    np.testing.assert_allclose(ours.flatten(1).numpy(), reference, atol=1e-6)


def stage_product(trace: Trace, stage: int, matrix) -> np.ndarray:
    """Dense product of matrix(block) over a stage's blocks, later blocks on the left."""
    joint = None
    for block in trace.blocks:
        if block.stage == stage:
            m = matrix(block)
            joint = m if joint is None else m @ joint
    return joint


def test_cvt_rollout_equals_the_dense_half_identity_plus_half_attention_times_d_formula():
    trace = tiny_cvt().trace(torch.randn(2, 3, 32, 32))

    def tilde(b):
        return lambda block: 0.5 * np.eye(block.attn.shape[2]) + \
            0.5 * block.attn[b].detach().double().mean(0).numpy() @ block_operator(block)

    ours, ours_stage1 = explain.attention_rollout(trace), explain.attention_rollout(trace, to_stage=0)
    for b in range(2):
        row = stage_product(trace, 2, tilde(b))[0, 1:]                 # class row, stage-3 grid
        np.testing.assert_allclose(ours[b].flatten().numpy(), row, atol=1e-6)
        for stage in (2, 1):   # back through each embedding's window, then the earlier stage's rollout
            e = trace.embeddings[stage]
            row = row @ window_operator(e.window, e.grid, e.in_grid) @ stage_product(trace, stage - 1, tilde(b))
        np.testing.assert_allclose(ours_stage1[b].flatten().numpy(), row, atol=1e-6)


def test_cvt_gradient_methods_equal_their_formulas_with_the_key_operator():
    model, pixels = tiny_cvt(), torch.randn(2, 3, 32, 32)
    target = torch.tensor([2, 0])
    trace, attns, grads = own_gradients(model, pixels, target)
    last = [i for i, b in enumerate(trace.blocks) if b.stage == 2]
    operators = [block_operator(trace.blocks[i]) for i in last]
    attns, grads = [attns[i] for i in last], [grads[i] for i in last]
    np.testing.assert_allclose(explain.gradient_rollout(model, pixels, target).flatten(1).numpy(),
                               gradient_rollout_formula(attns, grads, operators), atol=1e-6)
    np.testing.assert_allclose(explain.chefer_relevance(model, pixels, target).flatten(1).numpy(),
                               chefer_formula(attns, grads, operators), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [224, 384])
def test_cvt13_geometry_maps_have_the_stage_grid_shapes(size):
    model = cvt13_tiny()
    trace = model.trace(torch.randn(1, 3, size, size), grad=True)
    g1, g3 = size // 4, size // 16   # stage-1 and stage-3 token grids
    assert explain.attention_rollout(trace).shape == (1, g3, g3)
    assert explain.gradient_rollout_from_trace(trace).shape == (1, g3, g3)
    assert explain.chefer_relevance_from_trace(trace).shape == (1, g3, g3)
    stage1 = explain.attention_rollout(trace, to_stage=0)
    assert stage1.shape == (1, g1, g1) and torch.isfinite(stage1).all() and (stage1 >= 0).all()
    assert explain.class_attention(trace).shape == (1, 3, g3 // 2, g3 // 2)           # every head, stage-3 keys
    assert explain.class_attention(trace, on_query_grid=True).shape == (1, 3, g3, g3)
    assert explain.query_attention(trace, layer=0, query=(5, 7)).shape == (1, g1 // 2, g1 // 2)
    assert explain.key_attention(trace, layer=2, patch=(3, 1)).shape == (1, g1 // 2, g1 // 2)   # stage 2


# ---------------------------------------------------------------- raw attention, distance, norms

def test_raw_attention_rows_and_columns_read_the_attention_tensor():
    trace = tiny_vit().trace(torch.randn(2, 3, 32, 48))
    attn = trace.blocks[1].attn   # b h 25 25: class token + 4x6 grid
    torch.testing.assert_close(explain.query_attention(trace, layer=1, query=(2, 3), head=1),
                               attn[:, 1, 1 + 2 * 6 + 3, 1:].reshape(2, 4, 6))
    torch.testing.assert_close(explain.query_attention(trace, layer=1), attn[:, :, 0, 1:].mean(1).reshape(2, 4, 6))
    torch.testing.assert_close(explain.key_attention(trace, layer=1, patch=(2, 3)),
                               attn[:, :, 1:, 1 + 2 * 6 + 3].mean(1).reshape(2, 4, 6))
    torch.testing.assert_close(explain.class_attention(trace, layer=1), attn[:, :, 0, 1:].reshape(2, 2, 4, 6))


def test_cvt_key_column_is_the_patchs_column_of_attention_times_d():
    trace = tiny_cvt().trace(torch.randn(2, 3, 32, 32))
    block = trace.blocks[1]   # stage 2: 8x8 queries, 4x4 keys, no class token
    column = block.attn.mean(1).double().numpy() @ block_operator(block)[:, 3 * 8 + 5]
    np.testing.assert_allclose(explain.key_attention(trace, layer=1, patch=(3, 5)).flatten(1).numpy(), column,
                               atol=1e-6)
    with pytest.raises(ValueError, match="no 'cls' token"):
        explain.query_attention(trace, layer=1)


def mad_loop(attn: np.ndarray, queries: list, keys: list, prefix: int) -> np.ndarray:
    """h: mean over grid queries of sum_k a_qk |c_q - c_k| / sum_k a_qk, grid keys only (one image)."""
    out = np.zeros(attn.shape[0])
    for h in range(attn.shape[0]):
        total = 0.0
        for q, cq in enumerate(queries):
            row = attn[h, prefix + q, prefix:]
            total += sum(row[k] * math.dist(cq, ck) for k, ck in enumerate(keys)) / row.sum()
        out[h] = total / len(queries)
    return out


def rf_centres(windows: list[Window], grid: tuple[int, int]) -> list[tuple[float, float]]:
    """Receptive-field centres in pixels of a grid made by a chain of windows, by unrolling the chain."""
    def centre(i: int, chain: list[Window]) -> float:
        if not chain:
            return i + 0.5   # a pixel's centre
        w = chain[-1]
        taps = range(w.stride * i - w.padding, w.stride * i - w.padding + w.kernel)
        return float(np.mean([centre(t, chain[:-1]) for t in taps]))
    return [(centre(y, windows), centre(x, windows)) for y in range(grid[0]) for x in range(grid[1])]


def test_mean_attention_distance_matches_a_direct_loop_for_vit_and_cvt():
    vit_trace = tiny_vit().trace(torch.randn(2, 3, 32, 48))
    cvt_trace = tiny_cvt().trace(torch.randn(2, 3, 32, 32))
    for trace in (vit_trace, cvt_trace):
        ours = explain.mean_attention_distance(trace)
        for i, block in enumerate(trace.blocks):
            chain = [e.window for e in trace.embeddings[:block.stage + 1]]
            queries = rf_centres(chain, block.query_grid)
            keys = rf_centres(chain + [block.key_window], block.key_grid)
            for b in range(2):
                reference = mad_loop(block.attn[b].double().numpy(), queries, keys, block.prefix)
                np.testing.assert_allclose(ours[i][b].numpy(), reference, rtol=1e-5)
    assert torch.stack(explain.mean_attention_distance(vit_trace), 1).shape == (2, 3, 2)   # b L h


def test_token_norms_are_the_l2_norms_of_each_blocks_output_tokens():
    model = tiny_vit(reg_tokens=2)
    trace = model.trace(torch.randn(2, 3, 32, 48))
    grids, prefixes = explain.token_norms(trace)
    assert len(grids) == len(prefixes) == 3
    tokens = trace.blocks[2].tokens   # b (3 + 24) c: class, 2 registers, grid
    torch.testing.assert_close(grids[2][1, 2, 3], tokens[1, 3 + 2 * 6 + 3].norm())
    torch.testing.assert_close(prefixes[2][0], tokens[0, :3].norm(dim=-1))


# ---------------------------------------------------------------- faithfulness

class RegionModel(nn.Module):
    """Class 0's logit is the mean of the top-left 8x8 pixels (times 4); class 1's is 0. Counts its forwards."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, pixels):
        self.calls += 1
        evidence = 4 * pixels[:, :, :8, :8].mean(dim=(1, 2, 3))
        return torch.stack([evidence, torch.zeros_like(evidence)], dim=1)


class BaselineShareModel(nn.Module):
    """Class 0's logit is 10x the share of pixels equal to the baseline value -5: the curve reveals the mask."""

    def forward(self, pixels):
        share = (pixels == -5).float().mean(dim=(1, 2, 3))
        return torch.stack([10 * share, torch.zeros_like(share)], dim=1)


def test_a_map_on_the_evidence_beats_the_random_order_baseline_in_deletion_and_insertion():
    pixels = 1 + torch.rand(6, 3, 32, 32)
    oracle = torch.zeros(6, 4, 4)
    oracle[:, 0, 0] = 1.0   # the 8x8 token holding all the evidence
    model, random = RegionModel(), explain.random_saliency(oracle, seed=1)
    deletion = explain.deletion_curve(model, pixels, oracle, target=0, steps=8).auc
    random_deletion = explain.deletion_curve(model, pixels, random, target=0, steps=8).auc
    assert (deletion <= random_deletion).all() and deletion.mean() < random_deletion.mean() - 0.1
    insertion = explain.insertion_curve(model, pixels, oracle, target=0, steps=8, baseline="mean").auc
    random_insertion = explain.insertion_curve(model, pixels, random, target=0, steps=8, baseline="mean").auc
    assert (insertion >= random_insertion).all() and insertion.mean() > random_insertion.mean() + 0.1


def test_curves_start_and_end_at_the_image_and_the_baseline_and_run_in_a_few_batched_forwards():
    pixels, model = 1 + torch.rand(5, 3, 32, 32), RegionModel()
    saliency = torch.rand(5, 4, 4)
    deletion = explain.deletion_curve(model, pixels, saliency, steps=10, batch_size=32)
    assert model.calls == 1 + math.ceil(5 * 11 / 32)   # the target forward, then all 55 steps in two batches
    assert deletion.fractions.shape == (11,) and deletion.scores.shape == (5, 11) and deletion.auc.shape == (5,)
    assert deletion.fractions[0] == 0 and deletion.fractions[-1] == 1
    clean = model(pixels).softmax(-1)[:, 0]
    torch.testing.assert_close(deletion.scores[:, 0], clean)
    torch.testing.assert_close(deletion.scores[:, -1], torch.full((5,), 0.5))   # baseline 'mean': all zeros
    insertion = explain.insertion_curve(model, pixels, saliency, steps=10)
    blurred = model(explain.faithfulness.baseline_image(pixels, "blur")).softmax(-1)[:, 0]
    torch.testing.assert_close(insertion.scores[:, 0], blurred)
    torch.testing.assert_close(insertion.scores[:, -1], clean)
    torch.testing.assert_close(deletion.auc, torch.trapezoid(deletion.scores, deletion.fractions, dim=-1))


@pytest.mark.parametrize("unit, region", [("token", 64), ("pixel", 1)])
def test_each_step_removes_the_top_fraction_of_regions(unit, region):
    pixels = torch.rand(2, 3, 32, 32)
    saliency = torch.rand(2, 4, 4)
    curve = explain.deletion_curve(BaselineShareModel(), pixels, saliency, target=0, steps=8, unit=unit,
                                   baseline=torch.tensor(-5.0))
    share = torch.logit(curve.scores.double()) / 10   # softmax([10 s, 0])[0] = sigmoid(10 s)
    units = 16 if unit == "token" else 32 * 32
    expected = (curve.fractions.double() * units).round() * region / (32 * 32)
    torch.testing.assert_close(share, expected.expand_as(share), atol=1e-4, rtol=0)


# ---------------------------------------------------------------- the bundled CIFAR-10 models

def bundled_model_and_test_images(name: str, cifar10: Path, count: int = 100) -> tuple[nn.Module, torch.Tensor]:
    """A bundled checkpoint and `count` CIFAR-10 test images of the file `cifar10`, spread over its classes,
    preprocessed for it."""
    from vitviz.bundle import load_bundle
    from vitviz.train import load_cifar10

    folder = REPO / "checkpoints" / name
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"bundled checkpoint missing: expected {folder}/config.json + model.safetensors "
                    f"(python -m vitviz.train --arch {name.replace('10', '')} --out checkpoints/{name})")
    model, transform, _, _ = load_bundle(folder)
    images, _, _ = load_cifar10(cifar10, "test", count)
    return model, transform.normalize(images.float() / 255)


def random_deletion_auc(model: nn.Module, pixels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The mean deletion AUC of random maps shaped `like`, over three seeds."""
    return torch.stack([explain.deletion_curve(model, pixels, explain.random_saliency(like, seed=s),
                                               steps=16).auc.mean() for s in range(3)]).mean()


@pytest.mark.parametrize("name", ["vit-cifar10", "cvt-cifar10"])
def test_every_methods_deletion_auc_is_lower_than_random_on_the_bundled_models(name, cifar10_path):
    model, pixels = bundled_model_and_test_images(name, cifar10_path)
    random = None
    for method in explain.METHODS.values():
        saliency = method.maps(model, pixels, None).detach()   # each image's top class
        random = random_deletion_auc(model, pixels, saliency) if random is None else random
        deletion = explain.deletion_curve(model, pixels, saliency, steps=16).auc.mean()
        assert deletion < random, (f"{name}: {method.name} deletion AUC {deletion:.3f} "
                                   f"is not below random's {random:.3f}")
