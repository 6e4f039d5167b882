"""The app's Compare tab: the logit lens, the residual stream and CKA as the tab draws them, checked against
the library's functions on the locally loaded models (`vitviz.load`, traced here, not through the app), and
the launched app's endpoints from a real client."""
import glob
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

import vitviz
from tests.app_server import launch
from vitviz import compare as library, explain
from vitviz.image import read_image
from vitviz.ui import compare, gpu, page, shared

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
QUIET = dict(progress=lambda *a, **k: None)


def explained(pair=PAIR) -> str:
    """A new Explain of the photo (its own session: nothing of it is kept yet)."""
    return page.explain({"path": str(PHOTO)}, *pair, **QUIET).key


def local_traces(key) -> list:
    """(the locally loaded model, its own trace of the session's pixels) per run: the reference."""
    traced = []
    for run in shared.runs(key):
        model = vitviz.load(run.name).model
        with torch.inference_mode():
            traced.append((model, model.trace(run.pixels)))
    return traced


def recording(monkeypatch, name: str) -> list:
    """Each call's arguments of compare.`name` (a drawing function), which still draws."""
    calls, draw = [], getattr(compare, name)
    monkeypatch.setattr(compare, name, lambda *a, **k: calls.append((a, k)) or draw(*a, **k))
    return calls


def no_gpu(monkeypatch) -> None:
    for name in ("trace", "class_maps", "faithfulness", "lens", "cka"):
        monkeypatch.setattr(gpu, name, lambda *a, **k: pytest.fail("a re-render asked for a model pass"))


def test_the_lens_curves_and_token_classes_drawn_are_the_librarys_on_a_local_trace(monkeypatch):
    key = explained()
    curves, patches = recording(monkeypatch, "lens_plot"), recording(monkeypatch, "lens_patches")
    views = compare.render_lens(key)
    assert views.curve.ndim == 3 and all(v.ndim == 3 for v in (views.patches_a, views.patches_b))
    (drawn,), _ = curves[0]
    assert curves[0][1]["chance"] == pytest.approx(0.1)   # 10 classes each
    for run, (label, (depth, probs)), (model, trace) in zip(shared.runs(key), drawn.items(), local_traces(key)):
        layers = explain.lens_layers(trace)
        final = explain.logit_lens(model, trace)[0, -1].argmax()
        assert label == f"{run.name}: p({run.label(int(final))})"
        assert depth == explain.relative_depth(trace, layers)
        np.testing.assert_allclose(probs, explain.final_class_probability(model, trace)[0], rtol=1e-5, atol=1e-6)
    # the sliders open on each model's last layer, over the layers its lens reads (CvT: its last stage, 4 to 9)
    assert (views.layer_a.minimum, views.layer_a.maximum, views.layer_a.value) == (1, 7, 7)
    assert (views.layer_b.minimum, views.layer_b.maximum, views.layer_b.value) == (4, 9, 9)
    assert "cvt-cifar10's lens starts at layer 4 of 9" in views.note
    compare.render_lens_layer(key, 3, 5)
    for (args, _kwargs), (model, trace), block in zip(patches, local_traces(key) * 2, (6, 8, 2, 4)):
        top, prob = explain.patch_top_class(model, trace, block)
        np.testing.assert_array_equal(args[1], top[0])
        np.testing.assert_allclose(args[2], prob[0], rtol=1e-5, atol=1e-6)
    # the two models share CIFAR-10's classes, so one class has one colour on both sides
    assert patches[2][1]["colours"] == patches[3][1]["colours"]


def test_the_lens_is_one_gpu_call_per_explain_and_a_slider_never_calls_one(monkeypatch):
    key = explained()
    asked, lens = [], gpu.lens
    monkeypatch.setattr(gpu, "lens", lambda names, *args: asked.append(list(names)) or lens(names, *args))
    first = compare.render_lens(key)
    second = compare.render_lens(key)
    assert asked == [list(PAIR)] and np.array_equal(first.curve, second.curve)
    no_gpu(monkeypatch)
    for layers in ((1, 4), (7, 9), (4, 6)):
        assert all(v.ndim == 3 for v in compare.render_lens_layer(key, *layers))
    assert compare.render_residual(key)[0].ndim == 3
    assert compare.render_cka(*PAIR, "cls").a_vs_b.ndim == 3
    assert compare.lens_if_open(key, False) == compare.LensViews(*(gr.skip(),) * 6)   # a closed tab draws nothing


