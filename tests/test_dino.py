"""Self-supervised ViTs without a classifier (DINO, DINOv2, DINOv2 with registers): our ViT reproduces
timm's `forward_features`, pooled output and attention at the checkpoint's own size and at another
(position embeddings resampled as timm's `dynamic_img_size` does); they load through the fake Hub
with no labels; the views that need no class (mass threshold, foreground PCA, artefact tokens) equal
their definitions written out here; and a run of such a model has no predictions, says so, and
explains its pooled output instead of a class.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

import vitviz
from hub_server import timm_checkpoint
from test_models import VIT_STD, assert_max_abs, outputs_of, perturb_, vit_config_of
from vitviz import explain, render
from vitviz.export import PREDICTIONS, image_files, model_entry
from vitviz.models import ViT, load_weights
from vitviz.session import ModelRun
from vitviz.views import artefact_views, feature_pca_view, head_views, map_view, model_view

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PHOTO = Path(__file__).resolve().parents[1] / "assets" / "cat_chelsea.jpg"

# id: (timm name, depth, input (h, w) at the checkpoint's own size, input (h, w) at another size)
FAMILIES = {
    "dino-s16": ("vit_small_patch16_224.dino", 2, (224, 224), (160, 288)),
    "dino-b16": ("vit_base_patch16_224.dino", 1, (224, 224), (192, 128)),
    "dino-s8": ("vit_small_patch8_224.dino", 1, (224, 224), (96, 160)),
    "dinov2-s14": ("vit_small_patch14_dinov2.lvd142m", 2, (518, 518), (224, 308)),
    "dinov2-b14": ("vit_base_patch14_dinov2.lvd142m", 1, (518, 518), (224, 224)),
    "dinov2-s14-reg4": ("vit_small_patch14_reg4_dinov2.lvd142m", 2, (518, 518), (224, 308)),
    "dinov2-b14-reg4": ("vit_base_patch14_reg4_dinov2.lvd142m", 1, (518, 518), (168, 252)),
}
CASES = [(family, which) for family in FAMILIES for which in ("own size", "other size")]


@functools.cache
def headless_pair(name: str, depth: int, dynamic: bool) -> tuple[torch.nn.Module, ViT]:
    """timm's model (perturbed weights, `num_classes=0` as published) and ours with its weights."""
    torch.manual_seed(0)
    reference = perturb_(timm.create_model(name, pretrained=False, depth=depth, dynamic_img_size=dynamic), std=VIT_STD)
    for block in reference.blocks:
        block.attn.fused_attn = False   # the explicit softmax, whose probabilities pass through attn_drop
    ours = ViT(vit_config_of(reference)).eval()
    load_weights(ours, reference.state_dict())
    return reference, ours


@pytest.mark.parametrize("family, which", CASES, ids=[f"{f}, {w}" for f, w in CASES])
def test_headless_vits_match_timms_features_pooled_output_and_attention_at_two_sizes(family, which):
    name, depth, own, other = FAMILIES[family]
    reference, ours = headless_pair(name, depth, which == "other size")
    assert reference.num_classes == 0 and isinstance(reference.head, torch.nn.Identity)
    pixels = torch.randn(1, 3, *(own if which == "own size" else other))
    with torch.no_grad():
        with outputs_of([b.attn.attn_drop for b in reference.blocks]) as ref_attentions:
            features = reference.forward_features(pixels)
        pooled = reference.forward_head(features, pre_logits=True)
        output = reference(pixels)
        trace, forward = ours.trace(pixels), ours(pixels)
    assert trace.logits.shape == (1, 0) and not trace.has_classifier
    assert_max_abs(trace.final_tokens, features, 1e-5, "forward_features")
    assert_max_abs(trace.pooled, pooled, 1e-5, "pooled pre-logits")
    assert_max_abs(forward, output, 1e-5, "forward output (timm's: the pooled features)")
    assert len(trace.attentions) == len(ref_attentions) == depth
    for i, (attn, ref) in enumerate(zip(trace.attentions, ref_attentions)):
        assert_max_abs(attn, ref, 1e-6, f"block {i} attention")
    assert max(a.max() for a in ref_attentions) > 0.1   # far from uniform: scale mistakes would show


