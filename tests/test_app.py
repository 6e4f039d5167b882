"""The app: its event functions on the bundled models, then the real launched app from a real client
and a real browser (Debian's Chromium driven by Playwright)."""
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

import app
import vitviz
from hub_server import closed_port_url
from tests.app_server import SCREENSHOTS, launch, launch_browser
from vitviz.render.captions import Ink
from vitviz.ui import anatomy, attention, classes, download, features, gpu, page, shared, tokens
from vitviz.ui.page import PAIRS_AWAY
from vitviz.video import CAPTION_SCALE

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")


@pytest.fixture(scope="module")
def clicked():
    """One click of Explain on the bundled pair, called as the page calls it."""
    return page.explain({"path": str(PHOTO)}, *PAIR, progress=lambda *a, **k: None)


def is_view_of(view: np.ndarray, photo: Path) -> bool:
    """A panel drawn on the photo: its width is the photo's display width (plus a colour bar at most)."""
    w = Image.open(photo).width
    return view.dtype == np.uint8 and view.ndim == 3 and view.shape[2] == 3 and w <= view.shape[1] < w + 200


def test_explain_answers_predictions_maps_and_their_agreement_and_the_tabs_draw_the_rest(clicked):
    for label in (clicked.label_a, clicked.label_b):
        assert len(label) == 5 and abs(sum(label.values()) - 1) < 0.5
        assert set(label) <= {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
    assert is_view_of(clicked.map_a, PHOTO) and is_view_of(clicked.map_b, PHOTO)
    assert "rank correlation" in clicked.comparison and clicked.point is None
    grids = tokens.render_tokens(clicked.key)
    assert len(grids.grid_a) == 1 and len(grids.grid_b) == 3   # ViT's one patch grid; CvT's three stages
    sliders = attention.after_explain(clicked.key)
    layer_a, layer_b = sliders[0], sliders[2]
    assert layer_a.maximum == 7 and layer_b.maximum == 9   # the bundled ViT's 7 blocks; CvT's 1 + 2 + 6
    norm_a, norm_b = tokens.norm_sliders(clicked.key)[:2]
    assert (norm_a.maximum, norm_a.value, norm_b.maximum, norm_b.value) == (7, 7, 9, 9)


def test_a_layer_or_head_the_model_lacks_is_refused_in_words(clicked):
    key = clicked.key
    with pytest.raises(gr.Error, match="vit-cifar10 has 7 layers: choose a layer from 1 to 7"):
        attention.render_layers(key, 12, 0, 1, 0, None, "row")
    with pytest.raises(gr.Error, match="cvt-cifar10 has 9 layers"):
        tokens.render_norms(key, 7, 0)
    with pytest.raises(gr.Error, match="Layer 2 of cvt-cifar10 has 2 heads: choose a head from 1 to 2, or 0"):
        attention.render_layers(key, 1, 0, 2, 3, None, "row")
    one_block = shared.layer_slider(1)   # Gradio has no slider over one value
    assert (one_block.minimum, one_block.maximum, one_block.value, one_block.interactive) == (1, 2, 1, False)


def test_looks_draws_what_the_library_draws_and_says_what_it_drew(clicked):
    from vitviz import looks
    from vitviz.render.looks import GAP, alpha_view, curve_plot, picture_row, picture_view
    shown = anatomy.looks(["vit-cifar10"], "unit", 4, 17, "", "maco", 4, 0, progress=None)
    reference = looks.draw("vit-cifar10", looks.Unit(block=3, unit=17), settings=looks.Settings(steps=4),
                           device="cpu", bar=False)
    np.testing.assert_array_equal(shown.picture, picture_view(reference.images[0]))
    np.testing.assert_array_equal(shown.alpha, alpha_view(reference.alpha[0]))
    np.testing.assert_array_equal(shown.curve, curve_plot({"block 4's MLP unit 17": reference.curve[0]}))
    assert shown.words.startswith("**vit-cifar10**, block 4's MLP unit 17: MACO, 4 steps of 4 crops, seed 0, drawn in")
    # a concept of the dictionary across the pair, in both at once: one picture exciting it in both
    shown = anatomy.looks(list(PAIR), "concept", 1, 5, "across-cifar10", "pixels", 2, 3, progress=None)
    reference = looks.draw(list(PAIR), looks.Concept("across-cifar10", 5),
                           settings=looks.Settings(method="pixels", steps=2, seed=3), device="cpu", bar=False)
    np.testing.assert_array_equal(shown.picture, picture_view(reference.images[0]))
    assert shown.words.startswith("**vit-cifar10 + cvt-cifar10**, concept 5 of across-cifar10: pixels")
    # a ResNet has no MLP: its block's channel of that number, said in words
    shown = anatomy.looks("resnet-cifar10", "unit", 3, 5, "", "maco", 2, 0, progress=None)
    reference = looks.draw("resnet-cifar10", looks.Channel(block=2, channel=5), settings=looks.Settings(steps=2),
                           device="cpu", bar=False)
    np.testing.assert_array_equal(shown.picture, picture_view(reference.images[0]))
    assert shown.words.startswith("resnet-cifar10's blocks have no MLP, so it has no hidden units: drawn is channel 5 "
                                  "of block 3's output instead. **resnet-cifar10**, block 3's channel 5")
    # at one grid cell (the box's text), two variants and the negative: labelled pictures two to a row, the library's
    shown = anatomy.looks(["vit-cifar10"], "channel", 7, 40, "", "maco", 3, 0, " 9", 2, True, progress=None)
    target, settings = looks.Channel(block=6, channel=40, position=9), looks.Settings(steps=3)
    variants = looks.draw("vit-cifar10", target, settings=settings, variants=2, device="cpu", bar=False)
    negative = looks.draw("vit-cifar10", target, settings=settings, negative=True, device="cpu", bar=False)
    pairs = [("variant 1", variants.images[0]), ("variant 2", variants.images[1]), ("negative", negative.images[0])]
    np.testing.assert_array_equal(shown.picture, picture_row(pairs, side=anatomy.ROW_SIDE, per_row=2,
                                                             width=2 * (anatomy.ROW_SIDE + GAP) + GAP))
    assert shown.words.startswith("**vit-cifar10**, block 7's channel 40 at cell 9: MACO") and "; negative: " in \
        shown.words
    # after an Explain the model box offers the pair and says how long a drawing takes, before it starts
    box, words = anatomy.after_explain(clicked.key, None, 64)
    assert box.value == [PAIR[0]] and [c[0] for c in box.choices] == list(PAIR)
    assert words.startswith("A drawing of vit-cifar10 in 64 steps takes about")


@pytest.mark.parametrize("asked, words", [
    ((["vit-cifar10"], "unit", 4, 5000), r"Block 4 of vit-cifar10 has \d+ units in its MLP \(0 to \d+\): there is no "
                                         r"unit 5000"),
    ((["cvt-cifar10"], "channel", 10, 0), "cvt-cifar10 has 9 blocks: choose a block from 1 to 9"),
    ((["vit-cifar10"], "concept", 1, 5, "cvt-cifar10-last"), "trained on cvt-cifar10 .*not on vit-cifar10"),
    ((["vit-cifar10"], "concept", 1, 5000, "vit-cifar10-last"), r"768 concepts \(0 to 767\): there is no concept 5000"),
    ((["vit-cifar10"], "concept", 1, 5, "../../etc"), "a path on the server"),
    ((["vit-cifar10"], "neuron", 1, 5), "What to draw is unit, channel, concept"),
    ((["vit-cifar10"], "unit", 1.5, 5), "The block must be a whole number of at least 1"),
    ((["vit-cifar10"], "unit", 1, 5, "", "maco", 1000), "at most 256 steps"),
    ((["vit-cifar10"], "unit", 1, 5, "", "lucid"), "There is no method 'lucid'"),
    (([], "unit", 1, 5), "Name a model to draw in"),
    ((["vit-cifar10"], "unit", 4, 5, "", "maco", 4, 0, 64), "Block 4 of vit-cifar10 has a grid of 8 x 8 cells: the "
                                                            r"position is a cell from 0 to 63 \(row by row\), not 64"),
    ((["vit-cifar10"], "concept", 1, 5, "vit-cifar10-last", "maco", 4, 0, 64),
     r"vit-cifar10 reads this target on a grid of 64 cells \(0 to 63, row by row\): there is no position 64"),
    ((["vit-cifar10"], "unit", 4, 5, "", "maco", 4, 0, 1.5), r"The position \(a grid cell\) must be a whole number"),
    ((["vit-cifar10"], "unit", 4, 5, "", "maco", 4, 0, None, 5), "at most 4 variants, not 5"),
], ids=["a unit the block lacks", "a block the model lacks", "a dictionary of another model",
        "a concept the dictionary lacks", "a path on the server", "an unknown kind", "half a block", "too many steps",
        "an unknown method", "no model", "a unit's cell beyond the grid", "a concept's cell beyond the grid",
        "half a cell", "too many variants"])
def test_looks_refuses_what_cannot_be_drawn_in_words_before_any_step(asked, words):
    heard = []
    with pytest.raises(gr.Error, match=words):
        anatomy.looks(*asked, progress=lambda fraction, desc=None: heard.append(desc))
    assert not any(desc.startswith("step") for desc in heard)


@pytest.mark.parametrize("orientation", [1, 6], ids=["upright", "stored on its side"])
def test_a_click_on_a_large_photo_lands_on_the_token_under_it(tmp_path, orientation):
    """A 12 MP JPEG is decoded reduced; clicks come in the pixels of the photo the browser shows."""
    big = Image.open(PHOTO).resize((4000, 3000))
    exif = Image.Exif()
    exif[0x0112] = orientation
    if orientation == 6:
        big = big.transpose(Image.Transpose.ROTATE_90)   # stored sideways: shown 4000 wide again
    big.save(tmp_path / "big.jpg", quality=90, exif=exif.tobytes())
    key = page.explain({"path": str(tmp_path / "big.jpg")}, *PAIR, progress=lambda *a, **k: None).key
    for run in shared.runs(key):
        assert run.image.width < 4000   # decoded reduced
        h, w = run.canvas.size
        assert shared.run_point(run, (4000, 3000)) == pytest.approx((w, h))
        assert shared.run_point(run, (1000, 1500)) == pytest.approx((w / 4, h / 2))


def test_views_reach_the_page_as_files_of_their_own(clicked, tmp_path, monkeypatch):
    """Two identical answers never share a file (one request would rewrite what another's browser reads)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))   # Gradio's cache folder, read at each call
    render = shared.as_files(page.render_maps)
    first, second = render(clicked.key, "inferno", "bilinear", "heatmap", False), \
        render(clicked.key, "inferno", "bilinear", "heatmap", False)
    drawn = page.render_maps(clicked.key, "inferno", "bilinear", "heatmap", False)
    for a, b, array in zip(first[:2], second[:2], drawn[:2]):
        assert a != b and Path(a).is_relative_to(tmp_path) and a.endswith(".jpg")
        for path in (a, b):
            decoded = np.asarray(Image.open(path)).astype(int)
            assert decoded.shape == array.shape and np.abs(decoded - array).mean() < 3   # JPEG, quality 90
    assert first[2] == second[2] == drawn[2]   # text passes through
    stages = shared.as_files(features.render_stages)(clicked.key)
    assert all(isinstance(path, str) and Path(path).is_file() for gallery in stages for path in gallery)


def test_rerenders_draw_from_the_kept_session_and_never_call_a_gpu_function(clicked, monkeypatch):
    key = clicked.key
    for name in ("trace", "class_maps", "faithfulness"):
        monkeypatch.setattr(gpu, name, lambda *a, **k: pytest.fail("a re-render asked for a model pass"))
    views = page.render_maps(key, "turbo", "nearest", "mask", True)
    assert all(is_view_of(v, PHOTO) for v in views[:2])
    assert all(is_view_of(v, PHOTO) for v in attention.render_layers(key, 3, 2, 5, 0, None, "row"))
    assert all(is_view_of(v, PHOTO) for v in attention.render_layers(key, 1, 0, 1, 0, (300, 200), "column"))
    assert all(len(g) >= 2 for g in features.render_stages(key))
    assert all(v.ndim == 3 for v in anatomy.render_anatomy(key))
    assert all(is_view_of(v, PHOTO) for v in tokens.render_norms(key, 7, 9))
    assert len(attention.render_heads(key, 7, 9).heads_a) == 1 + 3   # the head mean, then its 3 heads
    assert "high-norm" in tokens.render_registers(key).note


def test_the_app_process_keeps_no_weights_the_gpu_functions_send_plain_data(clicked):
    """Models cross the GPU boundary by name: the session holds cards (no weights), CPU fp32 pixels and traces."""
    kept = shared.session(clicked.key)
    for run, traced in zip(kept.runs, kept.traced):
        assert run.loaded.model is None and run.pixels.device.type == "cpu" and run.pixels.dtype == torch.float32
        assert all(b.attn.device.type == "cpu" and b.attn.dtype == torch.float32 for b in run.trace.blocks)
        assert traced.filters.ndim == 4
    assert kept.traced[1].positions is None   # CvT has no position embedding


def test_class_maps_faithfulness_and_the_zip_come_from_the_gpu_functions_once_and_are_kept(clicked, monkeypatch):
    key = clicked.key
    target_a = classes.class_choices(key)[0]
    second = target_a.choices[1][1]   # explain the runner-up class
    asked = []
    class_maps, faithfulness = gpu.class_maps, gpu.faithfulness
    monkeypatch.setattr(gpu, "class_maps", lambda *a: asked.append("maps") or class_maps(*a))
    monkeypatch.setattr(gpu, "faithfulness", lambda *a: asked.append("curves") or faithfulness(*a))
    grads = classes.render_gradients(key, "chefer", second, None, None)
    assert all(is_view_of(v, PHOTO) for v in grads) and asked == ["maps"]
    assert classes.render_gradients(key, "chefer", second, None, None)[0].shape == grads[0].shape and asked == ["maps"]
    plots = classes.render_faithfulness(key, "rollout", 4)
    assert all(p.ndim == 3 and p.shape[2] == 3 for p in plots) and asked == ["maps", "curves"]
    with zipfile.ZipFile(download.download(key, ["rollout", "chefer"])) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
        chefer = np.load(archive.open("image/vit-cifar10/chefer.npy"))
    listed = {f"image/{m['model']}/{f}" for m in manifest["images"][0]["models"] for f in m["files"]}
    assert listed == names - {"manifest.json"}
    # the zip's Chefer map is the top class's, computed once more through the GPU function, and equals the CLI's
    from vitviz.session import explain_image
    local = explain_image(shared.session(key).picture, [vitviz.load(PAIR[0])])[0]
    assert np.allclose(chefer, local.token_map("chefer"), rtol=1e-5, atol=1e-7)


def test_plain_word_errors_for_a_non_image_a_model_that_cannot_be_loaded_and_a_missing_class(clicked, tmp_path):
    fake = tmp_path / "page.jpg"
    fake.write_text("<!doctype html><html><body>not a photo</body></html>")
    quiet = dict(progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="not an image"):
        page.explain({"path": str(fake)}, *PAIR, **quiet)
    with pytest.raises(gr.Error, match="Upload an image"):
        page.explain(None, *PAIR, **quiet)
    with pytest.raises(gr.Error) as error:
        page.explain({"path": str(PHOTO)}, "../../etc/passwd", PAIR[1], **quiet)
    assert "passwd" in str(error.value)
    with pytest.raises(gr.Error, match="expired"):
        tokens.render_norms("no-such-session", 1, 1)
    with pytest.raises(gr.Error, match="target class 12 is not one of the model's 10 classes"):
        classes.render_gradients(clicked.key, "chefer", 12, None, None)
    with pytest.raises(gr.Error, match="Choose vit-cifar10's class from the list"):
        classes.render_gradients(clicked.key, "chefer", "a dog", None, None)


def test_app_py_is_only_the_entry_and_only_the_ui_package_imports_gradio():
    assert len((ROOT / "app.py").read_text().splitlines()) < 80
    importers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "vitviz").rglob("*.py")
                 if "import gradio" in p.read_text() or "from gradio" in p.read_text()]
    assert importers and all(path.startswith("vitviz/ui/") for path in importers), importers


def test_offline_no_one_click_pair_is_at_hand_and_a_hub_makes_those_it_serves_so(own_caches, monkeypatch,
                                                                                   dinov2_repos):
    """Every pair's models come from the Hub: with the fake one, the pair it serves is at hand and the ImageNet pair
    it lacks is not; offline, with nothing cached, none is."""
    from huggingface_hub import constants
    at_hand = page.pairs_at_hand()
    assert "DINOv2 vs DINOv2 with registers" in at_hand and "ViT-B vs CvT-13 (ImageNet)" not in at_hand
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert page.pairs_at_hand() == set()


# ---- hosted as a Space: ZeroGPU's conventions, the default pair loaded at start ---------------------------

def in_a_fresh_interpreter(code: str, tmp_path: Path, **env: str) -> dict:
    """Run `code` in a new Python process at the repository root; it prints one JSON object last."""
    environ = {**os.environ, "GRADIO_TEMP_DIR": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


IMPORT_ORDER_AND_CPU_EVENTS = """
import json, sys, zipfile

first = {}   # the first request to import spaces, and torch: in which order, and whether spaces was loaded then

class FirstImports:
    def find_spec(self, name, path=None, target=None):
        if name in ("spaces", "torch") and name not in first:
            first[name] = {"order": len(first), "spaces_loaded": "spaces" in sys.modules}

sys.meta_path.insert(0, FirstImports())
import app
from vitviz.ui import classes, download, gpu, page

key = page.explain({"path": "assets/cat_chelsea.jpg"}, "vit-cifar10", "cvt-cifar10", progress=lambda *a, **k: None).key
print(json.dumps({
    "first": first, "zero_gpu": gpu.ZERO_GPU, "device": gpu.DEVICE,
    "gradients": [view.shape for view in classes.render_gradients(key, "chefer", None, None, None)],
    "faithfulness": [plot.shape for plot in classes.render_faithfulness(key, "rollout", 4)],
    "download": zipfile.is_zipfile(download.download(key, ["rollout"])),
}))
"""


def test_importing_app_loads_spaces_before_torch_and_its_gpu_events_answer_on_the_cpu(tmp_path):
    out = in_a_fresh_interpreter(IMPORT_ORDER_AND_CPU_EVENTS, tmp_path)
    assert out["first"]["spaces"]["order"] == 0 and out["first"]["torch"]["spaces_loaded"]
    assert not out["zero_gpu"] and out["device"] == "cpu"
    assert len(out["gradients"]) == len(out["faithfulness"]) == 2 and out["download"]
    assert all(len(shape) == 3 and shape[2] == 3 for shape in out["gradients"] + out["faithfulness"])


ZEROGPU_START = """
import inspect, json
import app
import torch
from vitviz import catalog, hub
from vitviz.ui import gpu

def duration(event):   # what spaces.GPU was given for it
    given = inspect.getclosurevars(event).nonlocals["duration"]
    return given.__name__ if callable(given) else given

started = app.load_at_start(catalog.BUNDLED_PAIR)
on_cuda = [hub.load(name, device=gpu.DEVICE) for name in catalog.BUNDLED_PAIR]   # what the start loaded
on_cpu = [hub.load(name, device="cpu") for name in catalog.BUNDLED_PAIR]
pixels = torch.rand(1, 3, 32, 32)
functions = {name: getattr(gpu, name) for name in dir(gpu) if callable(getattr(gpu, name))}
print(json.dumps({
    "zero_gpu": gpu.ZERO_GPU, "device": gpu.DEVICE, "in_background": started is not None,
    "devices": [str(m.device) for m in on_cuda],
    "same_logits": [torch.equal(a.model(pixels.to("cuda")).cpu(), b.model(pixels)) for a, b in zip(on_cuda, on_cpu)],
    "durations": {name: duration(fn) for name, fn in functions.items() if hasattr(fn, "zerogpu")},
    "trace_s": [gpu.trace_seconds(None, catalog.BUNDLED_PAIR), gpu.trace_seconds(None, ("vit-base", "cvt-13"))],
}))
"""


def test_on_zerogpu_the_default_pair_is_put_on_cuda_at_start_and_each_model_event_holds_a_gpu_for_a_duration(
        tmp_path):
    """ZeroGPU's own CUDA emulation (the real `spaces` package with SPACES_ZERO_GPU set; its device API is
    never called, as nothing is launched): the start loads the pair in the calling thread, the only one
    whose tensors the emulation sees, onto 'cuda' with the checkpoint's weights; the GPU functions,
    the only ones spaces.GPU decorates, each ask for a GPU with their own duration."""
    out = in_a_fresh_interpreter(ZEROGPU_START, tmp_path, SPACES_ZERO_GPU="true",
                                 SPACES_ZERO_DEVICE_API_URL=closed_port_url())
    assert out["zero_gpu"] and out["device"] == "cuda" and not out["in_background"]
    assert out["devices"] == ["cuda:0", "cuda:0"] and out["same_logits"] == [True, True]
    assert {"trace": "trace_seconds", "class_maps": gpu.MAPS_S,
            "faithfulness": gpu.FAITHFULNESS_S}.items() <= out["durations"].items()
    assert all(isinstance(d, int) and 0 < d <= 120 or isinstance(d, str) for d in out["durations"].values())
    assert out["trace_s"] == [gpu.TRACE_S, gpu.TRACE_LOADING_S]


def test_an_explain_during_the_start_up_load_waits_for_it_with_progress_and_nothing_loads_twice(monkeypatch):
    loads, load = [], app.hub._load

    def slow_load(request, device, progress):
        loads.append(request.name)
        time.sleep(0.5)   # long enough for the Explain to arrive while the start-up load runs
        return load(request, device, progress)

    monkeypatch.setattr(app.hub, "_load", slow_load)
    app.hub.clear_cache()
    loading = app.load_at_start(PAIR)
    deadline = time.monotonic() + 60
    while not loads:
        assert time.monotonic() < deadline, "the start-up load never began"
        time.sleep(0.01)
    heard = []
    answer = page.explain({"path": str(PHOTO)}, *PAIR, progress=lambda fraction, desc=None: heard.append(desc))
    loading.join(timeout=60)
    assert loads == list(PAIR) and not gpu.STARTING
    assert f"waiting for {PAIR[0]}, which the server has been loading since it started" in heard
    assert len(answer.label_a) == len(answer.label_b) == 5


# ---- the launched app ------------------------------------------------------------------------------------

HEADLESS = ("dinov2-s14", "dinov2-s14-reg4")   # the one-click registers pair


@pytest.fixture(scope="module")
def server(tmp_path_factory, dinov2_repos):
    # the Hub it reaches is the fake one (HF_ENDPOINT): the bundled models, and the DINOv2 pair published above
    server = launch(tmp_path_factory.mktemp("app"), env={"HF_HUB_OFFLINE": None})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client
    return Client(server.url, verbose=False, analytics_enabled=False,
                  download_files=str(server.log.parent / "downloads"))


def image_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.load()
        return image.size


def test_the_api_page_lists_one_endpoint_per_computation_and_each_answers_from_a_real_client(client):
    from gradio_client import handle_file
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    computations = {"/explain", "/render_maps", "/render_layers", "/render_heads", "/render_model_view",
                    "/render_tokens", "/render_norms", "/render_registers", "/render_gradients", "/render_faithfulness",
                    "/render_leaderboard", "/render_stages", "/render_features", "/render_anatomy", "/download",
                    "/pick_point", "/stats",
                    "/render_lens", "/render_lens_layer", "/render_residual", "/render_cka", "/compute_cka",
                    "/render_decide", "/patch_plan", "/patch", "/render_windows", "/render_biases", "/render_reach",
                    "/render_reach_layer", "/explain_video", "/concepts", "/circuit", "/looks", "/move_training",
                    "/render_training"}
    assert set(api) == computations, sorted(set(api) ^ computations)
    result = client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    label_a, label_b, map_a, map_b, words = result
    assert label_a["label"] and len(label_a["confidences"]) == 5 and label_b["label"] and "rank correlation" in words
    photo_width = image_size(PHOTO)[0]
    for panel in (map_a, map_b):
        assert photo_width <= image_size(panel)[0] < photo_width + 200
    calls = {
        "/render_maps": ("inferno", "bilinear", "heatmap", False), "/render_layers": (2, 1, 3, 0, "row"),
        "/render_heads": (2, 3, "cls", False, 0.6, "outline"), "/render_model_view": ("cls", False, 0.6, "outline"),
        "/render_tokens": (), "/render_norms": (3, 4), "/render_registers": (), "/render_stages": (),
        "/render_features": (), "/render_anatomy": (), "/render_gradients": ("grad-rollout", None, None),
        "/render_faithfulness": ("rollout", 4), "/download": (["rollout"],),
    }
    for name, args in calls.items():
        outputs = client.predict(*args, api_name=name)
        outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
        assert outputs and all(o is not None for o in outputs), name
        if name == "/download":
            with zipfile.ZipFile(outputs[0]) as archive:
                manifest = json.loads(archive.read("manifest.json"))
                listed = {f"image/{m['model']}/{f}" for m in manifest["images"][0]["models"] for f in m["files"]}
                assert listed == set(archive.namelist()) - {"manifest.json"}
    grids = client.predict(api_name="/render_tokens")
    assert len(grids[0]) == 1 and len(grids[1]) == 3 and "effective stride" in grids[3]


def test_looks_draws_from_a_real_client_with_no_explain_before_it_and_refuses_in_words(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert [p["parameter_name"] for p in api["/looks"]["parameters"]] == [
        "models", "kind", "block", "number", "dictionary", "method", "steps", "seed", "position", "variants",
        "negative"]
    picture, alpha, curve, words = client.predict(["vit-cifar10"], "unit", 2, 5, "", "maco", 4, 0, api_name="/looks")
    assert image_size(picture) == image_size(alpha) == (256, 256) and image_size(curve)[0] > 300
    assert words.startswith("**vit-cifar10**, block 2's MLP unit 5: MACO, 4 steps of 4 crops, seed 0, drawn in")
    with pytest.raises(Exception, match="vit-cifar10 has 7 blocks: choose a block from 1 to 7"):
        client.predict(["vit-cifar10"], "unit", 9, 5, "", "maco", 4, 0, api_name="/looks")

def test_the_faithfulness_tab_shows_the_bundled_models_leaderboard_from_a_real_client(client):
    """The bundled models ship `python -m vitviz evaluate`'s summary beside their checkpoints: the tab shows
    each one's table and mean curves; for a model with none it gives the command that makes one."""
    from vitviz.leaderboard import SUMMARY
    text, plot_a, plot_b = client.predict(*PAIR, api_name="/render_leaderboard")
    for name in PAIR:
        shipped = json.loads((ROOT / "checkpoints" / name / SUMMARY).read_text())
        assert f"**{name}** on {shipped['data']['images']} images" in text
        for method, results in shipped["models"][name]["methods"].items():
            deletion = results["deletion"]
            assert f"{deletion['mean']:.3f} [{deletion['low']:.3f}, {deletion['high']:.3f}]" in text, method
    assert text.count("| random map |") == 2
    assert image_size(plot_a)[0] > 600 and image_size(plot_b)[0] > 600
    text, _, plot_b = client.predict(PAIR[0], "microsoft/cvt-13", api_name="/render_leaderboard")
    assert "**microsoft/cvt-13** has no leaderboard yet" in text
    assert "python -m vitviz evaluate --models microsoft/cvt-13 --data DIR" in text and plot_b is None


