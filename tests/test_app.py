"""The app: its event functions on the bundled models, then the real launched app from a real client
and a real browser (Debian's Chromium driven by Playwright)."""
import json
import os
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

import app
from tests.app_server import launch

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("VITVIZ_SCREENSHOTS", "/tmp/vitviz-screenshots"))


@pytest.fixture(scope="module")
def clicked():
    """One click of Explain on the bundled pair, called as the app calls it."""
    return app.explain({"path": str(PHOTO)}, *PAIR)


def is_view_of(view: np.ndarray, photo: Path) -> bool:
    """A panel drawn on the photo: its width is the photo's display width (plus a colour bar at most)."""
    w = Image.open(photo).width
    return view.dtype == np.uint8 and view.ndim == 3 and view.shape[2] == 3 and w <= view.shape[1] < w + 200


def test_explain_returns_predictions_maps_and_grids_for_both_models(clicked):
    key, label_a, label_b, map_a, map_b, grid_a, grid_b, compare = clicked[:8]
    for label in (label_a, label_b):
        assert len(label) == 5 and abs(sum(label.values()) - 1) < 0.5
        assert set(label) <= {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
    assert is_view_of(map_a, PHOTO) and is_view_of(map_b, PHOTO)
    assert len(grid_a) == 1 and len(grid_b) == 3   # ViT's one patch grid; CvT's three stages
    assert "rank correlation" in compare
    layer_a, layer_b = clicked[8], clicked[10]
    assert layer_a.maximum == 7 and layer_b.maximum == 9   # the bundled ViT's 7 blocks; CvT's 1 + 2 + 6
    norm_a, norm_b = clicked[15:17]
    assert (norm_a.maximum, norm_a.value, norm_b.maximum, norm_b.value) == (7, 7, 9, 9)


def test_a_layer_or_head_the_model_lacks_is_refused_in_words(clicked):
    key = clicked[0]
    with pytest.raises(gr.Error, match="vit-cifar10 has 7 layers: choose a layer from 1 to 7"):
        app.render_layers(key, 12, 0, 1, 0, None, "row")
    with pytest.raises(gr.Error, match="cvt-cifar10 has 9 layers"):
        app.render_norms(key, 7, 0)
    with pytest.raises(gr.Error, match="Layer 2 of cvt-cifar10 has 2 heads: choose a head from 1 to 2, or 0"):
        app.render_layers(key, 1, 0, 2, 3, None, "row")
    one_block = app.layer_slider(1)   # Gradio has no slider over one value
    assert (one_block.minimum, one_block.maximum, one_block.value, one_block.interactive) == (1, 2, 1, False)


@pytest.mark.parametrize("orientation", [1, 6], ids=["upright", "stored on its side"])
def test_a_click_on_a_large_photo_lands_on_the_token_under_it(tmp_path, orientation):
    """A 12 MP JPEG is decoded reduced; clicks come in the pixels of the photo the browser shows."""
    big = Image.open(PHOTO).resize((4000, 3000))
    exif = Image.Exif()
    exif[0x0112] = orientation
    if orientation == 6:
        big = big.transpose(Image.Transpose.ROTATE_90)   # stored sideways: shown 4000 wide again
    big.save(tmp_path / "big.jpg", quality=90, exif=exif.tobytes())
    key = app.explain({"path": str(tmp_path / "big.jpg")}, *PAIR)[0]
    for run in app.RUNS.get(key):
        assert run.image.width < 4000   # decoded reduced
        h, w = run.canvas.size
        assert app.run_point(run, (4000, 3000)) == pytest.approx((w, h))
        assert app.run_point(run, (1000, 1500)) == pytest.approx((w / 4, h / 2))


def test_views_reach_the_page_as_files_of_their_own(clicked, tmp_path, monkeypatch):
    """Two identical answers never share a file (one request would rewrite what another's browser reads)."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))   # Gradio's cache folder, read at each call
    render = app.as_files(app.render_maps)
    first, second = render(clicked[0], "inferno", "bilinear", "heatmap", False), \
        render(clicked[0], "inferno", "bilinear", "heatmap", False)
    drawn = app.render_maps(clicked[0], "inferno", "bilinear", "heatmap", False)
    for a, b, array in zip(first[:2], second[:2], drawn[:2]):
        assert a != b and Path(a).is_relative_to(tmp_path) and a.endswith(".jpg")
        for path in (a, b):
            decoded = np.asarray(Image.open(path)).astype(int)
            assert decoded.shape == array.shape and np.abs(decoded - array).mean() < 3   # JPEG, quality 90
    assert first[2] == second[2] == drawn[2]   # text passes through
    stages = app.as_files(app.render_stages)(clicked[0])
    assert all(isinstance(path, str) and Path(path).is_file() for gallery in stages for path in gallery)


def test_rerenders_reuse_the_kept_trace_and_never_run_a_model(clicked, monkeypatch):
    key = clicked[0]
    runs = app.RUNS.get(key)
    for run in runs:
        monkeypatch.setattr(run.loaded.model, "forward", lambda *a: pytest.fail("a re-render ran the model"))
        monkeypatch.setattr(run.loaded.model, "trace", lambda *a, **k: pytest.fail("a re-render traced the model"))
    views = app.render_maps(key, "turbo", "nearest", "mask", True)
    assert all(is_view_of(v, PHOTO) for v in views[:2])
    for direction in ("row",):
        assert all(is_view_of(v, PHOTO) for v in app.render_layers(key, 3, 2, 5, 0, None, direction))
    assert all(is_view_of(v, PHOTO) for v in app.render_layers(key, 1, 0, 1, 0, (300, 200), "column"))
    assert all(len(g) >= 2 for g in app.render_stages(key))
    assert all(v.ndim == 3 for v in app.render_anatomy(key))
    assert all(is_view_of(v, PHOTO) for v in app.render_norms(key, 7, 9))


def test_gradient_faithfulness_and_download_panels(clicked):
    key = clicked[0]
    target_a = clicked[12]
    second = target_a.choices[1][1]   # explain the runner-up class
    grads = app.render_gradients(key, "chefer", second, None)
    assert all(is_view_of(v, PHOTO) for v in grads)
    plots = app.render_faithfulness(key, "rollout", 4)
    assert all(p.ndim == 3 and p.shape[2] == 3 for p in plots)
    with zipfile.ZipFile(app.download(key, ["rollout", "chefer"])) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
    listed = {f"image/{m['model']}/{f}" for m in manifest["images"][0]["models"] for f in m["files"]}
    assert listed == names - {"manifest.json"}


def test_plain_word_errors_for_a_non_image_and_a_model_that_cannot_be_loaded(tmp_path):
    fake = tmp_path / "page.jpg"
    fake.write_text("<!doctype html><html><body>not a photo</body></html>")
    with pytest.raises(gr.Error, match="not an image"):
        app.explain({"path": str(fake)}, *PAIR)
    with pytest.raises(gr.Error, match="Upload an image"):
        app.explain(None, *PAIR)
    with pytest.raises(gr.Error) as error:
        app.explain({"path": str(PHOTO)}, "../../etc/passwd", PAIR[1])
    assert "passwd" in str(error.value)
    with pytest.raises(gr.Error, match="expired"):
        app.render_norms("no-such-session", 1, 1)


# ---- the launched app ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = launch(tmp_path_factory.mktemp("app"))
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


def test_every_public_endpoint_answers_from_a_real_client(client):
    from gradio_client import handle_file
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/explain" in api
    result = client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    label_a, label_b, map_a, map_b = result[0], result[1], result[2], result[3]
    assert label_a["label"] and len(label_a["confidences"]) == 5 and label_b["label"]
    photo_width = image_size(PHOTO)[0]
    for panel in (map_a, map_b):
        assert photo_width <= image_size(panel)[0] < photo_width + 200
    called = {"/explain"}
    calls = {
        "/render_maps_on_cmap": ("inferno", "bilinear", "heatmap", False),
        "/render_layers_on_layer_a": (2, 1, 3, 0, "row"),
        "/render_stages": (), "/render_anatomy": (), "/render_norms": (3, 4),
        "/render_gradients": ("grad-rollout", None, None),
        "/render_faithfulness": ("rollout", 4),
        "/download": (["rollout"],),
    }
    for name, args in calls.items():
        if name not in api:
            continue
        outputs = client.predict(*args, api_name=name)
        outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
        assert outputs, name
        called.add(name)
        if name == "/download":
            with zipfile.ZipFile(outputs[0]) as archive:
                manifest = json.loads(archive.read("manifest.json"))
                listed = {f"image/{m['model']}/{f}" for m in manifest["images"][0]["models"] for f in m["files"]}
                assert listed == set(archive.namelist()) - {"manifest.json"}
    assert {"/render_stages", "/render_anatomy", "/download"} <= called


# ---- a real browser -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


def test_a_person_uploads_runs_moves_a_slider_clicks_a_point_and_sees_an_error(server, browser, tmp_path):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server.url)
    page.locator("#input-image input[type=file]").set_input_files(str(PHOTO))
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()
    for label in ("#label-a", "#label-b"):
        page.locator(label).get_by_text("%").first.wait_for(timeout=120_000)
    page.screenshot(path=str(SCREENSHOTS / "1-explained.png"), full_page=True)

    slider = page.locator("#layer-a input[type=range]")
    slider.focus()
    page.keyboard.press("Home")   # layer 1; the change is sent on release
    slider.dispatch_event("pointerup")
    slider.dispatch_event("change")
    page.locator("#attn-a img").first.wait_for(timeout=60_000)

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
