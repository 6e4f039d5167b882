"""The bundled CIFAR-10 checkpoints: offline, as accurate as their model cards say, and reproducible
by the training entry point."""
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitviz
from vitviz import catalog
from vitviz.hub import clear_cache
from vitviz.train import load_cifar10

ROOT = Path(__file__).resolve().parents[1]
CARDS = ROOT / "checkpoints" / "README.md"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError(f"a bundled model tried to use the network: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def card_accuracy(name: str) -> float:
    """The full-test-split accuracy the model card states for `name` (in percent)."""
    match = re.search(rf"^\| `{name}` \| ([\d.]+) %", CARDS.read_text(), flags=re.M)
    assert match, f"checkpoints/README.md has no accuracy row for {name}"
    return float(match.group(1))


BUNDLED = [entry.name for entry in catalog.bundled()]


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_model_loads_offline_and_meets_its_model_card_on_1000_test_images(name, no_network, cifar10_path):
    clear_cache()
    loaded = vitviz.load(name)
    assert loaded.source.layout == "vitviz" and loaded.labels == tuple(json.loads(
        (catalog.CATALOG[name].path / "config.json").read_text())["labels"])
    images, labels, classes = load_cifar10(cifar10_path, "test", 1000)
    assert list(loaded.labels) == classes   # the class names come from the data file
    pixels = torch.cat([loaded.preprocess(Image.fromarray(im.permute(1, 2, 0).numpy())) for im in images])
    with torch.inference_mode():
        accuracy = (loaded.model(pixels).argmax(1) == labels).float().mean().item() * 100
    stated = card_accuracy(name)
    assert accuracy >= stated - 3, f"{name}: {accuracy:.1f}% on 1,000 test images, model card says {stated}%"


def test_model_cards_state_what_the_checkpoints_measured():
    for name in BUNDLED:
        config = json.loads((catalog.CATALOG[name].path / "config.json").read_text())
        assert card_accuracy(name) == pytest.approx(config["metrics"]["test_acc"] * 100, abs=0.05)
        assert config["metrics"]["test_images"] == 10_000


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_weights_are_small_enough_for_a_space_and_load_back_as_fp32(name):
    folder = catalog.CATALOG[name].path
    assert (folder / "model.safetensors").stat().st_size < 10 * 2**20
    assert all(p.dtype == torch.float32 for p in vitviz.load(name).model.parameters())


def test_loading_the_bundled_models_in_a_fresh_process_imports_no_symbolic_maths():
    """Weights are allocated for a model built on the meta device without torch's Python references, whose
    first use imports sympy: 0.6 s that the first answer after a start would wait for."""
    code = (f"import sys, vitviz\nfor name in {BUNDLED!r}: vitviz.load(name)\n"
            f"print('sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=CARDS.parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "False"


@pytest.mark.parametrize("arch", ["vit-micro", "cvt-micro", "swin-micro", "resnet-micro"])
def test_one_epoch_of_training_writes_a_loadable_checkpoint_and_resumes(arch, tmp_path, cifar10_path):
    from vitviz.train import main
    out = tmp_path / arch
    args = ["--arch", arch, "--data", str(cifar10_path), "--out", str(out), "--epochs", "1", "--limit-train", "256",
            "--limit-test", "100", "--batch-size", "64", "--threads", "1"]
    main(args)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1] and 0 <= log[0]["test_acc"] <= 1
    loaded = vitviz.load(str(out))
    assert loaded.labels[:2] == ("airplane", "automobile") and loaded.model(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    main([*args, "--epochs", "2", "--resume"])   # one more epoch, from the saved state (the last --epochs wins)
    assert [json.loads(line)["epoch"] for line in (out / "log.jsonl").read_text().splitlines()] == [1, 2]


def test_a_run_keeps_the_steps_asked_for_and_a_bundled_model_loads_at_each(tmp_path, cifar10_path, monkeypatch,
                                                                         capsys):
    """`--save-steps 0 1 4`: the model as initialised, after 1 and after 4 optimiser steps (the run's last, bit for bit
    the checkpoint it ends with), each a folder `vitviz.load` reads as `<model>@<step>` for a bundled model; a step
    that is not there is refused in words naming those that are, and `vitviz models` lists them."""
    from safetensors.torch import load_file

    from vitviz import catalog, cli
    from vitviz.bundle import WEIGHTS_FILE, saved_steps, step_folder
    from vitviz.hub import LoadError
    from vitviz.models import FAMILIES
    from vitviz.train import ARCHITECTURES, main

    out = tmp_path / "vit-cifar10"   # where the catalog will look for the bundled ViT
    main(["--arch", "vit-micro", "--data", str(cifar10_path), "--out", str(out), "--epochs", "2",
          "--limit-train", "128", "--limit-test", "50", "--batch-size", "64", "--threads", "1",
          "--save-steps", "0", "1", "4", "--steps-dtype", "float16"])
    assert saved_steps(out) == [0, 1, 4]
    final, last = (load_file(folder / WEIGHTS_FILE) for folder in (out, step_folder(out, 4)))
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    torch.manual_seed(0)
    initial = FAMILIES["vit"][0](ARCHITECTURES["vit-micro"]).state_dict()
    first = load_file(step_folder(out, 0) / WEIGHTS_FILE)
    assert all(torch.equal(first[k], initial[k].half()) for k in first)
    assert not torch.equal(first["head.weight"], last["head.weight"])

    monkeypatch.setattr(catalog, "CHECKPOINTS", tmp_path)
    loaded = vitviz.load("vit-cifar10@1", device="cpu")
    assert loaded.name == "vit-cifar10@1"
    step_one = load_file(step_folder(out, 1) / WEIGHTS_FILE)
    assert all(torch.equal(v.half(), step_one[k]) for k, v in loaded.model.state_dict().items() if k in step_one)
    with pytest.raises(LoadError, match=r"no checkpoint of vit-cifar10 at step 3; vit-cifar10 keeps steps 0, 1, 4"):
        vitviz.load("vit-cifar10@3", device="cpu")
    assert cli.main(["models"]) == 0
    assert "vit-cifar10@0, vit-cifar10@1, vit-cifar10@4" in capsys.readouterr().out


def test_int8_steps_come_back_within_half_a_step_and_decide_as_the_model(tmp_path, cifar10_path):
    """A run's steps are kept as int8 with a scale per row: every weight within half its row's step of the
    original, the file about half fp16's, and the bundled CvT so stored decides as the fp16 file does."""
    from safetensors.torch import load_file

    from vitviz.bundle import SCALE, WEIGHTS_FILE, copy_bundle, load_bundle, read_config
    from vitviz.train import evaluate, load_cifar10

    source = ROOT / "checkpoints" / "cvt-cifar10"
    copy_bundle(source, tmp_path / "int8")
    assert read_config(tmp_path / "int8")["weights"] == "int8-per-row"
    assert read_config(tmp_path / "int8")["metrics"] == read_config(source)["metrics"]
    assert (tmp_path / "int8" / WEIGHTS_FILE).stat().st_size < 0.55 * (source / WEIGHTS_FILE).stat().st_size
    original, stored = load_file(source / WEIGHTS_FILE), load_file(tmp_path / "int8" / WEIGHTS_FILE)
    (model, transform, _, _), (kept, _, _, _) = load_bundle(source), load_bundle(tmp_path / "int8")
    weights, back = model.state_dict(), kept.state_dict()
    quantised = [k for k in original if k + SCALE in stored]
    assert len(quantised) > 20 and all(stored[k].dtype == torch.int8 for k in quantised)
    for name in quantised:
        rows = stored[name + SCALE]
        step = rows.reshape(-1, *[1] * (weights[name].ndim - 1)) if weights[name].shape[0] > 1 else rows[:, None]
        assert ((back[name] - weights[name]).abs() <= step / 2 + 1e-6).all(), name
    images, labels, _ = load_cifar10(cifar10_path, "test", 500)
    with torch.inference_mode():
        x = transform.normalize(images.float() / 255)
        logits, logits_int8 = model(x), kept(x)
    assert (logits.argmax(1) == logits_int8.argmax(1)).float().mean() >= 0.99
    assert (logits - logits_int8).abs().max() < 0.1
    assert evaluate(kept, images, labels, transform, "cpu")[1].eq(labels).float().mean() > 0.7