def test_every_class_explaining_method_answers_for_both_bundled_models_from_a_real_client(client):
    from gradio_client import handle_file

    from vitviz.explain import METHODS
    client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    for method in (m.name for m in METHODS.values() if m.targeted):
        panels = client.predict(method, None, None, api_name="/render_gradients")
        assert len(panels) == 2, method
        for panel in panels:
            assert image_size(PHOTO)[0] <= image_size(panel)[0] < image_size(PHOTO)[0] + 200, method


@pytest.mark.parametrize("pair", [(HEADLESS[0], PAIR[1]), (PAIR[0], HEADLESS[1])],
                         ids=["without a classifier on the left", "without a classifier on the right"])
def test_a_model_without_a_classifier_answers_every_panel_in_words_from_a_real_client(client, pair):
    from gradio_client import handle_file
    side = 0 if pair[0] in HEADLESS else 1
    result = client.predict(handle_file(str(PHOTO)), *pair, api_name="/explain")
    assert result[side] == {"label": f"{pair[side]}: no classifier, so no predictions", "confidences": None}
    assert len(result[1 - side]["confidences"]) == 5
    assert f"{pair[side]} has no classifier" in result[4]
    grids = client.predict(api_name="/render_tokens")
    tokens, words = grids[side], grids[2 + side]   # the patch grid, and what it shows as page text
    assert len(tokens) == 1 and "patch grid" in words
    assert ("register" in words) == (pair[side] == "dinov2-s14-reg4")
    layers = (2, 2) if side == 0 else (7, 2)
    heads = client.predict(*layers, "cls", True, 0.6, "outline", api_name="/render_heads")
    assert len(heads[side]) == 1 + 6 and heads[side][0]["caption"].startswith("mean of the 6 heads")
    assert "tokens" in heads[side][1]["caption"]
    assert f"{pair[side]}, layer 2: where the class token looks" in heads[2] and "holding 60%" in heads[2]
    pca = client.predict(api_name="/render_features")
    assert pca[side] is not None and "foreground tokens" in pca[2]
    registers = client.predict(api_name="/render_registers")
    assert "high-norm token" in registers[0] and len(registers[3 + side]) == 4 * side   # dinov2-s14-reg4's registers
    strips = client.predict("point", False, 0.6, "outline", api_name="/render_model_view")
    assert len(strips[side]) == 2   # one strip per layer
    for method in ("chefer", "attnlrp"):   # the pooled output explained instead of a class
        panels = client.predict(method, None, None, api_name="/render_gradients")
        assert all(image_size(PHOTO)[0] <= image_size(panel)[0] for panel in panels)
    curves = client.predict("rollout", 4, api_name="/render_faithfulness")
    assert curves[side] is None and curves[1 - side] is not None
    with zipfile.ZipFile(client.predict(["rollout", "chefer"], api_name="/download")) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    entry = manifest["images"][0]["models"][side]
    assert entry["top5"] == [] and entry["target"] is None and "no classifier" in entry["no_predictions"]
    assert manifest["models"][side]["classifier"] is False and manifest["models"][1 - side]["classifier"] is True


