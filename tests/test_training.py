"""What changes as a model learns (`vitviz.training`, `vitviz training`): every measure at every kept checkpoint
recomputed by another path, on a small run trained here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitviz import cli, hub, training
from vitviz.data import open_data, spread
from vitviz.explain import mean_attention_distance
from vitviz.explain.receptive import receptive_field

STEPS = (0, 1, 4)
IMAGES = 10


@pytest.fixture(scope="module")
def run(tmp_path_factory, cifar10_path):
    """A ViT trained for 4 steps here, keeping steps 0, 1 and 4 (int8, the default)."""
    from vitviz.train import main

    out = tmp_path_factory.mktemp("run")
    main(["--arch", "vit-micro", "--data", str(cifar10_path), "--out", str(out), "--epochs", "2",
          "--limit-train", "128", "--limit-test", "50", "--batch-size", "64", "--threads", "1",
          "--save-steps", *map(str, STEPS)])
    return out


@pytest.fixture(scope="module")
def followed(run, cifar10_path):
    return training.follow(str(run), data=cifar10_path, limit=IMAGES, batch_size=4, device="cpu")


def test_every_measure_at_every_checkpoint_equals_its_computation_by_another_path(run, followed, cifar10_path):
    """Accuracy from the plain forward, attention distance from `explain.distance`, the receptive field over all the
    images in one batch, the logit lens's last block as the model's own answer, CKA to itself 1."""
    dataset = open_data(cifar10_path)
    picks = spread(len(dataset), IMAGES)
    images = [dataset.image(i) for i in picks]
    labels = torch.tensor([dataset.labels[i] for i in picks])
    assert [row["step"] for row in followed["checkpoints"]] == list(STEPS)
    assert followed["images"] == IMAGES and len(followed["blocks"]) == 2
    for checkpoint, row in zip(training.checkpoints(str(run)), followed["checkpoints"]):
        loaded = hub.load(checkpoint.name, device="cpu")
        pixels = torch.cat([loaded.preprocess(image) for image in images])
        with torch.inference_mode():
            logits = loaded.model(pixels)
            trace = loaded.model.trace(pixels)
        assert row["accuracy"] == pytest.approx((logits.argmax(1) == labels).float().mean().item(), abs=1e-4)
        distance = [d.mean().item() for d in mean_attention_distance(trace)]
        assert row["attention_distance"] == pytest.approx(distance, abs=1e-3)
        assert row["receptive_field"] == pytest.approx(receptive_field(loaded.model, pixels).r50.tolist(), abs=1e-3)
        assert row["lens_accuracy"][-1] == pytest.approx(row["accuracy"], abs=1e-4)
        assert row["epoch"] == pytest.approx(checkpoint.step / 2, abs=1e-4)   # 128 images in batches of 64
    assert followed["checkpoints"][-1]["cka_to_final"] == pytest.approx([1.0, 1.0], abs=1e-4)


def debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.'s linear CKA with Song et al.'s unbiased HSIC, written out in numpy."""
    def hsic(k, m):
        n = len(k)
        k, m = k - np.diag(np.diag(k)), m - np.diag(np.diag(m))
        return (np.trace(k @ m) + k.sum() * m.sum() / ((n - 1) * (n - 2))
                - 2 / (n - 2) * k.sum(0) @ m.sum(0)) / (n * (n - 3))
    k, m = x @ x.T, y @ y.T
    return hsic(k, m) / np.sqrt(hsic(k, k) * hsic(m, m))


def test_cka_to_the_final_checkpoint_equals_the_formula_in_numpy(run, cifar10_path):
    """One batch of all the images: the minibatch estimator is the plain debiased CKA of each block's mean grid
    token at a checkpoint and at the run's last."""
    result = training.follow(str(run), data=cifar10_path, limit=IMAGES, batch_size=IMAGES, device="cpu")
    dataset = open_data(cifar10_path)
    images = [dataset.image(i) for i in spread(len(dataset), IMAGES)]

    def features(name):
        loaded = hub.load(name, device="cpu")
        with torch.inference_mode():
            trace = loaded.model.trace(torch.cat([loaded.preprocess(image) for image in images]))
        return [b.tokens[:, b.prefix:].mean(dim=1).double().numpy() for b in trace.blocks]

    kept = training.checkpoints(str(run))
    final = features(kept[-1].name)
    for checkpoint, row in zip(kept, result["checkpoints"]):
        expected = [debiased_cka(x, y) for x, y in zip(features(checkpoint.name), final)]
        assert row["cka_to_final"] == pytest.approx(expected, abs=1e-3)


