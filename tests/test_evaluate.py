"""`vitviz evaluate`: the perturbation tests against a hand computation and against Quantus, sharding
under torchrun, resuming, bad data, and the statistics, on tiny models (no network)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import vitviz
from vitviz import cli, evaluate as ev, leaderboard
from vitviz.bundle import save_bundle
from vitviz.data import DataError, open_data
from vitviz.explain import METHODS, Method
from vitviz.hub import LoadedModel, Source
from vitviz.models import CvT, ViT
from vitviz.preprocess import Transform
from vitviz.train import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
TINY = ev.Settings(batch_size=2, forward_batch=64, steps=4, regions=8, resamples=200)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- fixtures: tiny bundles and data in the shared npz's layout ------------------------------------------

@pytest.fixture(scope="module")
def micro_models(tmp_path_factory) -> list[str]:
    """vitviz's micro ViT and CvT with random weights, as bundle folders, CIFAR-10's class names."""
    folders = []
    for arch, family in (("vit-micro", ViT), ("cvt-micro", CvT)):
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(arch)
        save_bundle(folder, family(ARCHITECTURES[arch]).eval(), labels=CLASSES,
                    transform=Transform(crop=(32, 32), resize=32, mean=CIFAR_MEAN, std=CIFAR_STD))
        folders.append(str(folder))
    return folders


def jpeg(seed: int, size: int = 32) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_npz(path: Path, images: list[bytes], labels: list[int] | None = None, split: str = "test") -> Path:
    """The layout of ../shared/data/cifar10_jpeg.npz: concatenated bytes, n + 1 offsets, labels, class names."""
    offsets = np.cumsum([0, *map(len, images)])
    arrays = {f"{split}_bytes": np.frombuffer(b"".join(images), dtype=np.uint8), f"{split}_offsets": offsets,
              "class_names": np.array(CLASSES)}
    if labels is not None:
        arrays[f"{split}_labels"] = np.array(labels, dtype=np.uint8)
    np.savez(path, **arrays)
    return path


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    """Seven labelled images, the fifth of them not an image at all."""
    images = [jpeg(i) for i in range(7)]
    images[4] = b"<html>not an image</html>"
    return write_npz(tmp_path_factory.mktemp("data") / "tiny.npz", images, labels=[0, 1, 2, 3, 4, 5, 6])


# ---- the perturbation test, by hand ----------------------------------------------------------------------

class TopRowsModel(nn.Module):
    """Class 0 while more than `keep` of the top 4 rows' pixels are not black (-1 after a 0.5/0.5
    normalisation), else class 1."""

    def __init__(self, keep: float):
        super().__init__()
        self.keep = keep

    def forward(self, pixels):
        present = (pixels[:, 0, :4] != -1).flatten(1).sum(dim=1).float()
        return torch.stack([present - self.keep, torch.zeros_like(present)], dim=1)


class BlackCountModel(nn.Module):
    """Class 0 while at most `most` pixels are black, else class 1."""

    def __init__(self, most: int):
        super().__init__()
        self.most = most

    def forward(self, pixels):
        black = (pixels[:, 0] == -1).flatten(1).sum(dim=1).float()
        return torch.stack([self.most + 0.5 - black, torch.zeros_like(black)], dim=1)


def hand_loaded(model: nn.Module, side: int) -> LoadedModel:
    transform = Transform(crop=(side, side), resize=side, mean=(0.5,) * 3, std=(0.5,) * 3)
    return LoadedModel(name="hand", model=model.eval(), family="vit", labels=("zero", "one"), transform=transform,
                       source=Source(kind="folder", location="-", layout="vitviz", weights="-"))


@pytest.mark.parametrize("side, model, positive, negative", [
    # 10x10, reading-order map: positive removes rows 0, 1, ... first; class 0 needs 21 of the top 40 pixels.
    # positive: 0, 10, 20 .. 90 removed -> 40, 30, 20 .. left -> hits 1 1 0 0 0 0 0 0 0 0 -> AUC 0.1 + 0.05
    # negative: the bottom first; 70 removed leaves 30 on top, 80 leaves 20 -> 1 x 8, 0, 0 -> AUC 0.7 + 0.05
    (10, TopRowsModel(keep=20.5), 0.15, 0.75),
    # 7x7 = 49 pixels: int(49 f) = 0, 4, 9, 14, 19, .. black (14.7 -> 14, where rounding would give 15);
    # class 0 while at most 14 are black: hits 1 1 1 1 0 .. -> AUC 0.3 + 0.05, either direction
    (7, BlackCountModel(most=14), 0.35, 0.35),
], ids=["top rows", "int() of the pixel count"])
def test_perturbation_test_auc_of_a_hand_built_case_equals_the_hand_computation(side, model, positive, negative,
                                                                              monkeypatch):
    reading_order = torch.arange(side * side, 0, -1, dtype=torch.float32).reshape(1, side, side)
    monkeypatch.setitem(METHODS, "hand", Method("hand", "hand map", "attention", "-", "-", "-",
                                                maps=lambda model, pixels, target: reading_order))
    loaded = hand_loaded(model, side)
    records, work = ev.evaluate_batch(loaded, torch.ones(1, 3, side, side), indices=[0], labels=torch.tensor([0]),
                                      methods=["hand"], settings=ev.Settings(steps=2, regions=2))
    curves = records[0]["maps"]["hand"]
    assert curves["positive"]["value"] == pytest.approx(positive, abs=1e-12)
    assert curves["negative"]["value"] == pytest.approx(negative, abs=1e-12)
    assert records[0]["fractions"]["positive"] == [k / 10 for k in range(10)]
    # the image once, then per test the map-independent steps once and the others per map (hand, random):
    # positive and negative 1 + 2 x 9; deletion and insertion (0, 50, 100 pixels) 2 + 2 x 1; region 1 + 2 x 2
    assert work.forwarded == 1 + 2 * (1 + 2 * 9) + 2 * (2 + 2 * 1) + (1 + 2 * 2)


def test_the_reference_class_is_the_label_when_the_data_names_the_models_classes(micro_models, npz, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(jpeg(1))
    (flat / "b.jpg").write_bytes(jpeg(2))
    labelled = ev.evaluate(models=micro_models[:1], methods=["rollout"], data=npz, out=tmp_path / "npz",
                           settings=TINY, progress=False)
    unlabelled = ev.evaluate(models=micro_models[:1], methods=["rollout"], data=flat, out=tmp_path / "flat-out",
                             settings=TINY, progress=False)
    name = Path(micro_models[0]).name
    assert labelled["models"][name]["score_against"] == "label"
    assert unlabelled["models"][name]["score_against"] == "prediction"
    records = [json.loads(line) for line in (tmp_path / "npz" / ev.RECORDS).read_text().splitlines()]
    assert [r["models"][name]["reference"] for r in records if "skipped" not in r] == [0, 1, 2, 3, 5, 6]


# ---- region perturbation against Quantus -----------------------------------------------------------------

def test_region_perturbation_equals_quantus_on_a_timm_vit_at_224(tmp_path, monkeypatch):
    import quantus

    from hub_server import timm_checkpoint

    if not hasattr(np, "trapz"):   # quantus 0.6 still calls np.trapz, which numpy 2 removed
        monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)
    reference = timm_checkpoint(tmp_path, "vit_tiny_patch16_224", depth=2, num_classes=10).eval()
    loaded = vitviz.load(str(tmp_path))
    pixels = torch.randn(2, 3, 224, 224)
    records, _ = ev.evaluate_batch(loaded, pixels, indices=[0, 1], labels=None, methods=["rollout"],
                                   settings=ev.Settings(steps=1, regions=196))
    target = np.array([r["prediction"] for r in records])
    maps = torch.stack([ev.method_maps(loaded.model, pixels, torch.from_numpy(target), ["rollout"])["rollout"],
                        torch.stack([torch.rand(14, 14, generator=torch.Generator().manual_seed(i)) for i in (0, 1)])])
    attributions = torch.nn.functional.interpolate(maps.flatten(0, 1)[:, None], size=(224, 224), mode="nearest")
    metric = quantus.RegionPerturbation(patch_size=16, order="morf", perturb_baseline="black", regions_evaluation=196,
                                        disable_warnings=True)
    theirs = metric(model=reference, x_batch=pixels.repeat(2, 1, 1, 1).numpy(), y_batch=np.tile(target, 2),
                    a_batch=attributions.numpy(), device="cpu")
    for k, name in enumerate(["rollout", leaderboard.RANDOM]):
        for i in range(2):
            ours = np.array(records[i]["maps"][name]["region"]["scores"])
            np.testing.assert_allclose(ours[0] - ours[1:], theirs[2 * k + i], atol=1e-5, rtol=0)


# ---- sharding, resuming, bad data -----------------------------------------------------------------------

def run(args: list[str], *, torchrun: bool = False) -> subprocess.CompletedProcess:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
                if torchrun else [sys.executable])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([*launcher, "-m", "vitviz", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_two_torchrun_ranks_merge_to_exactly_the_one_process_result(micro_models, npz, tmp_path):
    args = ["evaluate", "--models", *micro_models, "--methods", "rollout", "chefer", "--data", str(npz),
            "--batch-size", "2", "--forward-batch", "16", "--steps", "4", "--regions", "8"]
    one = run([*args, "--out", str(tmp_path / "one")])
    two = run([*args, "--out", str(tmp_path / "two")], torchrun=True)
    for name in (ev.RECORDS, leaderboard.SUMMARY, "summary.md"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert one.stdout == two.stdout and "| rollout |" in one.stdout
    shards = [(tmp_path / "two" / f"records-rank{r}.jsonl").read_text().splitlines() for r in (0, 1)]
    assert [len(s) for s in shards] == [4, 3]   # chunks 0 and 2 (images 0, 1, 4, 5), 1 and 3 (2, 3, 6)
    assert "rank 0: 3 images" in two.stderr and "rank 1: 3 images" in two.stderr   # image 4 is no image
    for model in micro_models:
        folder = tmp_path / "two" / Path(model).name
        assert json.loads((folder / leaderboard.SUMMARY).read_text())["models"].keys() == {Path(model).name}
        assert Image.open(folder / "curves.png").size[0] > 600


def test_a_killed_run_resumes_without_recomputing_finished_images(micro_models, npz, tmp_path, monkeypatch):
    options = dict(models=micro_models, methods=["rollout"], data=npz, settings=TINY, progress=False)
    fresh = ev.evaluate(out=tmp_path / "fresh", **options)
    computed = []
    evaluate_chunk = ev.evaluate_chunk

    def dies_on_the_third_chunk(chunk, **kwargs):
        if len(computed) == 2:
            raise KeyboardInterrupt
        computed.append(list(chunk))
        return evaluate_chunk(chunk, **kwargs)

    monkeypatch.setattr(ev, "evaluate_chunk", dies_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(out=tmp_path / "killed", **options)
    assert computed == [[0, 1], [2, 3]]
    with (tmp_path / "killed" / "records-rank0.jsonl").open("a") as f:
        f.write('{"run": "cut short by the kill", "ind')   # a line the kill left half written
    computed.clear()

    def counted(chunk, **kwargs):
        computed.append(list(chunk))
        return evaluate_chunk(chunk, **kwargs)

    monkeypatch.setattr(ev, "evaluate_chunk", counted)
    resumed = ev.evaluate(out=tmp_path / "killed", resume=True, **options)
    assert computed == [[4, 5], [6]]
    assert resumed == fresh
    assert (tmp_path / "killed" / ev.RECORDS).read_bytes() == (tmp_path / "fresh" / ev.RECORDS).read_bytes()


def test_an_unreadable_image_among_good_ones_is_listed_as_skipped(micro_models, npz, tmp_path):
    summary = ev.evaluate(models=micro_models[:1], methods=["rollout"], data=npz, out=tmp_path, settings=TINY,
                          progress=False)
    assert summary["data"]["images"] == 6
    [skip] = summary["data"]["skipped"]
    assert skip["id"] == "test/4" and "not an image" in skip["reason"].lower()
    assert "1 image(s) skipped: test/4" in (tmp_path / "summary.md").read_text()


def test_bad_data_gives_errors_a_person_can_act_on(tmp_path, capsys):
    with pytest.raises(DataError, match="no such folder or file"):
        open_data(tmp_path / "missing")
    with pytest.raises(DataError, match="holds no images for the split 'test'.*test_bytes and test_offsets"):
        open_data(write_npz(tmp_path / "train-only.npz", [jpeg(0)], split="train"))
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(DataError, match="it has weights"):
        open_data(tmp_path / "other.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no images"):
        open_data(tmp_path / "empty")
    (tmp_path / "mixed" / "cat").mkdir(parents=True)
    (tmp_path / "mixed" / "loose.jpg").write_bytes(jpeg(0))
    with pytest.raises(DataError, match="both images and sub-folders"):
        open_data(tmp_path / "mixed")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="not an .npz"):
        open_data(tmp_path / "notes.txt")
    assert cli.main(["evaluate", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "no such folder or file" in capsys.readouterr().err


def test_class_folders_give_labels_and_a_flat_folder_none(tmp_path):
    for name, seed in (("dog/a.png", 0), ("cat/b.jpg", 1), ("cat/c.jpg", 2)):
        (tmp_path / "classes" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "classes" / name).write_bytes(jpeg(seed))
    data = open_data(tmp_path / "classes")
    assert data.classes == ("cat", "dog") and data.labels == (0, 0, 1)
    assert data.ids == ("cat/b.jpg", "cat/c.jpg", "dog/a.png")
    assert open_data(tmp_path / "classes" / "cat").labels is None


# ---- statistics ----------------------------------------------------------------------------------------

def test_bootstrap_interval_is_the_normal_interval_for_a_large_sample():
    values = np.random.default_rng(1).normal(3.0, 2.0, 2000)
    result = ev.interval(values, ev.bootstrap_weights(len(values), resamples=2000, seed=0))
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values))
    assert result["mean"] == pytest.approx(values.mean(), abs=1e-6)
    assert result["high"] - result["mean"] == pytest.approx(half, rel=0.1)
    assert result["mean"] - result["low"] == pytest.approx(half, rel=0.1)


@pytest.mark.parametrize("shift, expected", [(0.0, "not distinguishable from random"), (-0.2, "better than random"),
                                             (0.2, "worse than random")])
def test_a_method_is_compared_with_the_random_map_in_words(shift, expected):
    rng = np.random.default_rng(0)
    random = rng.uniform(0, 1, 300)
    method = random + shift + rng.normal(0, 0.01, 300)
    weights = ev.bootstrap_weights(300, resamples=500, seed=0)
    assert ev.verdict(ev.TESTS["deletion"], ev.interval(method - random, weights)) == expected


def test_the_faithfulness_page_shows_the_summaries_shipped_beside_the_bundled_checkpoints():
    """The published leaderboard: each bundled model's summary covers every registered method over 1,000
    CIFAR-10 test images, and docs/faithfulness.md's table is the table those summaries print."""
    page = (ROOT / "docs" / "faithfulness.md").read_text()
    for name in ("vit-cifar10", "cvt-cifar10"):
        summary = json.loads((ROOT / "checkpoints" / name / leaderboard.SUMMARY).read_text())
        assert summary["data"]["images"] == 1000 and list(summary["methods"]) == list(METHODS), name
        assert leaderboard.markdown(summary).strip() in page, name