# ---- a real browser -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = launch_browser(p)
        yield browser
        browser.close()


def test_a_person_uploads_runs_moves_a_slider_clicks_a_point_and_sees_an_error(server, browser, tmp_path):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url)
    page.locator("#input-image input[type=file]").set_input_files(str(PHOTO))
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()
    # the comparison line comes with the predictions, once the run is over (a progress bar also shows a "%")
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
    for label in ("#label-a", "#label-b"):
        page.locator(label).get_by_text("%").first.wait_for(timeout=10_000)
    for panel in ("#map-a", "#map-b"):
        page.locator(f"{panel} img").first.wait_for(timeout=30_000)
    page.screenshot(path=str(SCREENSHOTS / "1-first-screen.png"))
    # the first screen answers: both top 5s, both rollout maps, the comparison and the tab bar, unscrolled
    for part in ("#label-a", "#label-b", "#map-a img", "#map-b img", "#comparison", "#tabs [role=tablist]"):
        box = page.locator(part).first.bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 900, (part, box)
    page.screenshot(path=str(SCREENSHOTS / "1-explained.png"), full_page=True)

    slider = page.locator("#layer-a input[type=range]")
    slider.focus()
    page.keyboard.press("Home")   # layer 1; the change is sent on release
    slider.dispatch_event("pointerup")
    slider.dispatch_event("change")
    page.locator("#attn-a").scroll_into_view_if_needed()   # below the fold, its image loads lazily
    page.locator("#attn-a img").first.wait_for(timeout=60_000)

    page.get_by_role("tab", name="Explain a class").click()
    page.locator("#class-method").get_by_text("AttnLRP").click()
    page.locator("#class-compute").click()
    for panel in ("#class-map-a", "#class-map-b"):
        page.locator(panel).scroll_into_view_if_needed()
        page.locator(f"{panel} img").first.wait_for(timeout=120_000)
    page.screenshot(path=str(SCREENSHOTS / "2-attnlrp.png"), full_page=True)
    page.locator("#input-image").scroll_into_view_if_needed()

    image = page.locator("#input-image img").first
    box = image.bounding_box()
    image.click(position={"x": box["width"] * 0.4, "y": box["height"] * 0.5})
    page.wait_for_timeout(3000)
    page.screenshot(path=str(SCREENSHOTS / "2-layer-and-point.png"), full_page=True)

    fake = tmp_path / "not-a-photo.jpg"
    fake.write_text("<html>this is a web page</html>")
    page.goto(server.url)   # a fresh page: upload the web page renamed .jpg
    page.locator("#input-image input[type=file]").set_input_files(str(fake))
    page.locator("#explain").click()
    toast = page.get_by_text("not an image", exact=False).first
    toast.wait_for(timeout=60_000)
    page.screenshot(path=str(SCREENSHOTS / "3-error.png"), full_page=True)
    assert server.process.poll() is None   # still serving