def test_the_nearest_checkpoint_to_a_fraction_of_training(run):
    kept = training.checkpoints(str(run))
    assert [training.nearest(kept, f).step for f in (0.0, 0.2, 0.3, 0.9, 1.0)] == [0, 1, 1, 4, 4]


def test_vitviz_training_writes_the_json_and_figures_and_refuses_a_model_without_checkpoints(run, tmp_path,
                                                                                             cifar10_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["training", "--models", str(run), "--data", str(cifar10_path), "--limit", "8",
                     "--batch-size", "4", "--out", str(out), "--device", "cpu"]) == 0
    name = training.file_name(str(run))
    written = json.loads((out / name).read_text())
    assert written["model"] == str(run) and [row["step"] for row in written["checkpoints"]] == list(STEPS)
    assert set(written["checkpoints"][0]) == {"step", "epoch", "accuracy", "attention_distance", "receptive_field",
                                              "cka_to_final", "lens_accuracy"}
    for figure in (training.figure_name(str(run), training.FIGURE_DISTANCE),
                   training.figure_name(str(run), training.FIGURE_CKA), training.CURVES_FILE):
        assert (out / figure).read_bytes().startswith(b"\x89PNG")
    assert "step 0 to 4" in capsys.readouterr().out

    assert cli.main(["training", "--models", str(tmp_path), "--out", str(out)]) == 2
    assert "keeps 0 checkpoint(s) of its training, and a change needs two" in capsys.readouterr().err
    assert cli.main(["training", "--models", "not-a-model", "--out", str(out)]) == 2
    assert "neither a bundled model nor a training run's folder" in capsys.readouterr().err


def test_the_words_say_what_the_measures_show_in_their_numbers(followed):
    rows = followed["checkpoints"]
    words = training.summary_words(followed)
    assert f"accuracy {100 * rows[0]['accuracy']:.0f} % at step 0" in words
    assert f"{100 * rows[-1]['accuracy']:.0f} % at step 4" in words and f"over {IMAGES} test images" in words
    other = {**followed, "model": "other"}
    both = training.comparison_words([followed, other])
    assert both.count(f"{100 * rows[-1]['accuracy']:.0f} %") >= 2 and "other's" in both
    moves = [abs(end - start) for start, end in zip(rows[0]["attention_distance"], rows[-1]["attention_distance"])]
    most = int(np.argmax(moves))   # the block whose distance moved most, with its two ends
    assert (f"{followed['blocks'][most]} {rows[0]['attention_distance'][most]:.1f} → "
            f"{rows[-1]['attention_distance'][most]:.1f} px") in both
    reach = [row["receptive_field"][0] for row in rows]
    assert f"other {reach[0]:.1f} px at the start, {max(reach):.1f} px at the widest, {reach[-1]:.1f} px" in both


def test_the_figures_draw_a_block_by_checkpoint_grid(followed):
    values = training.block_by_checkpoint(followed, "attention_distance")
    assert values.shape == (2, len(STEPS)) and np.isfinite(values).all()
    for image in (training.distance_figure(followed), training.cka_figure(followed),
                  training.curves_figure([followed])):
        assert image.ndim == 3 and image.shape[2] == 3 and image.std() > 10


def test_a_run_made_in_pieces_equals_the_run_made_at_once(tmp_path, cifar10_path):
    """`--stop-after 1` then `--resume`: the same weights, log and kept steps, bit for bit, as one unbroken run."""
    from safetensors.torch import load_file

    from vitviz.bundle import WEIGHTS_FILE, saved_steps, step_folder
    from vitviz.train import main

    common = ["--arch", "vit-micro", "--data", str(cifar10_path), "--epochs", "3", "--limit-train", "128",
              "--limit-test", "50", "--batch-size", "64", "--threads", "1", "--save-steps", "0", "3", "6"]
    main([*common, "--out", str(tmp_path / "once")])
    main([*common, "--out", str(tmp_path / "pieces"), "--stop-after", "1"])
    assert saved_steps(tmp_path / "pieces") == [0] and not (tmp_path / "pieces" / WEIGHTS_FILE).exists()
    main([*common, "--out", str(tmp_path / "pieces"), "--resume"])
    for folder in (lambda run: tmp_path / run, lambda run: step_folder(tmp_path / run, 3),
                   lambda run: step_folder(tmp_path / run, 6)):
        once, pieces = (load_file(folder(run) / WEIGHTS_FILE) for run in ("once", "pieces"))
        assert once.keys() == pieces.keys() and all(torch.equal(once[k], pieces[k]) for k in once)
    logs = [[{k: v for k, v in json.loads(line).items() if k != "epoch_s"}
             for line in (tmp_path / run / "log.jsonl").read_text().splitlines()] for run in ("once", "pieces")]
    assert logs[0] == logs[1] and len(logs[0]) == 3