def test_a_layer_the_lens_does_not_read_and_a_lens_not_computed_yet_are_refused_in_words():
    key = explained()
    with pytest.raises(gr.Error, match="not computed yet: open the Compare tab"):
        compare.render_lens_layer(key, 7, 9)
    compare.render_lens(key)
    with pytest.raises(gr.Error, match=r"cvt-cifar10's logit lens reads layers 4 to 9 \(its last stage.*not 2"):
        compare.render_lens_layer(key, 7, 2)
    with pytest.raises(gr.Error, match="vit-cifar10's logit lens reads layers 1 to 7: choose one of them, not 8"):
        compare.render_lens_layer(key, 8, 9)
    assert compare.render_lens(None).note == compare.render_residual(None)[1] == compare.WAITING


def test_the_residual_share_drawn_is_the_librarys_on_a_local_trace(monkeypatch):
    key = explained()
    plots = recording(monkeypatch, "residual_plot")
    plot, note = compare.render_residual(key)
    assert plot.ndim == 3 and note == "cvt-cifar10 has a class token only from layer 4: its solid line starts there."
    (drawn,), _ = plots[0]
    for (depth, cls, grid), (_model, trace) in zip(drawn.values(), local_traces(key)):
        share = explain.residual_share(trace)
        assert depth == explain.relative_depth(trace) and len(depth) == len(trace.blocks)
        np.testing.assert_allclose(cls, share.cls[0], rtol=1e-5, equal_nan=True)
        np.testing.assert_allclose(grid, share.grid[0], rtol=1e-5)
    assert np.isnan(drawn["cvt-cifar10"][1][:3]).all() and not np.isnan(drawn["cvt-cifar10"][1][3:]).any()


@pytest.mark.parametrize("tokens", ["mean", "cls"])
def test_the_bundled_pair_shows_the_shipped_cka(tokens):
    shown = compare.render_cka(*PAIR, tokens)
    shipped = library.CKAResult.load(ROOT / "checkpoints" / "compare-vit-cvt-cifar10" / tokens / "cka.npz")
    expected = library.heatmaps(shipped, PAIR, tokens=tokens)
    for matrix in library.MATRICES:
        np.testing.assert_array_equal(getattr(shown, matrix), expected[matrix])
    assert shown.table == library.markdown(shipped, PAIR)
    assert "over 1,000 CIFAR-10 test images" in shown.note and compare.TOKENS[tokens] in shown.note
    assert len(shipped.layers_b) == (9 if tokens == "mean" else 6)   # CvT's class token: its last stage only


def test_another_pair_says_how_to_compute_it():
    shown = compare.render_cka("vit-base", " cvt-13 ", "mean")
    assert shown.a_vs_b is None and "for vit-base and cvt-13, upload 8 to 256 images below" in shown.note
    with pytest.raises(gr.Error, match="not 'flat'"):
        compare.render_cka(*PAIR, "flat")


def small_pictures(folder: Path, count: int) -> list[str]:
    """`count` different PNGs from the example photos (PNG: read the same at any decode size)."""
    photos = sorted(glob.glob(str(ROOT / "assets" / "*.jpg")))
    paths = []
    for k in range(count):
        picture = Image.open(photos[k % len(photos)]).convert("RGB").resize((72, 56))
        if k >= len(photos):
            picture = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        paths.append(str(folder / f"picture-{k}.png"))
        picture.save(paths[-1])
    return paths


def test_cka_over_uploads_equals_cka_of_images_on_the_local_models(tmp_path):
    paths = small_pictures(tmp_path, 10)
    heard = []
    out = compare.compute_cka(*PAIR, "mean", paths, progress=lambda fraction, desc=None: heard.append(desc))
    reference = library.cka_of_images([vitviz.load(name) for name in PAIR], [read_image(p) for p in paths],
                                      tokens="mean")
    for matrix in library.MATRICES:
        np.testing.assert_allclose(getattr(out.uploaded.result, matrix), getattr(reference, matrix), rtol=1e-9)
    assert out.uploaded.result.layers_b == reference.layers_b and out.uploaded.result.images == 10
    assert "CKA: 10 of 10 images" in heard and "reading image 10 of 10" in heard
    assert "over the 10 images you uploaded" in out.note and out.table == library.markdown(reference, PAIR)
    # kept for the browser: its tokens draw it again, the other tokens the shipped result
    assert "10 images you uploaded" in compare.render_cka(*PAIR, "mean", out.uploaded).note
    assert "1,000 CIFAR-10" in compare.render_cka(*PAIR, "cls", out.uploaded).note


