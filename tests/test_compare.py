"""`vitviz.compare`: CKA against Kornblith's published numbers, the estimators' invariances, minibatch CKA
against the formula written out, every layer against pytorch-cka 1.1.3 on timm's and transformers' models,
torchrun against one process, the command line, and the published result against the documentation's
comparing page (docs/comparing.md)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import test_evaluate
from test_evaluate import jpeg, run, write_npz
from test_models import VIT_STD, cvt_pair, perturb_, transformers_cvt, vit_config_of
from vitviz import catalog, cli, compare as cmp
from vitviz.models import ViT, load_weights

ROOT = Path(__file__).resolve().parents[1]
micro_models = test_evaluate.micro_models   # its fixture, shared: pytest collects fixtures from module attributes

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def song_hsic(x: np.ndarray, y: np.ndarray) -> float:
    """HSIC_1 of Song et al. (2012), eq. 5, written out: Gram matrices with zero diagonals, three terms."""
    gram_x, gram_y = x @ x.T, y @ y.T
    np.fill_diagonal(gram_x, 0)
    np.fill_diagonal(gram_y, 0)
    n, one = len(x), np.ones(len(x))
    return (np.trace(gram_x @ gram_y) + one @ gram_x @ one * (one @ gram_y @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ gram_x @ gram_y @ one) / (n * (n - 3))


def kornblith_demo() -> tuple[np.ndarray, np.ndarray]:
    np.random.seed(1337)
    x = np.random.randn(100, 10)
    y = np.random.randn(100, 10) + x
    return x, y


# ---- the estimators ---------------------------------------------------------------------------------------

def test_cka_of_kornblith_demo_data_equals_the_published_values():
    """The demo notebook of google-research/similarity: 0.55761 biased, 0.51346 debiased."""
    x, y = kornblith_demo()
    assert abs(cmp.cka(x, y, debiased=False) - 0.55761) < 1e-5
    assert abs(cmp.cka(x, y) - 0.51346) < 1e-5
    assert abs(cmp.cka(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)) - 0.51346) < 1e-5


def test_debiased_hsic_equals_song_et_al_formula_written_out():
    x, y = kornblith_demo()
    ours = cmp.hsic(cmp.gram(x), cmp.gram(y)).item()
    xc, yc = x - x.mean(0), y - y.mean(0)
    assert abs(ours - song_hsic(xc, yc)) < 1e-9 * abs(ours)
    assert abs(ours - song_hsic(x, y)) < 1e-9 * abs(ours)   # blind to a translation of the features


@pytest.mark.parametrize("debiased", [True, False], ids=["debiased", "biased"])
def test_cka_invariances_and_what_changes_it(debiased):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 12))
    y = x @ rng.standard_normal((12, 8)) + 0.5 * rng.standard_normal((40, 8))
    value = cmp.cka(x, y, debiased=debiased)
    same = lambda a, b: abs(a - b) < 1e-9
    assert same(cmp.cka(x, x, debiased=debiased), 1.0)
    assert same(cmp.cka(y, x, debiased=debiased), value)
    q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    assert same(cmp.cka(x @ q, y, debiased=debiased), value)                 # orthogonal transform
    assert same(cmp.cka(7.5 * x, y, debiased=debiased), value)               # isotropic scaling
    assert same(cmp.cka(x + 3.0, y - 100.0, debiased=debiased), value)       # translation
    general = np.diag(np.linspace(0.1, 10, 12)) @ q                          # invertible, not orthogonal
    assert abs(cmp.cka(x @ general, y, debiased=debiased) - value) > 1e-3
    assert abs(cmp.cka(x[rng.permutation(40)], y, debiased=debiased) - value) > 1e-2   # rows of one side only


def test_debiased_cka_of_independent_wide_features_is_near_zero_where_biased_is_inflated():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 2000)), rng.standard_normal((32, 2000))
    assert cmp.cka(x, y, debiased=False) > 0.8
    assert abs(cmp.cka(x, y)) < 0.1


def test_float32_gram_matrices_of_centred_features_keep_what_uncentred_ones_lose():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 500)) + 40).astype(np.float32)   # a large common offset, as token features have
    y = (x[:, :300] + rng.standard_normal((64, 300)) + 40).astype(np.float32)
    reference = cmp.cka(x.astype(np.float64), y.astype(np.float64))
    assert abs(cmp.cka(x, y) - reference) < 1e-7
    gram_x, gram_y = ((torch.tensor(a) @ torch.tensor(a).T).double() for a in (x, y))   # float32 products, uncentred
    uncentred = float(cmp.hsic(gram_x, gram_y) / (cmp.hsic(gram_x, gram_x) * cmp.hsic(gram_y, gram_y)).sqrt())
    assert abs(uncentred - reference) > 100 * abs(cmp.cka(x, y) - reference)


def test_one_batch_of_minibatch_cka_is_debiased_cka_and_more_are_summed_hsic_not_mean_cka():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((30, 6))
    y = np.tanh(x @ rng.standard_normal((6, 5))) + 0.3 * rng.standard_normal((30, 5))
    one = cmp.LayerCKA()
    one.add({"x": torch.tensor(x)}, {"y": torch.tensor(y)})
    assert abs(one.result().a_vs_b[0, 0] - cmp.cka(x, y)) < 1e-12
    cuts = [slice(0, 8), slice(8, 19), slice(19, 30)]
    many = cmp.LayerCKA()
    for s in cuts:
        many.add({"x": torch.tensor(x[s])}, {"y": torch.tensor(y[s])})
    xy, xx, yy = (sum(song_hsic(a[s] - a[s].mean(0), b[s] - b[s].mean(0)) for s in cuts)
                  for a, b in ((x, y), (x, x), (y, y)))
    result = many.result()
    assert abs(result.a_vs_b[0, 0] - xy / np.sqrt(xx * yy)) < 1e-12
    assert abs(result.a_vs_b[0, 0] - np.mean([cmp.cka(x[s], y[s]) for s in cuts])) > 1e-3
    assert result.a_vs_a[0, 0] == pytest.approx(1.0) and result.images == 30


def test_a_short_last_batch_joins_the_one_before_never_dropped():
    assert [len(b) for b in cmp.batches(range(130), 64)] == [64, 66]
    assert [len(b) for b in cmp.batches(range(132), 64)] == [64, 64, 4]
    assert sum(cmp.batches(range(9), 4), []) == list(range(9))
    with pytest.raises(ValueError, match="at least 4 images"):
        cmp.batches(range(3), 4)
    with pytest.raises(ValueError, match="at least 4"):
        cmp.batches(range(10), 3)


# ---- every layer of two models against pytorch-cka ------------------------------------------------------------

@pytest.fixture(scope="module")
def reference_pair():
    """A timm ViT and a transformers CvT with perturbed weights, ours with the same weights, all in float64."""
    torch.manual_seed(0)
    timm_vit = perturb_(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                          depth=3, embed_dim=48, num_heads=3, num_classes=10), std=VIT_STD)
    vit = ViT(vit_config_of(timm_vit)).eval()
    load_weights(vit, timm_vit.state_dict())
    hf_cvt = transformers_cvt((1, 2, 3), embed_dim=[16, 24, 32], num_heads=[1, 1, 2])
    cvt = cvt_pair(hf_cvt)
    models = [m.double().eval() for m in (timm_vit, vit, hf_cvt, cvt)]
    batches = [torch.randn(n, 3, 32, 32, dtype=torch.float64) for n in (6, 6, 7)]
    return models, batches


def ours_over(models, batches, tokens: str) -> cmp.CKAResult:
    acc = cmp.LayerCKA()
    with torch.inference_mode():
        for pixels in batches:
            acc.add_traces(models[0].trace(pixels), models[1].trace(pixels), tokens=tokens)
    return acc.result()


def test_every_layer_pair_equals_pytorch_cka_hooks_on_timm_and_transformers(reference_pair):
    """pytorch-cka 1.1.3 hooks timm's blocks and transformers' CvT layers (their outputs flattened, HSIC_1
    summed over the batches); ours reads the same blocks' tokens from our models' traces. pytorch-cka
    clamps to [0, 1], so ours is compared clamped."""
    from cka import compute_cka

    (timm_vit, vit, hf_cvt, cvt), batches = reference_pair
    ours = ours_over((vit, cvt), batches, "flat")
    vit_layers = [f"blocks.{i}" for i in range(len(timm_vit.blocks))]
    cvt_layers = [f"cvt.encoder.stages.{s}.layers.{j}" for s, stage in enumerate(hf_cvt.cvt.encoder.stages)
                  for j in range(len(stage.layers))]
    assert len(ours.layers_a) == len(vit_layers) and len(ours.layers_b) == len(cvt_layers)
    for mine, (m1, m2, l1, l2) in [(ours.a_vs_b, (timm_vit, hf_cvt, vit_layers, cvt_layers)),
                                   (ours.a_vs_a, (timm_vit, timm_vit, vit_layers, vit_layers)),
                                   (ours.b_vs_b, (hf_cvt, hf_cvt, cvt_layers, cvt_layers))]:
        [theirs] = compute_cka(m1, m2, [batches], layers=l1, model2_layers=l2, device="cpu", progress=False)
        theirs = theirs.double().numpy()
        assert ((theirs > 0.001) & (theirs < 0.999)).sum() >= 3, "a comparison of clamped values only"
        np.testing.assert_allclose(np.clip(mine, 0, 1), theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tokens", ["mean", "cls"])
def test_mean_and_class_token_features_equal_pytorch_cka_hsic_on_the_same_features(reference_pair, tokens):
    from cka import CKA, hsic

    (_, vit, _, cvt), batches = reference_pair
    ours = ours_over((vit, cvt), batches, tokens)
    sums = None
    with torch.inference_mode():
        for pixels in batches:
            grams = [torch.stack([f @ f.T for f in cmp.block_features(m.trace(pixels), tokens).values()])
                     for m in (vit, cvt)]
            batch = hsic(*grams)
            sums = batch if sums is None else [s + b for s, b in zip(sums, batch)]
    theirs = CKA._compute_cka_matrix(None, *sums).numpy()
    np.testing.assert_allclose(np.clip(ours.a_vs_b, 0, 1), theirs, atol=1e-5, rtol=0)
    if tokens == "cls":   # CvT has a class token in its last stage only
        assert ours.layers_b == ("stage 3 block 1", "stage 3 block 2", "stage 3 block 3") and len(ours.layers_a) == 3


def test_a_trace_without_attention_maps_has_the_same_tokens(reference_pair):
    (_, vit, _, cvt), batches = reference_pair
    pixels = batches[0].float()
    for model in (vit.float(), cvt.float()):
        with torch.inference_mode():
            full, lean = model.trace(pixels), model.trace(pixels, attention=False)
        assert all(b.attn is None for b in lean.blocks) and torch.allclose(lean.logits, full.logits, atol=1e-5)
        for a, b in zip(full.blocks, lean.blocks):
            assert torch.allclose(a.tokens, b.tokens, atol=1e-5) and torch.allclose(a.inputs, b.inputs, atol=1e-5)
        model.double()


# ---- the command line, torchrun, the data ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def npz22(tmp_path_factory) -> Path:
    return write_npz(tmp_path_factory.mktemp("data") / "twenty-two.npz", [jpeg(i) for i in range(22)],
                     labels=[i % 10 for i in range(22)])


@pytest.mark.slow
def test_two_torchrun_ranks_equal_one_process(micro_models, npz22, tmp_path):
    """Batches of 4 (the last two of 22 join the fifth): rank 0 sums batches 0, 2, 4, rank 1 batches 1, 3."""
    args = ["compare", "--models", *micro_models, "--data", str(npz22), "--batch-size", "4", "--tokens", "flat"]
    run([*args, "--out", str(tmp_path / "one")])
    run([*args, "--out", str(tmp_path / "two")], torchrun=True)
    one, two = (cmp.CKAResult.load(tmp_path / d / cmp.CKA_FILE) for d in ("one", "two"))
    assert one.images == two.images == 22 and one.layers_a == two.layers_a and one.layers_b == two.layers_b
    for name in cmp.MATRICES:
        a, b = getattr(one, name), getattr(two, name)
        assert np.abs(a - b).max() <= 1e-9 * np.abs(a).max(), name
    summaries = [json.loads((tmp_path / d / cmp.SUMMARY).read_text()) for d in ("one", "two")]
    assert summaries[0]["batches"] == summaries[1]["batches"] == 5


def test_compare_writes_the_matrices_heatmaps_and_summary(micro_models, npz22, tmp_path):
    assert cli.main(["compare", "--models", *micro_models, "--data", str(npz22), "--limit", "9", "--batch-size", "4",
                     "--out", str(tmp_path)]) == 0
    with np.load(tmp_path / cmp.CKA_FILE, allow_pickle=False) as f:
        assert set(f.files) == {*cmp.MATRICES, "layers_a", "layers_b", "images"}
        assert f["layers_a"].dtype.kind == "U" and int(f["images"]) == 9
        a, b = len(f["layers_a"]), len(f["layers_b"])
        assert f["a_vs_b"].shape == (a, b) and f["a_vs_a"].shape == (a, a) and f["b_vs_b"].shape == (b, b)
        assert np.isfinite(f["a_vs_b"]).all() and np.allclose(np.diag(f["a_vs_a"]), 1)
    summary = json.loads((tmp_path / cmp.SUMMARY).read_text())
    assert summary["data"]["images"] == 9 and summary["tokens"] == "mean" and summary["batches"] == 2
    assert [m["name"] for m in summary["models"]] == [Path(m).name for m in micro_models]
    assert all("location" in m["source"] and "revision" in m["source"] for m in summary["models"])
    assert summary["vitviz_version"] and summary["data"]["limit"] == 9
    for name in cmp.MATRICES:
        assert Image.open(tmp_path / f"{name}.png").size[0] >= 500


def test_unreadable_images_are_skipped_for_both_models_and_listed(micro_models, tmp_path):
    images = [jpeg(i) for i in range(9)]
    images[1] = images[6] = b"<html>not an image</html>"
    data = write_npz(tmp_path / "broken.npz", images)
    result = cmp.compare(models=micro_models, data=data, out=tmp_path / "out", batch_size=4, progress=False)
    skipped = json.loads((tmp_path / "out" / cmp.SUMMARY).read_text())["data"]["skipped"]
    # batches [0..3] and [4..8] (the last image joins): the first keeps 3 readable images, too few for HSIC_1,
    # so all four are skipped; the second keeps 4, 5, 7, 8
    assert [s["id"] for s in skipped] == ["test/0", "test/1", "test/2", "test/3", "test/6"]
    reasons = [s["reason"] for s in skipped]
    assert "not an image" in reasons[1].lower() and "not an image" in reasons[4].lower()
    assert all("HSIC_1 needs 4" in reasons[i] for i in (0, 2, 3))
    assert result.images == 4 and np.isfinite(result.a_vs_b).all()


def test_bad_data_and_arguments_give_errors_a_person_can_act_on(micro_models, npz22, tmp_path, capsys):
    assert cli.main(["compare", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "no such folder or file" in capsys.readouterr().err
    base = ["compare", "--models", *micro_models, "--data", str(npz22), "--out", str(tmp_path / "out")]
    assert cli.main([*base, "--batch-size", "3"]) == 2
    assert "--batch-size must be at least 4" in capsys.readouterr().err
    assert cli.main([*base, "--limit", "3"]) == 2
    assert "at least 4 images" in capsys.readouterr().err


def test_tokens_cls_needs_a_class_token():
    torch.manual_seed(0)
    model = ViT(vit_config_of(timm.create_model("vit_medium_patch16_gap_256", pretrained=False, depth=1,
                                                img_size=32))).eval()
    with torch.inference_mode():
        trace = model.trace(torch.randn(4, 3, 32, 32))
    with pytest.raises(ValueError, match="no class token"):
        cmp.block_features(trace, "cls")
    assert list(cmp.block_features(trace, "mean")) == ["block 1"]


# ---- the published result ------------------------------------------------------------------------------------

def test_the_comparing_page_shows_the_shipped_comparisons_of_the_bundled_models():
    """Each shipped pair over 1,000 CIFAR-10 test images, tokens mean (and cls where both models have a class
    token): the files are there, small, what `compare` writes, and docs/comparing.md's tables are the tables those
    files give; either order of a pair reads the same result."""
    page = (ROOT / "docs" / "comparing.md").read_text()
    for names, folder in cmp.PUBLISHED.items():
        has_cls = all(catalog.CATALOG[n].family in ("vit", "cvt") for n in names)
        assert sorted(p.name for p in folder.iterdir()) == (["cls", "mean"] if has_cls else ["mean"]), folder
        for tokens in ("mean", "cls") if has_cls else ("mean",):
            summary = json.loads((folder / tokens / cmp.SUMMARY).read_text())
            assert [m["name"] for m in summary["models"]] == list(names)
            assert summary["tokens"] == tokens and summary["data"]["images"] == 1000 and not summary["data"]["skipped"]
            assert Path(summary["data"]["name"]).name == "cifar10_jpeg.npz" and summary["data"]["limit"] == 1000
            result = cmp.published(names, tokens=tokens)
            assert result.images == 1000 and list(result.layers_a) == summary["layers"]["a"]
            assert cmp.markdown(result, names).strip() in page, (names, tokens)
            for name in summary["files"]:
                assert (folder / tokens / name).stat().st_size < 200_000, name
                if name.endswith(".png"):
                    assert f"checkpoints/{folder.name}/{tokens}/{name}" in page, name
            swapped = cmp.published(names[::-1], tokens=tokens)
            assert np.array_equal(swapped.a_vs_b, result.a_vs_b.T) and swapped.layers_a == result.layers_b
            assert np.array_equal(swapped.a_vs_a, result.b_vs_b) and np.array_equal(swapped.b_vs_b, result.a_vs_a)
    assert cmp.published(("vit-base", "cvt-13")) is None and cmp.published(("vit-cifar10", "vit-cifar10")) is None
    mean, cls = (cmp.published(catalog.BUNDLED_PAIR, tokens=t) for t in ("mean", "cls"))
    neighbours = [*np.diag(mean.a_vs_a, 1), *np.diag(mean.b_vs_b, 1)]
    words = re.sub(r"\s+", " ", page)
    for claim in [f"neighbouring blocks score {min(neighbours):.2f} to {max(neighbours):.2f}",
                  f"ViT's first and last block {mean.a_vs_a[0, -1]:.2f}",
                  f"CvT's first two, convolutional stages ({mean.a_vs_b.max(1).min():.2f} to {mean.a_vs_b.max():.2f})",
                  f"CvT's last block scores {mean.a_vs_b[:, -1].min():.2f} to {mean.a_vs_b[:, -1].max():.2f} against "
                  f"every ViT block and only {mean.b_vs_b[0, -1]:.2f} against CvT's own first block",
                  f"at most {cls.a_vs_b[0].max():.2f} for block 1",
                  f"to {cls.a_vs_b[-1, -1]:.2f} between the two last blocks"]:
        assert claim in words, claim
    assert cls.a_vs_b[-1, -1] == cls.a_vs_b.max() and mean.a_vs_b.argmax(1).max() <= 2   # "closest", "first two stages"


@pytest.mark.parametrize("family", ["swin", "resnet"])
def test_cka_between_a_vit_and_another_family_equals_pytorch_cka_hooks_on_timm(family):
    """A ViT's blocks against a Swin's (windowed attention, merging) or a ResNet's (convolutions, BatchNorm):
    pytorch-cka hooks timm's blocks (their outputs flattened: b h w c for Swin, b c h w for the ResNet, whose
    order the Gram matrices do not see); ours reads the same blocks' tokens from the traces."""
    from cka import compute_cka

    from test_swin import ours_of, timm_swin
    from vitviz.models import ResNet, ResNetConfig

    torch.manual_seed(0)
    timm_vit = perturb_(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                          depth=3, embed_dim=48, num_heads=3, num_classes=10), std=VIT_STD)
    vit = ViT(vit_config_of(timm_vit)).eval()
    load_weights(vit, timm_vit.state_dict())
    if family == "swin":
        other_ref = timm_swin(img_size=32, patch_size=2, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4,
                              num_classes=10)
        other = ours_of(other_ref)
        layers = [f"layers.{s}.blocks.{j}" for s, stage in enumerate(other_ref.layers)
                  for j in range(len(stage.blocks))]
    else:
        other_ref = perturb_(timm.create_model("resnet18", pretrained=False, num_classes=10), std=0.05)
        other = ResNet(ResNetConfig(block="basic", layers=(2, 2, 2, 2), num_classes=10)).eval()
        load_weights(other, other_ref.state_dict())
        layers = [f"layer{s + 1}.{j}" for s in range(4) for j in range(2)]
    models = [m.double().eval() for m in (timm_vit, vit, other_ref, other)]
    batches = [torch.randn(n, 3, 32, 32, dtype=torch.float64) for n in (6, 7)]
    ours = ours_over((models[1], models[3]), batches, "flat")
    [theirs] = compute_cka(models[0], models[2], [batches], layers=[f"blocks.{i}" for i in range(3)],
                           model2_layers=layers, device="cpu", progress=False)
    theirs = theirs.double().numpy()
    assert ((theirs > 0.001) & (theirs < 0.999)).sum() >= 3, "a comparison of clamped values only"
    np.testing.assert_allclose(np.clip(ours.a_vs_b, 0, 1), theirs, atol=1e-5, rtol=0)
