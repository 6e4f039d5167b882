"""The app along training: the training slider moves both model boxes to the checkpoint nearest a fraction of their
runs (a model that keeps none stays), the Training tab draws the shipped run's measures and this photo at every
checkpoint (equal to each checkpoint loaded and run on its own), the bundled CvT's run starts at chance, and a person
drags the slider in Chromium at a desktop's and a phone's width."""
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

import vitviz
from tests.app_server import SCREENSHOTS, explained_page
from vitviz import training
from vitviz.ui import page, shared, training as tab

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
QUIET = dict(progress=lambda *a, **k: None)


def kept_run(model: str) -> list[training.Checkpoint]:
    kept = training.bundled_run(model)
    assert kept is not None and len(kept) >= 10 and kept[0].step == 0
    return kept


@pytest.fixture(scope="module")
def cvt_run() -> list[training.Checkpoint]:
    return kept_run("cvt-cifar10")


@pytest.fixture(scope="module")
def vit_run() -> list[training.Checkpoint]:
    return kept_run("vit-cifar10")


def test_the_slider_moves_both_boxes_to_the_nearest_checkpoint_and_a_model_without_a_run_stays(cvt_run, vit_run):
    assert page.move_training(*PAIR, 0) == ("vit-cifar10@0", "cvt-cifar10@0")
    assert page.move_training(*PAIR, 1) == (vit_run[-1].name, cvt_run[-1].name)
    assert page.move_training("vit-base", "cvt-cifar10", 1) == ("vit-base", f"cvt-cifar10@{cvt_run[-1].step}")
    middle = training.nearest(cvt_run, 0.5)
    assert page.move_training("cvt-cifar10@0", "resnet-cifar10", 0.5)[0] == f"cvt-cifar10@{middle.step}"
    with pytest.raises(gr.Error, match="from 0 \\(initialisation\\) to 1 \\(end of training\\), not 1.5"):
        page.move_training(*PAIR, 1.5)

    kept, at, words = page.training_point("resnet-cifar10", f"cvt-cifar10@{middle.step}")
    assert kept and at == pytest.approx(training.fraction_of(f"cvt-cifar10@{middle.step}"), abs=1e-3)
    assert f"cvt-cifar10: step {middle.step} (epoch" in words and "resnet-cifar10: no kept run" in words
    assert page.training_point("resnet-cifar10", "swin-cifar10") == (False, 1.0, "")
    assert page.training_point(*PAIR)[1] == 1.0   # the models as shipped: the end


@pytest.mark.parametrize("model", PAIR)
def test_a_bundled_run_starts_at_chance_and_ends_where_the_bundled_model_does(model, cifar10_path):
    """Step 0 is the initialisation (accuracy about 10 % on a balanced test set); the run's end, a re-run of the
    bundled recipe on this project's CPU, within 1.5 points of the bundled model on 2,000 test images."""
    from vitviz.bundle import read_config
    from vitviz.train import evaluate, load_cifar10

    run = kept_run(model)
    images, labels, _ = load_cifar10(cifar10_path, "test", 2000)
    accuracy = {}
    for name in (f"{model}@0", run[-1].name, model):
        loaded = vitviz.load(name, device="cpu")
        predicted = evaluate(loaded.model, images, labels, loaded.transform, "cpu")[1]
        accuracy[name] = predicted.eq(labels).float().mean().item()
    assert abs(accuracy[f"{model}@0"] - 0.10) < 0.04
    assert abs(accuracy[run[-1].name] - accuracy[model]) < 0.015
    recipe, bundled = read_config(run[-1].folder)["training"], read_config(ROOT / "checkpoints" / model)
    assert {k: recipe[k] for k in bundled["training"]} == bundled["training"]   # the same recipe, seed, data, epochs
    # the options vitviz.train gained since, at the values the bundled run had before they existed
    assert {k: v for k, v in recipe.items() if k not in bundled["training"]} == {
        "optimizer": "adamw", "clip_grad": 1.0, "channels_last": False}