def test_fewer_than_8_images_or_one_that_is_not_an_image_are_refused_in_words(tmp_path, monkeypatch):
    paths = small_pictures(tmp_path, 8)
    with monkeypatch.context() as m:
        m.setattr(gpu, "cka", lambda *a, **k: pytest.fail("too few images reached the GPU"))
        with pytest.raises(gr.Error, match=r"upload at least 8 \(you gave 5\)"):
            compare.compute_cka(*PAIR, "mean", paths[:5], **QUIET)
        with pytest.raises(gr.Error, match=r"upload at least 8 \(you gave 0\)"):
            compare.compute_cka(*PAIR, "mean", None, **QUIET)
    fake = tmp_path / "page.jpg"
    fake.write_text("<!doctype html><html><body>not a photo</body></html>")
    with pytest.raises(gr.Error, match="page.jpg: .*not an image"):
        compare.compute_cka(*PAIR, "mean", [*paths[:7], str(fake)], **QUIET)


def test_a_model_without_a_classifier_has_no_lens_said_in_words(dinov2_repos, monkeypatch):
    key = explained(("dinov2-s14", PAIR[1]))
    asked, lens = [], gpu.lens
    monkeypatch.setattr(gpu, "lens", lambda names, *args: asked.append(list(names)) or lens(names, *args))
    curves = recording(monkeypatch, "lens_plot")
    views = compare.render_lens(key)
    assert asked == [[PAIR[1]]] and views.patches_a is None and views.patches_b.ndim == 3
    assert list(curves[0][0][0]) == ["cvt-cifar10: p(" + shared.runs(key)[1].top(1)[0].label + ")"]
    assert "dinov2-s14 has no classifier (self-supervised), so it has no logit lens" in views.note
    assert views.layer_a.interactive is False
    assert compare.render_lens_layer(key, 2, 9)[0] is None
    plot, note = compare.render_residual(key)
    assert plot.ndim == 3 and "dinov2-s14" not in note   # it has a class token in every block


def test_each_token_takes_its_top_classs_colour_and_a_legend_goes_under_the_picture():
    from vitviz.render import Canvas
    from vitviz.render.compare import CLASS_COLOURS, OTHER_COLOUR, class_colours, lens_patches
    loaded = vitviz.load(PAIR[0])
    image = Image.new("RGB", (64, 64), (128, 128, 128))
    canvas = Canvas(image, loaded.transform, shared.runs(explained())[0].trace.embeddings)
    classes = np.zeros((8, 8), int)
    classes[:, 4:] = 3
    classes[0, 0] = 9
    colours = class_colours(classes[:, 4:], classes)   # 3 most often, then 0, then 9
    assert list(colours) == [3, 0, 9] and list(colours.values()) == list(CLASS_COLOURS[:3])
    view = lens_patches(canvas, classes, np.full((8, 8), 0.5), loaded.labels, colours={3: CLASS_COLOURS[0]},
                        alpha=1.0)
    h, w = canvas.size
    assert tuple(view[h // 2, w * 7 // 8]) == CLASS_COLOURS[0] and tuple(view[h // 2, w // 8]) == OTHER_COLOUR
    assert view.shape[0] > h and view.shape[1] == w   # the legend under the picture


# ---- the launched app ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_compare_endpoints_are_documented_and_answer_from_a_real_client(tmp_path):
    from gradio_client import Client, handle_file
    server = launch(tmp_path)
    try:
        client = Client(server.url, verbose=False, analytics_enabled=False, download_files=str(tmp_path / "got"))
        api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        assert {"/render_lens", "/render_lens_layer", "/render_residual", "/render_cka", "/compute_cka"} <= set(api)
        assert "/compare_open" not in api
        client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
        layer_a, layer_b, curve, patches_a, patches_b, note = client.predict(api_name="/render_lens")
        assert all(Path(p).is_file() for p in (curve, patches_a, patches_b)) and "starts at layer 4" in note
        assert all(Path(p).is_file() for p in client.predict(3, 5, api_name="/render_lens_layer"))
        plot, words = client.predict(api_name="/render_residual")
        assert Path(plot).is_file() and "from layer 4" in words
        note, *maps, table = client.predict(*PAIR, "cls", api_name="/render_cka")
        assert "1,000 CIFAR-10" in note and all(Path(p).is_file() for p in maps) and "| block 7 |" in table
        uploads = [handle_file(p) for p in small_pictures(tmp_path, 8)]
        note, *maps, table = client.predict(*PAIR, "mean", uploads, api_name="/compute_cka")
        assert "over the 8 images you uploaded" in note and all(Path(p).is_file() for p in maps)
    finally:
        server.stop()
