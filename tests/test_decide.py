"""Direct logit attribution, token effects and activation patching against computations written here on
timm's and transformers' own models (their weights, forward hooks), with perturbed weights."""
from __future__ import annotations

import contextlib
import functools
import json

import numpy as np
import pytest
import timm
import torch
from torch import Tensor, nn
from torchvision.transforms.functional import gaussian_blur

from test_explain import block_operator, tiny_vit
from test_models import (
    VIT_STD,
    assert_max_abs,
    cvt_pair,
    cvt_run,
    layers,
    perturb_,
    transformers_cvt,
    vit_config_of,
    vit_run,
)
from vitviz import explain
from vitviz.models import ViT, load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@contextlib.contextmanager
def inputs_of(modules: list[nn.Module]):
    """Records the first positional input of `modules`, in call order, while the block is open."""
    inputs = []
    handles = [m.register_forward_pre_hook(lambda module, args: inputs.append(args[0])) for m in modules]
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def replaced_input(module: nn.Module, replace):
    """module's first positional input passed through `replace` (a copy) while the block is open."""
    handle = module.register_forward_pre_hook(lambda m, args: (replace(args[0].clone()), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp(min=1.0))


# ---------------------------------------------------------------- direct logit attribution

ATTRIBUTION_CASES = {   # id: a test_models case (perturbed timm / transformers weights)
    "class token": "vit_tiny_patch16_224",
    "registers and LayerScale": "vit_small_patch14_reg4_dinov2_126",
    "average pooling with fc_norm": "vit_small_patch8_avg_64",
    "average pooling, no class token, LayerScale": "vit_medium_patch16_gap_256",
    "DeiT distilled": "deit_tiny_distilled_patch16_224",
    "CvT-13 stage 3": "cvt13_150x262_stage3_depth3",
}


def run_of(case: str):
    return cvt_run(case) if case.startswith("cvt") else vit_run(case)


@pytest.mark.parametrize("foil", [None, 3], ids=["logit", "logit difference"])
@pytest.mark.parametrize("case", ATTRIBUTION_CASES.values(), ids=ATTRIBUTION_CASES.keys())
def test_attribution_parts_sum_to_the_logit_and_token_effects_to_the_heads(case, foil):
    run = run_of(case)
    trace = run.ours.trace(run.pixels, decompose=True)
    target = 7
    a = explain.direct_logit_attribution(run.ours, trace, target, foil=foil)
    expected = run.ref_logits[:, target] - (0 if foil is None else run.ref_logits[:, foil])
    blocks = [b for b in trace.blocks if b.stage == trace.blocks[-1].stage]
    assert a.heads.shape == (len(run.pixels), len(blocks), blocks[0].attn.shape[1])
    assert a.token_effects.shape == (*a.heads.shape, blocks[0].attn.shape[-1])
    assert relative_error(a.logit, expected) <= 1e-4, "the real logit is the reference model's"
    parts = torch.stack([a.embedding, a.bias, *a.heads.flatten(1).T, *a.attn_bias.T, *a.mlps.T])
    assert relative_error(a.total(), a.logit) <= 1e-4 * max(1.0, parts.abs().max().item())
    assert_max_abs(a.token_effects.sum(dim=-1), a.heads, 1e-5 * max(1.0, a.heads.abs().max().item()),
                   "token effects summed over keys")
    assert a.heads.abs().max() > 1e-2 * a.logit.abs().max(), "heads must write a visible part of the logit"


def timm_direct_effects(reference: nn.Module, pixels: Tensor, target: int) -> dict[str, Tensor]:
    """Each part of the class token's stream read through the final norm (scale frozen) and the head row of
    `target`, from timm's weights and its activations (forward hooks): embedding b, token effects
    b L H n, mlps b L, bias b."""
    blocks = list(reference.blocks)
    with torch.no_grad(), inputs_of(blocks + [reference.norm]) as ins, \
            contextlib.ExitStack() as stack:
        attentions, mlp_outs = [], []
        for block in blocks:
            stack.enter_context(_record(block.attn.attn_drop, attentions))
            stack.enter_context(_record(block.ls2, mlp_outs))
        reference(pixels)
        final = ins[-1][:, 0]
        sigma = (final.var(dim=-1, unbiased=False, keepdim=True) + reference.norm.eps).sqrt()
        row = reference.norm.weight * reference.head.weight[target] / sigma   # b c

        def read(y: Tensor) -> Tensor:   # ... c -> ...: through the frozen final norm and the head row
            return ((y - y.mean(dim=-1, keepdim=True)) * row.view(row.shape[0], *[1] * (y.dim() - 2), -1)).sum(-1)

        effects = []
        for block, x, attn in zip(blocks, ins, attentions):
            b, n, c = x.shape
            heads = block.attn.num_heads
            v = block.attn.qkv(block.norm1(x)).reshape(b, n, 3, heads, c // heads)[:, :, 2]   # b n H d
            gamma = getattr(block.ls1, "gamma", torch.ones(c))
            w = block.attn.proj.weight.reshape(c, heads, c // heads)                           # c H d
            writes = torch.einsum('bnhd,chd->bhnc', v, w) * gamma                              # b H n c
            effects.append(attn[:, :, 0, :] * read(writes))                                     # b H n
        return {"embedding": read(ins[0][:, 0]), "token_effects": torch.stack(effects, dim=1),
                "mlps": torch.stack([read(out[:, 0]) for out in mlp_outs], dim=1),
                "bias": (reference.head.bias[target] + reference.norm.bias @ reference.head.weight[target]).expand(b)}


@contextlib.contextmanager
def _record(module: nn.Module, into: list):
    handle = module.register_forward_hook(lambda m, args, out: into.append(out))
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("case", ["vit_tiny_patch16_224", "vit_small_patch14_reg4_dinov2_126"])
def test_per_head_and_per_token_contributions_match_a_computation_on_timms_model(case):
    run = vit_run(case)
    target = 11
    a = explain.direct_logit_attribution(run.ours, run.ours.trace(run.pixels, decompose=True), target)
    expected = timm_direct_effects(run.reference, run.pixels, target)
    assert_max_abs(a.token_effects, expected["token_effects"], 1e-5, "token effects")
    assert_max_abs(a.heads, expected["token_effects"].sum(dim=-1), 1e-5, "heads")
    for part in ("embedding", "mlps", "bias"):
        assert_max_abs(getattr(a, part), expected[part], 1e-5, part)


def test_cvt_token_effect_maps_are_the_key_maps_carried_by_a_dense_key_operator():
    run = cvt_run("cvt13_150x262_stage3_depth3")
    trace = run.ours.trace(run.pixels, decompose=True)
    a = explain.direct_logit_attribution(run.ours, trace)
    maps = explain.token_effect_maps(a, trace)
    block = trace.blocks[a.layers[0]]
    dense = torch.as_tensor(block_operator(block), dtype=torch.float64)   # (1 + nk) x (1 + nq), written in test_explain
    carried = (a.token_effects.double() @ dense)[..., 1:]
    assert maps.shape == (*a.heads.shape, *block.query_grid)
    assert_max_abs(maps.flatten(-2).double(), carried, 1e-6, "carried token effects")
    total = maps.sum(dim=(-2, -1)) + a.token_effects[..., 0]   # the grid and the class token's own key
    assert_max_abs(total, a.heads, 1e-5 * a.heads.abs().max().item(), "carried maps keep each head's part")


def test_attribution_refuses_a_trace_without_head_parts_and_a_foil_equal_to_the_target():
    model = tiny_vit()
    pixels = torch.randn(1, 3, 32, 48)
    with pytest.raises(ValueError, match="decompose=True"):
        explain.direct_logit_attribution(model, model.trace(pixels), 0)
    with pytest.raises(ValueError, match="foil class is the target"):
        explain.direct_logit_attribution(model, model.trace(pixels, decompose=True), 2, foil=2)
    headless = tiny_vit(num_classes=0)
    with pytest.raises(ValueError, match="no classifier"):
        explain.direct_logit_attribution(headless, headless.trace(pixels, decompose=True))


# ---------------------------------------------------------------- activation patching

@functools.cache
def small_timm_pair() -> tuple[nn.Module, ViT, Tensor, Tensor]:
    torch.manual_seed(0)
    reference = perturb_(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=4,
                                           num_classes=10), std=VIT_STD)
    for block in reference.blocks:
        block.attn.fused_attn = False
    ours = ViT(vit_config_of(reference)).eval()
    load_weights(ours, reference.state_dict())
    clean = torch.randn(1, 3, 64, 64)
    return reference, ours, clean, explain.corrupt(clean, "noise", strength=1.0)


def reference_effect(model_call, metric, patch) -> float:
    """The normalised effect of one patched reference forward; patch: a context manager installing hooks."""
    with torch.no_grad(), patch:
        logits = model_call()
    return float((logits[0, metric.target] - logits[0, metric.foil] - metric.corrupted)
                 / (metric.clean - metric.corrupted))


def test_residual_patching_matches_forward_hooks_on_timms_blocks_token_by_token_and_in_squares():
    reference, ours, clean, corrupted = small_timm_pair()
    with torch.no_grad(), inputs_of(list(reference.blocks)) as clean_inputs:
        clean_logits = reference(clean)
        corrupted_logits = reference(corrupted)
    for group in (1, 2):
        result = explain.patch_activations(ours, clean, corrupted, site="resid", group=group)
        m = result.metric
        assert abs(m.clean - float(clean_logits[0, m.target] - clean_logits[0, m.foil])) <= 1e-5
        assert abs(m.corrupted - float(corrupted_logits[0, m.target] - corrupted_logits[0, m.foil])) <= 1e-5
        assert abs(m.clean - m.corrupted) > 0.5, "the two images must differ enough to normalise by"
        assert m.foil == int(corrupted_logits.argmax()) or m.target == int(corrupted_logits.argmax())
        for layer, block in enumerate(reference.blocks):
            def patched(tokens: list[int], block=block, clean=clean_inputs[layer]):
                def replace(x):
                    x[:, tokens] = clean[:, tokens]
                    return x
                return replaced_input(block, replace)

            assert result.grid[layer].shape == (4 // group, 4 // group)
            cls = reference_effect(lambda: reference(corrupted), m, patched([0]))
            assert abs(float(result.prefix[layer][0]) - cls) <= 1e-5, f"block {layer}: the class token"
            for i in range(4 // group):
                for j in range(4 // group):
                    tokens = [1 + row * 4 + col for row in range(group * i, group * i + group)
                              for col in range(group * j, group * j + group)]
                    expected = reference_effect(lambda: reference(corrupted), m, patched(tokens))
                    assert abs(float(result.grid[layer][i, j]) - expected) <= 1e-5, f"block {layer}, square {i, j}"


def test_head_patching_matches_forward_hooks_on_timms_output_projection():
    reference, ours, clean, corrupted = small_timm_pair()
    result = explain.patch_activations(ours, clean, corrupted, site="head")
    with torch.no_grad(), inputs_of([block.attn.proj for block in reference.blocks]) as clean_z:
        reference(clean)
    heads, d = reference.blocks[0].attn.num_heads, reference.embed_dim // reference.blocks[0].attn.num_heads
    assert result.heads.shape == (len(reference.blocks), heads)
    for layer, block in enumerate(reference.blocks):
        for h in range(heads):
            def replace(z, layer=layer, h=h):
                z[..., h * d:(h + 1) * d] = clean_z[layer][..., h * d:(h + 1) * d]
                return z
            expected = reference_effect(lambda: reference(corrupted), result.metric,
                                        replaced_input(block.attn.proj, replace))
            assert abs(float(result.heads[layer, h]) - expected) <= 1e-5, f"block {layer}, head {h}"


def test_patching_every_token_gives_one_and_none_zero_for_both_models():
    for model, size in ((small_timm_pair()[1], (64, 64)), (cvt_pair(transformers_cvt((1, 2, 3))), (64, 64))):
        torch.manual_seed(1)
        clean = torch.randn(1, 3, *size)
        runs = [model.trace(x) for x in (clean, explain.corrupt(clean, "blur", strength=3.0))]
        metric = explain.patching.metric(*runs)
        for layer, block in enumerate(runs[0].blocks):
            n = block.tokens.shape[1]
            masks = torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
            effects = explain.patching.patched_residual(model, *runs, layer, masks, metric)
            assert_max_abs(effects, torch.tensor([1.0, 0.0]), 1e-4, f"{type(model).__name__} block {layer}")


def test_cvt_residual_patching_matches_forward_hooks_on_transformers_layers():
    torch.manual_seed(0)
    reference = transformers_cvt((1, 2, 3))
    ours = cvt_pair(reference)
    clean = torch.randn(1, 3, 64, 64)
    corrupted = explain.corrupt(clean, "blur", strength=3.0)
    result = explain.patch_activations(ours, clean, corrupted, site="resid", group=2)
    cvt_layers = layers(reference)
    with torch.no_grad(), inputs_of(cvt_layers) as clean_inputs:
        reference(clean)
    trace = ours.trace(clean)
    for index, (layer, block) in enumerate(zip(cvt_layers, trace.blocks)):
        (h, w), p = block.query_grid, block.prefix
        for k in range(p):
            def replace(x, k=k, index=index):
                x[:, k] = clean_inputs[index][:, k]
                return x
            expected = reference_effect(lambda: reference(corrupted).logits, result.metric,
                                        replaced_input(layer, replace))
            assert abs(float(result.prefix[index][k]) - expected) <= 1e-5, f"layer {index}: the class token"
        for i in range(h // 2):
            for j in range(w // 2):
                tokens = [p + y * w + x for y in (2 * i, 2 * i + 1) for x in (2 * j, 2 * j + 1)]

                def replace(x, tokens=tokens, index=index):
                    x[:, tokens] = clean_inputs[index][:, tokens]
                    return x
                expected = reference_effect(lambda: reference(corrupted).logits, result.metric,
                                            replaced_input(layer, replace))
                assert abs(float(result.grid[index][i, j]) - expected) <= 1e-5, f"layer {index}, square {i, j}"


def ours_from_transformers_vit(reference) -> ViT:
    """vitviz's ViT with a transformers ViTForImageClassification's weights (timm's names)."""
    from vitviz.models import ViTConfig

    c = reference.config
    ours = ViT(ViTConfig(img_size=(c.image_size,) * 2, patch_size=c.patch_size, num_classes=c.num_labels,
                         embed_dim=c.hidden_size, depth=c.num_hidden_layers, num_heads=c.num_attention_heads,
                         mlp_ratio=c.intermediate_size / c.hidden_size)).eval()
    theirs = reference.state_dict()
    state = {"cls_token": theirs["vit.embeddings.cls_token"], "pos_embed": theirs["vit.embeddings.position_embeddings"]}
    for kind in ("weight", "bias"):
        state |= {f"patch_embed.proj.{kind}": theirs[f"vit.embeddings.patch_embeddings.projection.{kind}"],
                  f"norm.{kind}": theirs[f"vit.layernorm.{kind}"], f"head.{kind}": theirs[f"classifier.{kind}"]}
        for i in range(c.num_hidden_layers):
            layer = f"vit.layers.{i}."
            state |= {f"blocks.{i}.attn.qkv.{kind}": torch.cat([theirs[f"{layer}attention.{p}_proj.{kind}"]
                                                                for p in "qkv"]),
                      f"blocks.{i}.attn.proj.{kind}": theirs[f"{layer}attention.o_proj.{kind}"],
                      f"blocks.{i}.norm1.{kind}": theirs[f"{layer}layernorm_before.{kind}"],
                      f"blocks.{i}.norm2.{kind}": theirs[f"{layer}layernorm_after.{kind}"],
                      f"blocks.{i}.mlp.fc1.{kind}": theirs[f"{layer}mlp.fc1.{kind}"],
                      f"blocks.{i}.mlp.fc2.{kind}": theirs[f"{layer}mlp.fc2.{kind}"]}
    load_weights(ours, state)
    return ours


def test_residual_patching_matches_transformer_lens_vit_bridge_hook_resid_pre(tmp_path, monkeypatch):
    """TransformerLens 4.3's ViT bridge over a random-weight transformers ViT (offline: the model is handed over)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import ViTConfig as HFViTConfig, ViTForImageClassification

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    reference = perturb_(ViTForImageClassification(HFViTConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8,
        num_labels=6, layer_norm_eps=1e-6, attn_implementation="eager")), std=VIT_STD)
    ours = ours_from_transformers_vit(reference)   # before the bridge wraps the model's modules
    reference.save_pretrained(tmp_path)            # the bridge reads the config from the folder; the weights are these
    bridge = TransformerBridge.boot_transformers(str(tmp_path), hf_model=reference, device="cpu")
    clean = torch.randn(1, 3, 32, 32)
    corrupted = explain.corrupt(clean, "noise", strength=1.0, seed=1)
    with torch.no_grad():
        assert_max_abs(ours(clean), bridge(clean), 1e-5, "vitviz and the bridge: logits")
        _, cache = bridge.run_with_cache(clean)
    result = explain.patch_activations(ours, clean, corrupted, site="resid")
    assert max(float(g.abs().max()) for g in result.grid) > 0.1, "patching must move the answer"
    for layer in range(3):
        name = f"blocks.{layer}.hook_resid_pre"
        for token in range(17):
            def patch(x, hook, token=token):
                x = x.clone()
                x[:, token] = cache[hook.name][:, token]
                return x
            with torch.no_grad():
                logits = bridge.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
            m = result.metric
            expected = float((logits[0, m.target] - logits[0, m.foil] - m.corrupted) / (m.clean - m.corrupted))
            ours_value = result.prefix[layer][0] if token == 0 else result.grid[layer].flatten()[token - 1]
            assert abs(float(ours_value) - expected) <= 1e-5, f"{name}, token {token}"


def test_patching_plan_counts_the_forwards_and_progress_reports_each(monkeypatch):
    _, model, clean, corrupted = small_timm_pair()
    images, calls = [], []
    forward_from = model.forward_from

    def counting_forward_from(index, tokens, *args, **kw):
        images.append(len(tokens))
        return forward_from(index, tokens, *args, **kw)
    monkeypatch.setattr(model, "forward_from", counting_forward_from)
    for site, group in (("resid", 1), ("resid", 3), ("head", 1)):
        images.clear(), calls.clear()
        plan = explain.patching_plan(model.trace(clean), site=site, group=group, batch_size=5)
        explain.patch_activations(model, clean, corrupted, site=site, group=group, batch_size=5,
                                  progress=lambda done, total: calls.append((done, total)))
        assert (plan.forwards, plan.images) == (len(images), sum(images))
        assert calls == [(k + 1, plan.forwards) for k in range(plan.forwards)]


def test_patching_refuses_two_images_with_the_same_answer_and_mismatched_inputs():
    _, model, clean, corrupted = small_timm_pair()
    with pytest.raises(ValueError, match="same answer"):
        explain.patch_activations(model, clean, clean.clone())
    with pytest.raises(ValueError, match="one image each"):
        explain.patch_activations(model, clean, torch.cat([corrupted, corrupted]))
    with pytest.raises(ValueError, match="site must be one of"):
        explain.patch_activations(model, clean, corrupted, site="mlp")


def test_blur_is_torchvisions_gaussian_blur_and_noise_is_reproducible():
    pixels = torch.randn(2, 3, 40, 56)
    for sigma in (0.8, 2.5):
        radius = int(3 * sigma)
        assert_max_abs(explain.corrupt(pixels, "blur", strength=sigma),
                       gaussian_blur(pixels, [2 * radius + 1] * 2, [sigma, sigma]), 1e-5, f"blur sigma {sigma}")
    noisy = explain.corrupt(pixels, "noise", strength=0.5, seed=3)
    assert torch.equal(noisy, explain.corrupt(pixels, "noise", strength=0.5, seed=3))
    assert abs(float((noisy - pixels).std()) - 0.5) < 0.02


# ---------------------------------------------------------------- command line and export

def test_cli_decide_writes_the_attribution_table_and_token_effect_maps_the_api_computes(tmp_path):
    from PIL import Image

    import vitviz
    from vitviz import cli
    from vitviz.export import DECIDE, MANIFEST, TOKEN_EFFECTS
    from vitviz.files import safe_name
    from vitviz.image import read_image
    from vitviz.session import ModelRun

    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (72, 96, 3), dtype=np.uint8)).save(photo)
    models = ["vit-cifar10", "cvt-cifar10"]
    assert cli.main(["explain", str(photo), "--models", *models, "--out", str(tmp_path / "out"), "--decide",
                     "--formats", "npy", "--faithfulness-steps", "0"]) == 0
    entry = json.loads((tmp_path / "out" / MANIFEST).read_text())["images"][0]
    for name, model_entry in zip(models, entry["models"]):
        folder = tmp_path / "out" / entry["id"] / safe_name(name)
        assert {DECIDE, TOKEN_EFFECTS} <= set(model_entry["files"])
        table = json.loads((folder / DECIDE).read_text())
        maps = np.load(folder / TOKEN_EFFECTS)
        assert list(maps.shape) == model_entry["decide"]["token_effects"]["shape"]
        run = ModelRun(vitviz.load(name), read_image(photo))
        trace = run.loaded.model.trace(run.pixels, decompose=True)
        a = explain.direct_logit_attribution(run.loaded.model, trace)
        assert table["target"]["index"] == run.top(1)[0].index and table["target"]["label"] == run.top(1)[0].label
        assert np.allclose([layer["heads"] for layer in table["layers"]], a.heads[0].numpy(), atol=1e-5)
        assert np.allclose(maps, explain.token_effect_maps(a, trace)[0].numpy(), atol=1e-6)
        parts = table["embedding"] + table["bias"] + sum(layer["attention"] + layer["mlp"] for layer in table["layers"])
        assert abs(parts - table["logit"]) <= 1e-4 * max(1.0, abs(table["logit"]))


# ---------------------------------------------------------------- figures

def test_figures_draw_the_tables_and_a_head_map_red_for_the_class_blue_against():
    from PIL import Image

    import vitviz
    from vitviz.render import decide as figures
    from vitviz.session import ModelRun

    run = ModelRun(vitviz.load("cvt-cifar10"), Image.fromarray(np.full((64, 64, 3), 128, np.uint8)))
    model = run.loaded.model
    trace = model.trace(run.pixels, decompose=True)
    a = explain.direct_logit_attribution(model, trace)
    bars = figures.contribution_bars({"cvt-cifar10": a.table(0, run.loaded.labels)})
    heat = figures.head_heatmap(a.heads[0].numpy(), title="what each head writes")
    assert bars.dtype == heat.dtype == np.uint8 and bars.shape[2] == heat.shape[2] == 3
    patching = explain.patch_activations(model, run.pixels, explain.corrupt(run.pixels, "noise"), group=2)
    table = figures.position_table(patching)
    lengths = [len(p) + g.numel() for p, g in zip(patching.prefix, patching.grid)]
    assert table.shape == (len(trace.blocks), max(lengths))
    assert all(np.isnan(table[i, n:]).all() and np.isfinite(table[i, :n]).all() for i, n in enumerate(lengths))
    h, w = trace.blocks[-1].query_grid
    effects = np.zeros((h, w))
    effects[0, 0], effects[-1, -1] = 1.0, -1.0
    view = figures.token_effect_view(run.canvas, effects).astype(int)
    field = run.canvas.field(-1)
    for (i, j), sign in (((0, 0), 1), ((h - 1, w - 1), -1)):
        x, y = run.canvas.frame.to_display(field.centre(j), field.centre(i))
        x, y = (int(np.clip(round(float(v)), 0, n - 1)) for v, n in ((x, view.shape[1]), (y, view.shape[0])))
        r, _, b = view[y, x]
        assert sign * (r - b) > 50, f"cell {i, j}: {view[y, x]}"