# where an <img> draws its picture: Gradio shows a view scaled down to fit its box (object-fit: scale-down), centred
PICTURE_BOX = """img => {
    const box = img.getBoundingClientRect();
    const scale = Math.min(1, box.width / img.naturalWidth, box.height / img.naturalHeight);
    const width = img.naturalWidth * scale, height = img.naturalHeight * scale;
    return {x: box.x + (box.width - width) / 2, y: box.y + (box.height - height) / 2, width, height};
}"""


def overlap(a: dict, b: dict) -> float:
    """The area two bounding boxes share, px²."""
    width = min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"])
    height = min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"])
    return max(0.0, width) * max(0.0, height)


def picture_in_the_clear(page, panel: str) -> dict:
    """The picture of the image panel `panel`, once decoded: wholly inside its panel and under none of the panel's
    label and buttons (fullscreen, download, share); its box."""
    picture = page.locator(f"{panel} img").first
    picture.wait_for(timeout=60_000)
    picture.scroll_into_view_if_needed()
    page.wait_for_function("s => { const i = document.querySelector(s + ' img'); return i.complete && i.naturalWidth; "
                           "}", arg=panel, timeout=30_000)
    drawn, frame = picture.evaluate(PICTURE_BOX), page.locator(panel).bounding_box()
    assert frame["y"] - 1 <= drawn["y"] and drawn["y"] + drawn["height"] <= frame["y"] + frame["height"] + 1, panel
    controls = page.locator(f"{panel} [data-testid=block-label], {panel} .top-panel button").all()
    assert len(controls) >= 2, panel   # its label, and at least fullscreen and download
    for control in controls:
        assert overlap(drawn, control.bounding_box()) == 0, (panel, control.get_attribute("aria-label"), drawn)
    return drawn


