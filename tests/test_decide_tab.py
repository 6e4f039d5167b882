"""The app's What decides tab: direct logit attribution, the top head's token effects and activation patching as
the tab draws them, checked against the library's functions on the locally loaded models (`vitviz.load`, run
here, not through the app); the plan said before patching against the forwards it runs; the zip's decide files
against the CLI's; and the launched app's endpoints from a real client."""
import json
import re
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

import vitviz
from tests.app_server import launch
from vitviz import cli, explain
from vitviz.export import DECIDE, MANIFEST, TOKEN_EFFECTS
from vitviz.models.cvt import CvT
from vitviz.models.vit import ViT
from vitviz.ui import decide, download, gpu, page, shared

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
QUIET = dict(progress=lambda *a, **k: None)


def explained(pair=PAIR, photo=PHOTO) -> str:
    """A new Explain of the photo (its own session: nothing of it is kept yet)."""
    return page.explain({"path": str(photo)}, *pair, **QUIET).key


def recording(monkeypatch, name: str) -> list:
    """Each call's arguments of decide.`name` (a drawing function), which still draws."""
    calls, draw = [], getattr(decide, name)
    monkeypatch.setattr(decide, name, lambda *a, **k: calls.append((a, k)) or draw(*a, **k))
    return calls


def no_gpu(monkeypatch) -> None:
    for name in ("trace", "class_maps", "faithfulness", "lens", "cka", "decide", "patch"):
        monkeypatch.setattr(gpu, name, lambda *a, **k: pytest.fail("a re-render asked for a model pass"))


def local_attribution(run):
    """The library's attribution of the run's top class on the locally loaded model and the session's pixels."""
    model = vitviz.load(run.name).model
    with torch.no_grad():
        trace = model.trace(run.pixels, decompose=True)
    attribution = explain.direct_logit_attribution(model, trace)
    return attribution, explain.token_effect_maps(attribution, trace)[0]