def test_the_catalog_names_every_family_at_its_size():
    for family, (name, *_) in FAMILIES.items():
        entry = vitviz.catalog.CATALOG[family]
        assert entry.source == f"timm/{name}" and entry.family == "vit"
        assert entry.size == (224 if family.startswith("dinov2") else None)


# ---- the mass threshold, foreground PCA and artefact tokens, against their definitions ---------------------

def test_mass_threshold_is_the_smallest_token_set_holding_the_fraction():
    rng = np.random.default_rng(0)
    maps = np.concatenate([rng.gamma(0.3, size=(6, 14, 14)), np.round(rng.random((2, 14, 14)), 1)])  # 2 with ties
    for fraction in (0.1, 0.6, 0.9, 1.0):
        kept = explain.mass_threshold(torch.from_numpy(maps), fraction).numpy()
        for values, mask in zip(maps, kept):
            flat = values.ravel()
            running = np.cumsum(np.sort(flat)[::-1])
            k = int(np.argmax(running >= fraction * running[-1])) + 1   # the first prefix that holds the fraction
            assert mask.sum() == k
            assert flat[mask.ravel()].sum() >= fraction * flat.sum() * (1 - 1e-9)
            assert np.sort(flat[mask.ravel()])[1:].sum() < fraction * flat.sum()   # one token fewer falls short
            assert flat[mask.ravel()].min() >= flat[~mask.ravel()].max(initial=-np.inf)   # the largest ones
    # DINO's way of writing the same set, on a map without ties
    values = maps[0] / maps[0].sum()
    order = np.argsort(values.ravel())
    dino = np.zeros(values.size, bool)
    dino[order] = np.cumsum(values.ravel()[order]) > 1 - 0.6
    assert np.array_equal(explain.mass_threshold(torch.from_numpy(maps[0]), 0.6).numpy().ravel(), dino)


def svd_components(x: np.ndarray, k: int) -> np.ndarray:
    """Scores on the first k principal components by numpy's SVD, each component's sign making its
    largest-magnitude loading positive (the convention vitviz states)."""
    centred = x - x.mean(axis=0)
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    vt = vt[:k] * np.sign(vt[np.arange(k), np.abs(vt[:k]).argmax(axis=1)])[:, None]
    return centred @ vt.T


def test_foreground_pca_equals_numpys_svd_with_the_border_rule():
    rng = np.random.default_rng(1)
    h, w, c = 12, 16, 24
    features = rng.normal(size=(c, h, w))
    features[:, 3:9, 4:12] += rng.normal(size=(c, 1, 1)) * 4   # an object in the middle, background around it
    features[:, 3:6, 4:8] += rng.normal(size=(c, 1, 1)) * 2    # with two parts
    rgb, foreground = render.foreground_pca(features.astype(np.float32))
    tokens = features.reshape(c, -1).T
    first = svd_components(tokens, 1)[:, 0]
    border = np.zeros((h, w), bool)
    border[[0, -1]] = border[:, [0, -1]] = True
    side = first > 0
    expected_fg = ~side if side[border.ravel()].mean() > 0.5 else side
    assert np.array_equal(foreground.ravel(), expected_fg)
    assert foreground[3:9, 4:12].all() and not foreground[border].any()   # the object, not the border
    scores = svd_components(tokens[expected_fg], 3)
    low, high = np.percentile(scores, [1, 99], axis=0)
    expected = np.zeros((h * w, 3))
    expected[expected_fg] = np.clip((scores - low) / (high - low), 0, 1)
    np.testing.assert_allclose(rgb.reshape(-1, 3), expected, atol=1e-5)


def test_artefact_tokens_are_the_outliers_of_an_independently_computed_norm():
    reference, ours = headless_pair("vit_small_patch14_reg4_dinov2.lvd142m", 2, True)
    pixels = torch.randn(1, 3, 224, 224)
    for row, col in ((2, 3), (10, 12), (14, 1)):   # three patches of extreme pixels: their tokens' norms explode
        pixels[..., 14 * row:14 * row + 14, 14 * col:14 * col + 14] *= 60
    with torch.no_grad(), outputs_of(list(reference.blocks)) as outputs:
        reference(pixels)
        trace = ours.trace(pixels)
    norms = torch.linalg.vector_norm(outputs[-1][0, reference.num_prefix_tokens:], dim=-1).numpy().reshape(16, 16)
    median = np.median(norms)
    z = (norms - median) / (1.4826 * np.median(np.abs(norms - median)))
    expected = z > 5
    found = explain.artefact_tokens(trace)[0].numpy()
    assert found.sum() == expected.sum() == 3 and np.array_equal(found, expected)
    assert found[2, 3] and found[10, 12] and found[14, 1]