def test_the_training_tab_draws_the_shipped_run_and_the_photo_at_every_checkpoint(cvt_run):
    key = page.explain({"path": str(PHOTO)}, "vit-cifar10", f"cvt-cifar10@{cvt_run[3].step}", **QUIET).key
    words, distance_a, distance_b, cka_a, cka_b, curves, photo, born = tab.render_training(key)
    shipped = training.shipped("cvt-cifar10")
    assert training.summary_words(shipped) in words and "**cvt-cifar10**: accuracy" in words
    for figure in (distance_b, cka_b, curves, photo):
        assert isinstance(figure, np.ndarray) and figure.shape[2] == 3 and figure.std() > 10
    assert training.summary_words(training.shipped("vit-cifar10")) in words
    assert training.comparison_words([training.shipped(m) for m in PAIR]) in words
    for figure in (distance_a, cka_a):
        assert isinstance(figure, np.ndarray) and figure.shape[2] == 3 and figure.std() > 10

    series = tab.photo_series(key)
    assert series[0]["steps"] == [c.step for c in kept_run("vit-cifar10")]
    cvt = series[1]
    assert cvt["steps"] == [c.step for c in cvt_run] and cvt["labels"] == list(shared.runs(key)[1].loaded.labels)
    pixels = shared.session(key).traced[1].pixels
    for checkpoint, probs in zip(cvt_run[::4], cvt["probs"][::4]):   # each checkpoint loaded and run on its own
        loaded = vitviz.load(checkpoint.name, device="cpu")
        with torch.inference_mode():
            expected = loaded.model(pixels).softmax(dim=-1)[0].numpy()
        np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert shared.runs(key)[1].name == f"cvt-cifar10@{cvt_run[3].step}"   # the Explain ran the checkpoint itself


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 390], ids=["1400 px wide", "a phone, 390 px wide"])
def test_a_person_drags_the_training_slider_to_the_start_and_opens_the_training_tab(bundled_app, width):
    from tests.test_app import open_tab
    with explained_page(bundled_app.url, PHOTO, width=width) as page_:
        where = page_.locator("#training-slider")
        assert "cvt-cifar10: as shipped" in where.inner_text()
        before = page_.locator("#label-b").inner_text()
        slider = page_.locator("#training-slider input[type=range]")
        slider.scroll_into_view_if_needed()
        slider.fill("0")
        slider.dispatch_event("pointerup")   # the end of a drag: Gradio's `release`
        where.get_by_text("cvt-cifar10: step 0").first.wait_for(timeout=120_000)
        page_.wait_for_function("before => document.querySelector('#label-b').innerText !== before", arg=before,
                                timeout=120_000)
        assert page_.locator("#tabs").count() == 1
        open_tab(page_, "Training")
        page_.locator("#training-words").get_by_text("CKA to the end").first.wait_for(timeout=120_000)
        for panel in ("#training-photo", "#training-curves", "#training-cka-b"):
            image = page_.locator(f"{panel} img").first
            image.wait_for(state="attached", timeout=120_000)
            image.scroll_into_view_if_needed()
            image.wait_for(timeout=60_000)
        assert page_.locator("#training-photo img").first.bounding_box()["width"] <= width
        page_.locator("#tabs").screenshot(path=str(SCREENSHOTS / f"11-training-{width}.png"))
    assert bundled_app.process.poll() is None


def test_a_step_is_a_model_name_in_the_command_line_and_the_app_and_a_missing_one_is_refused_with_those_kept(
        cvt_run, tmp_path, capsys):
    from vitviz import cli

    out = tmp_path / "out"
    assert cli.main(["explain", str(PHOTO), "--models", "cvt-cifar10@0", f"cvt-cifar10@{cvt_run[-1].step}",
                     "--methods", "rollout", "--out", str(out)]) == 0
    manifest = (out / "manifest.json").read_text()
    assert "cvt-cifar10@0" in manifest and f"cvt-cifar10@{cvt_run[-1].step}" in manifest
    kept = ", ".join(str(c.step) for c in cvt_run)
    assert cli.main(["explain", str(PHOTO), "--models", "cvt-cifar10@7", "--out", str(out)]) == 2
    assert f"no checkpoint of cvt-cifar10 at step 7; cvt-cifar10 keeps steps {kept}" in capsys.readouterr().err
    with pytest.raises(gr.Error, match=f"no checkpoint of cvt-cifar10 at step 7; cvt-cifar10 keeps steps {kept}"):
        page.explain({"path": str(PHOTO)}, "vit-cifar10", "cvt-cifar10@7", **QUIET)


@pytest.mark.parametrize("model", PAIR)
def test_the_concepts_tab_says_when_each_concept_of_the_dictionary_across_the_run_was_born(model):
    """At the run's last step the Concepts tab offers the dictionary across the run, and its table says each shown
    concept's birth as `concepts evaluate` measured it (metrics.json beside the dictionary)."""
    import json

    from vitviz import catalog
    from vitviz.concepts.build import METRICS
    from vitviz.ui import concepts

    run = kept_run(model)
    name = run[-1].name
    assert list(catalog.RUN_DICTIONARY_STEPS[model]) == [c.step for c in run]   # every kept step
    assert f"{model}-training" in concepts.dictionaries_for(name)
    births = json.loads((catalog.BUNDLED_DICTIONARIES[f"{model}-training"].path / METRICS).read_text())["births"]
    assert births["steps"] == list(catalog.RUN_DICTIONARY_STEPS[model])
    key = page.explain({"path": str(PHOTO)}, "resnet-cifar10", name, **QUIET).key
    shown = concepts.render_concepts(key, "", f"{model}-training")
    assert "*born at*" in shown.words_b and "| born at |" in shown.words_b
    rows = [line.split("|")[1:-1] for line in shown.words_b.splitlines() if line.startswith("| ") and "---" not in line]
    heads = [cell.strip() for cell in rows[0]]
    for row in rows[1:]:
        concept, born = int(row[heads.index("concept")]), row[heads.index("born at")].strip()
        expected = births["born_at"][concept]
        assert born == ("not at the end" if expected is None else f"step {expected}")