def test_the_contributions_heads_and_token_effects_drawn_are_the_librarys_on_the_local_models(monkeypatch):
    key = explained()
    bars, heads = recording(monkeypatch, "contribution_bars"), recording(monkeypatch, "head_heatmap")
    effects = recording(monkeypatch, "token_effect_view")
    shown = decide.render_decide(key)
    assert all(v.ndim == 3 for v in shown[1:])
    for k, run in enumerate(shared.runs(key)):
        a, maps = local_attribution(run)
        (tables,), _ = bars[k]
        table = tables[run.name]
        assert table["target"] == {"index": run.top(1)[0].index, "label": run.top(1)[0].label}
        assert [row["layer"] for row in table["layers"]] == a.layers
        np.testing.assert_allclose([row["attention"] for row in table["layers"]], a.attention[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose([row["mlp"] for row in table["layers"]], a.mlps[0], rtol=1e-5, atol=1e-6)
        assert table["sum_of_parts"] == pytest.approx(float(a.logit[0]), rel=1e-4)
        (drawn,), options = heads[k]
        np.testing.assert_allclose(drawn, a.heads[0], rtol=1e-5, atol=1e-6)
        assert options["rows"] == [str(layer + 1) for layer in a.layers]
        layer, head = a.top_head(0)
        (canvas, effect), _ = effects[k]
        assert canvas is run.canvas
        np.testing.assert_allclose(effect, maps[layer, head], rtol=1e-5, atol=1e-6)
        assert f"top head: layer {a.layers[layer] + 1}, head {head + 1}" in shown.note
    assert a.layers == [3, 4, 5, 6, 7, 8]   # CvT: the blocks of its last stage, where its class token lives


def test_the_attribution_is_one_gpu_call_per_explain_and_redrawing_or_the_zip_calls_none(monkeypatch):
    key = explained()
    asked, compute = [], gpu.decide
    monkeypatch.setattr(gpu, "decide", lambda names, pixels, prompts=None: asked.append(list(names)) or
                        compute(names, pixels, prompts))
    first = decide.render_decide(key)
    assert asked == [list(PAIR)]
    no_gpu(monkeypatch)
    second = decide.render_decide(key)
    assert np.array_equal(first.bars_b, second.bars_b) and first.note == second.note
    assert "batched forwards" in decide.patch_plan(key, 4)
    with zipfile.ZipFile(download.download(key, ["rollout"], True)) as archive:
        assert {f"image/{name}/{DECIDE}" for name in PAIR} <= set(archive.namelist())
    assert decide.decide_if_open(key, False) == decide.Contributions(*(gr.skip(),) * 7)   # a closed tab draws nothing
    assert decide.render_decide(None).note == decide.patch_plan(None) == decide.WAITING


def counting_forwards(monkeypatch) -> list:
    """Each batched forward a patching run takes (`forward_from` of both architectures), by batch size."""
    calls = []
    for cls in (ViT, CvT):
        original = cls.forward_from
        monkeypatch.setattr(cls, "forward_from", lambda self, index, tokens, *a, _f=original, **k:
                            calls.append(len(tokens)) or _f(self, index, tokens, *a, **k))
    return calls


@pytest.mark.parametrize("group", [1, 4])
def test_the_plan_said_before_patching_is_the_forwards_it_runs_and_the_values_are_the_librarys(monkeypatch, group):
    key = explained()
    plan = decide.patch_plan(key, group)
    forwards, images = (int(n.replace(",", "")) for n in re.search(r"\*\*([\d,]+) batched forwards\*\* of up to 64 "
                                                                   r"patched images \(([\d,]+) in all", plan).groups())
    positions, heads = recording(monkeypatch, "position_table"), recording(monkeypatch, "patch_heads_view")
    calls, heard = counting_forwards(monkeypatch), []
    shown = decide.patch(key, "noise", None, group, progress=lambda fraction, desc=None: heard.append(desc))
    assert (len(calls), sum(calls)) == (forwards, images) and shown.plan == plan
    assert "cvt-cifar10: each head's output, forward 9 of 9" in heard
    assert all(v.ndim == 3 for v in shown[2:])
    for k, run in enumerate(shared.runs(key)):
        model = vitviz.load(run.name).model
        corrupted = explain.corrupt(run.pixels, "noise")
        resid = explain.patch_activations(model, run.pixels, corrupted, site="resid", group=group)
        head = explain.patch_activations(model, run.pixels, corrupted, site="head")
        (drawn,), _ = positions[k]
        for got, want in zip(drawn.grid + drawn.prefix, resid.grid + resid.prefix):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        (_, drawn), _ = heads[k]
        np.testing.assert_allclose(drawn.heads, head.heads, rtol=1e-4, atol=1e-5, equal_nan=True)
        assert drawn.metric.target == run.top(1)[0].index
        assert f"logit({run.label(resid.metric.target)}) - logit({run.label(resid.metric.foil)})" in shown.note
    # kept per second image and group: asking again draws from the session
    no_gpu(monkeypatch)
    again = decide.patch(key, "noise", None, group, **QUIET)
    assert np.array_equal(again.positions_a, shown.positions_a)


def test_patching_from_an_upload_preprocesses_it_as_each_model_does(monkeypatch):
    key = explained()
    other = ROOT / "assets" / "horse.jpg"
    heads = recording(monkeypatch, "patch_heads_view")
    shown = decide.patch(key, "upload", {"path": str(other)}, 4, **QUIET)
    assert "Patched from the image you upload" in shown.note
    for k, (run, horse) in enumerate(zip(shared.runs(key), shared.runs(explained(photo=other)))):
        model = vitviz.load(run.name).model
        reference = explain.patch_activations(model, run.pixels, horse.pixels, site="head")
        np.testing.assert_allclose(heads[k][0][1].heads, reference.heads, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_refusals_are_said_in_words(tmp_path, monkeypatch):
    key = explained()
    with monkeypatch.context() as m:
        m.setattr(gpu, "patch", lambda *a, **k: pytest.fail("a refused request reached the GPU"))
        with pytest.raises(gr.Error, match="squares of 1, 2, 4 tokens, not 3"):
            decide.patch(key, "blur", None, 3, **QUIET)
        with pytest.raises(gr.Error, match="squares of 1, 2, 4 tokens, not 3"):
            decide.patch_plan(key, 3)
        with pytest.raises(gr.Error, match="Upload the second image first"):
            decide.patch(key, "upload", None, 2, **QUIET)
        with pytest.raises(gr.Error, match="not 'sharpen'"):
            decide.patch(key, "sharpen", None, 2, **QUIET)
    fake = tmp_path / "page.jpg"
    fake.write_text("<!doctype html><html><body>not a photo</body></html>")
    with pytest.raises(gr.Error, match="The second image: .*not an image"):
        decide.patch(key, "upload", str(fake), 2, **QUIET)
    with pytest.raises(gr.Error, match="the two images give the model the same answer"):
        decide.patch(key, "upload", str(PHOTO), 2, **QUIET)


def test_a_model_without_a_classifier_is_said_so_and_the_other_is_still_drawn(dinov2_repos, monkeypatch):
    key = explained(("dinov2-s14", PAIR[1]))
    asked, compute = [], gpu.decide
    monkeypatch.setattr(gpu, "decide", lambda names, pixels, prompts=None: asked.append(list(names)) or
                        compute(names, pixels, prompts))
    shown = decide.render_decide(key)
    assert asked == [[PAIR[1]]] and shown.bars_a is None and shown.heads_a is None and shown.effects_a is None
    assert shown.bars_b.ndim == shown.heads_b.ndim == 3
    assert "dinov2-s14 has no classifier (self-supervised), so there is no class logit" in shown.note
    plan = decide.patch_plan(key, 4)
    assert "cvt-cifar10: 9 for the residual stream" in plan and "dinov2-s14" not in plan
    patched = decide.patch(key, "blur", None, 4, **QUIET)
    assert patched.positions_a is None and patched.positions_b.ndim == 3
    with zipfile.ZipFile(download.download(key, ["rollout"], True)) as archive:
        entries = {m["model"]: m for m in json.loads(archive.read(MANIFEST))["images"][0]["models"]}
    assert "skipped" in entries["dinov2-s14"]["decide"] and entries[PAIR[1]]["decide"]["file"] == DECIDE


def test_the_apps_zip_holds_the_decide_files_the_cli_writes_for_the_same_image(tmp_path):
    photo = ROOT / "assets" / "horse.jpg"
    assert cli.main(["explain", str(photo), "--models", *PAIR, "--methods", "rollout", "--out", str(tmp_path / "cli"),
                     "--faithfulness-steps", "0", "--decide"]) == 0
    with zipfile.ZipFile(download.download(explained(photo=photo), ["rollout"], True)) as archive:
        zipped = {Path(n).relative_to("image").as_posix(): n for n in archive.namelist() if n != MANIFEST}
        folder = tmp_path / "cli" / "horse"
        assert set(zipped) == {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        for name in PAIR:
            cli_table = json.loads((folder / name / DECIDE).read_text())
            assert json.loads(archive.read(zipped[f"{name}/{DECIDE}"])) == cli_table
            with archive.open(zipped[f"{name}/{TOKEN_EFFECTS}"]) as f:
                np.testing.assert_allclose(np.load(f), np.load(folder / name / TOKEN_EFFECTS), rtol=1e-5, atol=1e-7)
        app_models = json.loads(archive.read(MANIFEST))["images"][0]["models"]
    cli_models = json.loads((tmp_path / "cli" / MANIFEST).read_text())["images"][0]["models"]
    assert [m["decide"] for m in app_models] == [m["decide"] for m in cli_models]


# ---- the launched app ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_decide_endpoints_are_documented_and_answer_from_a_real_client(tmp_path):
    from gradio_client import Client, handle_file
    server = launch(tmp_path)
    try:
        client = Client(server.url, verbose=False, analytics_enabled=False, download_files=str(tmp_path / "got"))
        api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        assert {"/render_decide", "/patch_plan", "/patch"} <= set(api) and "/decide_open" not in api
        client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
        note, *figures = client.predict(api_name="/render_decide")
        assert "top head" in note and all(Path(p).is_file() for p in figures)
        assert "batched forwards" in client.predict(4, api_name="/patch_plan")
        plan, note, *figures = client.predict("noise", None, 4, api_name="/patch")
        assert "batched forwards" in plan and "Patched from the same photo with noise" in note
        assert all(Path(p).is_file() for p in figures)
        with zipfile.ZipFile(client.predict(["rollout"], True, api_name="/download")) as archive:
            assert {f"image/{name}/{TOKEN_EFFECTS}" for name in PAIR} <= set(archive.namelist())
    finally:
        server.stop()