def test_head_attention_is_every_heads_query_attention():
    _, ours = headless_pair("vit_small_patch14_reg4_dinov2.lvd142m", 2, True)
    trace = ours.trace(torch.randn(1, 3, 112, 140))
    for query in ("cls", (3, 4), 2):   # the class token, a patch, register 2 (position 2 of [cls, reg x4])
        every = explain.head_attention(trace, layer=-1, query=query, on_query_grid=True)
        for head in range(every.shape[1]):
            one = explain.query_attention(trace, layer=-1, query=query, head=head, on_query_grid=True)
            assert torch.equal(every[:, head], one)
    row = trace.blocks[-1].attn[0, :, 2, 5:].reshape(-1, 8, 10)   # register 2's row over the 8x10 grid, by hand
    assert torch.equal(explain.head_attention(trace, query=2)[0], row)


# ---- loading through the fake Hub, and a run without predictions -------------------------------------------

@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return Image.open(PHOTO).convert("RGB")


def test_a_headless_checkpoint_loads_from_the_hub_at_its_size_or_the_catalogs(own_caches, dinov2_repos, photo):
    repo_id, reference = dinov2_repos["dinov2-s14-reg4"]
    native = vitviz.load(repo_id, device="cpu")   # a Hub id: the checkpoint's own 518 px
    assert native.labels == () and not native.has_classifier and native.size == 518
    assert native.source.layout == "timm" and native.family == "vit"
    by_name = vitviz.load("dinov2-s14-reg4", device="cpu")   # the catalog's 224 px, the same model in memory
    assert by_name.size == 224 and by_name.model is native.model
    assert vitviz.load(repo_id, device="cpu", size=336).size == 336
    for loaded in (native, by_name):
        size = loaded.size
        timm_pixels = create_transform(**resolve_data_config({"input_size": (3, size, size)}, model=reference))(photo)
        pixels = loaded.preprocess(photo)
        assert_max_abs(pixels, timm_pixels[None], 1e-5, f"pixels at {size}")
        dynamic = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, embed_dim=48,
                                    num_heads=6, num_classes=0, dynamic_img_size=True)
        dynamic.load_state_dict(reference.state_dict())
        with torch.no_grad():
            assert_max_abs(loaded.model.trace(pixels).pooled, dynamic.eval()(pixels), 1e-5, f"pooled at {size}")
    with pytest.raises(vitviz.LoadError, match="from 32 to 1024"):
        vitviz.load(repo_id, device="cpu", size=8)


@pytest.fixture(scope="module")
def headless_run(tmp_path_factory) -> ModelRun:
    folder = tmp_path_factory.mktemp("dino-s16")
    timm_checkpoint(folder, "vit_small_patch16_224.dino", depth=2, embed_dim=48, num_heads=6)
    return ModelRun(vitviz.load(str(folder), device="cpu"), Image.open(PHOTO).convert("RGB"))


def test_a_headless_run_has_no_predictions_says_so_and_refuses_a_class(headless_run):
    run = headless_run
    assert run.top(5) == [] and not run.has_classifier and "has no classifier" in run.no_classifier
    with pytest.raises(ValueError, match="no class 3 to explain"):
        run.token_map("chefer", target=3)
    with pytest.raises(ValueError, match="no classifier"):
        run.faithfulness("rollout")
    for method in explain.METHODS:
        values = run.token_map(method)
        assert values.shape == (14, 14) and np.isfinite(values).all(), method
        assert map_view(run, method).shape[0] > run.canvas.size[0]   # drawn, with its caption strip