@pytest.mark.parametrize("width", [1400, 390], ids=["1400 px wide", "a phone, 390 px wide"])
def test_after_explain_on_an_example_the_answer_is_in_view_and_no_button_covers_a_colour_bar(server, browser, width):
    """On a phone the answer lies below the pairs and the example photos: the page brings it into view. Where it is
    in view already, nothing moves. Every map's picture, its colour bar's top number in its top-right corner, lies
    clear of the panel's label and buttons."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": 844})
    page.goto(server.url)
    page.locator("button.gallery-item", has=page.locator("img[src*=cat_chelsea]")).click()   # the example photo
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
    # the scroll is smooth: it ends with the comparison line inside the viewport
    page.wait_for_function("""() => { const box = document.querySelector('#comparison').getBoundingClientRect();
                                      return box.top >= 0 && box.bottom <= window.innerHeight; }""", timeout=10_000)
    page.screenshot(path=str(SCREENSHOTS / f"9-answer-{width}.png"))
    if width == 1400:
        assert page.evaluate("window.scrollY") == 0
    for panel in ("#map-a", "#map-b"):
        picture_in_the_clear(page, panel)
    page.locator("#map-a").screenshot(path=str(SCREENSHOTS / f"9-colour-bar-{width}.png"))


def test_pairs_the_hub_cannot_serve_are_greyed_and_a_model_that_cannot_load_is_said_once_in_one_place(
        server, browser):
    """The fake Hub serves the DINOv2 pair only: the ImageNet pairs are greyed, the notice says why. A model that
    cannot be loaded, typed in, is said once (the message), and the panels keep the last answer, none saying
    "Error"."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url)
    page.locator("#explain").wait_for(timeout=30_000)
    assert page.get_by_role("button", name="ViT-B vs CvT-13 (ImageNet)").is_disabled()
    assert page.get_by_role("button", name="DINOv2 vs DINOv2 with registers").is_enabled()
    assert page.locator("#notice").get_by_text(PAIRS_AWAY).is_visible()
    page.locator("#input-image input[type=file]").set_input_files(str(PHOTO))
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
    shown = {panel: page.locator(f"{panel} img").first.get_attribute("src") for panel in ("#map-a", "#map-b")}
    labels = page.locator("#label-a").inner_text(), page.locator("#label-b").inner_text()
    left = page.get_by_label("left model")
    left.fill("vit-base")
    left.press("Enter")
    page.locator("#explain").click()
    page.get_by_text("'vit-base'").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)   # a second message, or the panels' error marks, would show by now
    assert [m.is_visible() for m in page.get_by_text("'vit-base'").all()] == [True]
    assert not [e for e in page.locator("[data-testid=status-tracker] .error").all() if e.is_visible()]
    assert {panel: page.locator(f"{panel} img").first.get_attribute("src") for panel in shown} == shown
    assert (page.locator("#label-a").inner_text(), page.locator("#label-b").inner_text()) == labels
    page.screenshot(path=str(SCREENSHOTS / "9-refused.png"))
    assert server.process.poll() is None


TOP_TABS = {"Tokens": "#tokens-tabs", "Attention": "#attention-tabs", "Explain a class": "#classes-tabs",
            "Features": "#features-tabs", "Anatomy": "#anatomy-note", "Compare": "#compare-tabs",
            "What decides": "#decide-tabs", "Video": "#video-run", "Download": "#download-build"}   # a part of each


def open_tab(page, name: str, *, within: str | None = None) -> None:
    """Click a tab (of the tab bar `within`, default the page's), from its "More tabs" menu where the page is too
    narrow to show it: also where the bar, still laying itself out, moves the tab into that menu under the click
    (the click then never lands, and Playwright would retry it until its timeout)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    bar = page.locator(within) if within else page
    tab = bar.get_by_role("tab", name=name)
    if tab.count() and tab.first.is_visible():
        try:
            tab.first.click(timeout=5_000)
            return
        except PlaywrightTimeout:
            pass
    bar.get_by_role("button", name="More tabs").first.click()   # the page's, before a sub-tab bar's own
    bar.locator(".overflow-dropdown button", has_text=name).click()


def load_images(page, selector: str) -> None:
    """Bring every image under `selector` into view (galleries load theirs lazily) and wait until each is decoded,
    so a full-page screenshot shows them."""
    for image in page.locator(f"{selector} img").all():
        image.scroll_into_view_if_needed()
    page.wait_for_function("s => [...document.querySelectorAll(s + ' img')].every(i => i.complete && i.naturalWidth)",
                           arg=selector, timeout=30_000)


@pytest.mark.parametrize("width", [1400, 390], ids=["1400 px wide", "a phone, 390 px wide"])
def test_a_person_reads_the_token_panel_compares_dinov2_with_and_without_registers_and_enlarges_one_head(
        server, browser, width):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.goto(server.url)
    page.locator("#input-image input[type=file]").set_input_files(str(PHOTO))
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()   # the bundled pair: a ViT and a CvT
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
    open_tab(page, "Tokens")
    page.locator("#grid-words-b").get_by_text("receptive field").first.wait_for(timeout=120_000)
    load_images(page, "#grid-a")
    load_images(page, "#grid-b")
    patch_grid, stages = page.locator("#grid-a img"), page.locator("#grid-b img")
    assert stages.count() == 3   # every CvT stage in view, each as wide as the ViT's patch grid, its words as text
    assert all(stages.nth(k).bounding_box()["width"] >= 0.95 * patch_grid.first.bounding_box()["width"]
               for k in range(3))
    assert page.locator("#grid-words-b").inner_text().count("effective stride") == 3
    page.locator("#grid-a").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / f"4-tokens-{width}.png"))

    page.get_by_role("button", name="DINOv2 vs DINOv2 with registers").click()   # one click: both models, Explain
    page.locator("#registers-note").get_by_text("register tokens").first.wait_for(timeout=120_000)
    for gallery in ("#artefacts-a", "#artefacts-b", "#registers-b"):
        page.locator(f"{gallery} img").first.wait_for(timeout=60_000)
        load_images(page, gallery)
    assert page.locator("#registers-b img").count() == 4 and page.locator("#artefacts-a img").count() == 2
    assert "no classifier" in page.locator("#label-a").inner_text()
    page.screenshot(path=str(SCREENSHOTS / f"5-registers-{width}.png"), full_page=True)

    open_tab(page, "Attention")
    open_tab(page, "Heads at a glance", within="#attention-tabs")
    thumbnails = page.locator("#heads-a button.thumbnail-lg")
    thumbnails.first.wait_for(timeout=60_000)
    assert thumbnails.count() == 1 + 6   # the heads' mean, then each of the 6 heads
    thumbnails.nth(3).click()
    enlarged = page.locator("#heads-a button.media-button img")
    enlarged.wait_for(timeout=30_000)
    assert page.locator("#heads-a .caption").first.inner_text().startswith("head 3")
    assert "dinov2-s14, layer 2: where the class token looks" in page.locator("#heads-note").inner_text()
    # enlarged, a head is (nearly) as wide as its column
    assert enlarged.bounding_box()["width"] >= 0.85 * page.locator("#heads-a").bounding_box()["width"]
    load_images(page, "#heads-b")
    page.screenshot(path=str(SCREENSHOTS / f"6-heads-{width}.png"), full_page=True)
    # every top-level tab opens at this width (at 390 px most from the "More tabs" menu), its panel in view
    for name, part in TOP_TABS.items():
        open_tab(page, name)
        page.locator(part).first.wait_for(state="visible", timeout=30_000)
    assert server.process.poll() is None


def test_a_person_explains_a_video_plays_it_in_the_page_and_sends_a_frame_to_every_tab(server, browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url)
    page.locator("#explain").wait_for(timeout=30_000)   # the page is drawn: its tabs are there to count
    open_tab(page, "Video")
    page.locator("#video-input input[type=file]").set_input_files(str(ROOT / "assets" / "horse_pan_zoom.mp4"))
    page.locator("#video-input video").first.wait_for(timeout=30_000)
    page.locator("#video-run").click()
    page.locator("#video-stability").get_by_text("steadier").first.wait_for(timeout=300_000)
    page.locator("#video-result video").first.wait_for(timeout=30_000)
    played = page.evaluate("""async () => {
        const v = document.querySelector('#video-result video');
        v.muted = true; await v.play(); await new Promise(r => setTimeout(r, 1000));
        return {ready: v.readyState, time: v.currentTime, width: v.videoWidth, frames: v.duration};
    }""")
    assert played["ready"] >= 2 and played["time"] > 0 and played["width"] >= 2 * 320, played
    page.locator("#video-timeline img").first.wait_for(timeout=30_000)
    page.screenshot(path=str(SCREENSHOTS / "7-video.png"), full_page=True)
    # on a phone: the timeline whole, clear of its label and buttons, and the captions' capitals 5 px tall or more
    page.set_viewport_size({"width": 390, "height": 844})
    chart = picture_in_the_clear(page, "#video-timeline")
    assert chart["width"] >= 300
    shown = page.locator("#video-result video").bounding_box()["width"] / played["width"]   # 2 panels in 1 row
    capital = Ink.for_size((0, played["width"] // 2), scale=CAPTION_SCALE).text_size("A")[1]
    assert capital * shown >= 5, (capital, shown)
    page.locator("#video-result").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "7-video-390.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 900})
    number = page.locator("#video-frame input[type=number]")
    number.fill("20")
    number.press("Enter")
    page.locator("#video-send").click()   # frame 20 becomes the page's image, and Explain runs on it
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=120_000)
    assert page.locator("#input-image img").first.get_attribute("src").endswith("frame-0019.jpg")
    assert server.process.poll() is None


def test_explain_video_from_a_real_client_returns_a_playable_h264_file_a_timeline_and_the_stability(client):
    import av
    from gradio_client import handle_file
    clip = handle_file(str(ROOT / "assets" / "horse_pan_zoom.mp4"))
    video, timeline, words = client.predict(clip, *PAIR, ["rollout"], 8, api_name="/explain_video")
    path = video["video"] if isinstance(video, dict) else video
    path = path["path"] if isinstance(path, dict) else path
    with av.open(path) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        assert sum(1 for _ in container.decode(stream)) == 32
    assert image_size(timeline)[0] >= 600 and "32 frames" in words and "steadier" in words