def test_a_headless_models_targeted_maps_explain_the_pooled_outputs_similarity_to_a_token(headless_run):
    run = headless_run
    model = run.loaded.model
    h, w = run.canvas.size
    point = (w * 0.3, h * 0.6)
    token = run.similarity_token(point)
    with torch.no_grad():
        features = model.norm(model.trace(run.pixels).blocks[-1].tokens)   # forward_features, recomputed
    direction = features[0, token] / features[0, token].norm()
    target = explain.SimilarityTarget(model, run.trace.final_tokens[0, token])
    with torch.no_grad():
        assert_max_abs(target(run.pixels), features[:, 0] @ direction[:, None], 1e-5, "score = <pooled, u>")
    expected = explain.chefer_relevance(target, run.pixels, 0)[0].numpy()
    np.testing.assert_allclose(run.token_map("chefer", point=point), expected, rtol=0, atol=1e-6)
    assert run.explained_target("chefer", point=point) == f"the pooled output's similarity to token {token}'s output"
    itself = explain.SimilarityTarget(model, run.trace.pooled[0])
    with torch.no_grad():
        assert_max_abs(itself(run.pixels)[:, 0], run.trace.pooled.norm(dim=-1), 1e-5, "score = |pooled|")


def test_the_explain_a_class_tab_explains_a_headless_model_at_the_clicked_token(headless_run, monkeypatch):
    """The tab's click on the input image (the page's point, in the upload's pixels) picks the token whose
    output the pooled output is compared with; without a click, the pooled output's own direction. The map
    comes from the app's GPU function, which loads the model by name in its own process."""
    from vitviz.ui import classes, gpu, shared
    from vitviz.ui.store import Session
    run = headless_run
    folder = run.loaded.source.location   # the folder's absolute path
    monkeypatch.setattr(gpu.boundary, "LOCAL_ALLOWED", {folder})   # the owner named this folder
    kept = ModelRun(run.loaded.card(), run.image, pixels=run.pixels, trace=run.trace)   # as the app keeps it
    key = shared.SESSIONS.put(Session(run.image, [kept, kept], [], [folder, folder]))
    shown_w, shown_h = run.image.size
    clicked = (shown_w * 0.7, shown_h * 0.2)
    at_point = classes.render_gradients(key, "chefer", None, None, clicked)
    expected = map_view(run, "chefer", point=shared.run_point(run, clicked))
    assert all(np.array_equal(panel, expected) for panel in at_point)
    unclicked = classes.render_gradients(key, "chefer", None, None, None)
    assert np.array_equal(unclicked[0], map_view(run, "chefer")) and not np.array_equal(unclicked[0], expected)


def test_the_export_records_that_a_headless_model_has_no_predictions(headless_run):
    files, entry = image_files(headless_run, ["rollout", "chefer"], faithfulness_steps=4)
    predictions = json.loads(files[PREDICTIONS])
    assert predictions["top5"] == [] and "has no classifier" in predictions["no_predictions"]
    assert entry["top5"] == [] and entry["target"] is None and entry["faithfulness"] == {}
    assert entry["maps"]["chefer"]["explains"] == "the pooled output's length along its own direction"
    assert "explains" not in entry["maps"]["rollout"]
    assert model_entry(headless_run.loaded) | {"classes": 0, "classifier": False} == model_entry(headless_run.loaded)


def test_heads_threshold_pca_and_artefact_views_are_drawn_with_captions_for_every_head(headless_run):
    run = headless_run
    heads, title = head_views(run, fraction=0.6, style="outline")
    assert len(heads) == 1 + 6 and all(image.shape == (*run.canvas.size, 3) for image, _ in heads)
    masks = explain.mass_threshold(explain.head_attention(run.trace, query="cls", on_query_grid=True)[0], 0.6)
    assert [caption for _, caption in heads[1:]] == [f"head {k + 1} · {int(m.sum())} of 196 tokens"
                                                     for k, m in enumerate(masks)]
    assert heads[0][1].startswith("mean of the 6 heads")
    assert title.startswith(f"{run.name}, layer 2: where the class token looks") and "holding 60%" in title
    h, w = run.canvas.size
    row, col = run.canvas.token_at((w / 2, h / 2), run.canvas.fields[0])
    masked, title = head_views(run, layer=0, point=(w / 2, h / 2), fraction=0.6, style="mask")
    assert f"layer 1: where the token at row {row}, column {col} looks" in title
    assert not np.array_equal(masked[1][0], heads[1][0])
    strips = model_view(run)
    assert len(strips) == 2 and all(strip.shape[1] > 6 * strip.shape[0] for strip, _ in strips)
    image, caption = feature_pca_view(run)
    assert image.shape == (*run.canvas.size, 3) and "foreground tokens (of 196)" in caption
    views, registers, summary = artefact_views(run)
    assert len(views) == 2 and registers == [] and "high-norm token" in summary   # norms, the class token's attention
