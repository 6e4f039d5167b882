"""The documentation's screenshots of the app, remade from the bundled models whenever a view changes:

    python docs/make_screenshots.py            (writes docs/images/first-screen.png and docs/images/tab-<id>.png)
    python docs/make_screenshots.py circuits   (the Circuits tab's two alone, after an Explain not shot)
    python docs/make_screenshots.py concepts anatomy   (those tabs' alone: any of circuits, concepts, anatomy, training)
    python docs/make_screenshots.py concepts variants  (and a concept card's variants drawn, once the tab is open)

The real app is launched offline on its bundled CIFAR-10 pair (a ViT and a CvT) and driven by Debian's Chromium
through Playwright, 1400 px wide, as a person would: the example photo uploaded, Explain pressed, a point on the
cat clicked, then each tab opened and whatever it needs run (Compute, the example clip, Build the zip). Each
picture is a 256-colour PNG, which keeps all of them to a few megabytes."""
from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.app_server import launch  # noqa: E402  (the launcher the app's tests use)
from vitviz.catalog import BUNDLED_PAIR  # noqa: E402

IMAGES = ROOT / "docs" / "images"
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
CLIP = ROOT / "assets" / "horse_pan_zoom.mp4"
CHROMIUM = "/usr/bin/chromium"
WIDTH, FIRST_SCREEN_HEIGHT = 1400, 900
SLOW = 300_000   # ms: a model pass on a busy CPU (the video: every frame through both models)


def save(png: bytes, name: str) -> None:
    """A screenshot as a 256-colour PNG: the views' colour maps survive, the file is a fifth of the size."""
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    picture.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        IMAGES / name, optimize=True)
    print(f"{name}: {picture.width}x{picture.height}, {(IMAGES / name).stat().st_size // 1024} KiB")


def loaded(page, selector: str) -> None:
    """Every shown image under `selector` (those of closed tabs aside) scrolled into view, as galleries load
    theirs lazily, and decoded."""
    for image in page.locator(f"{selector} img").all():
        if image.is_visible():
            image.scroll_into_view_if_needed()
    page.wait_for_function("s => [...document.querySelectorAll(s + ' img')].every(i => !i.offsetParent || "
                           "(i.complete && i.naturalWidth))", arg=selector, timeout=SLOW)


def drawn(page, *panels: str) -> None:
    """Wait until each panel shows an image, then until all of them are decoded."""
    for panel in panels:
        page.locator(f"{panel} img").first.wait_for(timeout=SLOW)
        loaded(page, panel)


def shoot_tab(page, tab: str) -> None:
    """The tab bar and the open tab's panel, whole."""
    loaded(page, "#tabs")
    # scrolling the images into view scrolled the galleries inside: back to their first picture
    page.evaluate("document.querySelectorAll('#tabs *').forEach(e => { e.scrollTop = 0; })")
    page.wait_for_timeout(500)   # the last layout shift after the images
    save(page.locator("#tabs").screenshot(), f"tab-{tab}.png")


def explained(page, url: str) -> None:
    """The photo uploaded and Explain pressed, its answer drawn."""
    page.goto(url)
    page.locator("#input-image input[type=file]").set_input_files(str(PHOTO))
    page.locator("#input-image img").first.wait_for(timeout=30_000)
    page.locator("#explain").click()
    page.locator("#comparison").get_by_text("rank correlation").first.wait_for(timeout=SLOW)
    drawn(page, "#map-a", "#map-b")


def first_screen(page, url: str) -> None:
    explained(page, url)
    page.evaluate("window.scrollTo(0, 0)")
    save(page.screenshot(), "first-screen.png")


def tabs(page) -> None:
    """Each tab as it answers after the Explain, given what it needs to show something."""
    page.get_by_role("tab", name="Tokens").click()
    page.locator("#grid-words-b").get_by_text("receptive field").first.wait_for(timeout=SLOW)
    drawn(page, "#grid-a", "#grid-b")
    shoot_tab(page, "tokens")

    page.get_by_role("tab", name="Attention").click()
    drawn(page, "#attn-a", "#attn-b")
    before = page.locator("#attn-a img").first.get_attribute("src")
    image = page.locator("#input-image img").first   # a click on the cat: where that token looks
    box = image.bounding_box()
    image.click(position={"x": box["width"] * 0.4, "y": box["height"] * 0.5})
    page.wait_for_function("before => document.querySelector('#attn-a img').src !== before", arg=before,
                           timeout=SLOW)
    drawn(page, "#attn-a", "#attn-b")
    shoot_tab(page, "attention")

    page.get_by_role("tab", name="Explain a class").click()
    page.locator("#class-compute").click()   # the default method on each model's top class
    drawn(page, "#class-map-a", "#class-map-b")
    shoot_tab(page, "classes")

    page.get_by_role("tab", name="Features").click()
    page.wait_for_function("() => document.querySelectorAll('#features-tabs img').length >= 4", timeout=SLOW)
    shoot_tab(page, "features")

    anatomy(page)

    page.get_by_role("tab", name="Compare").click()
    drawn(page, "#lens-curve", "#lens-a", "#lens-b")
    shoot_tab(page, "compare")

    page.get_by_role("tab", name="What decides").click()
    drawn(page, "#decide-bars-a", "#decide-bars-b", "#decide-heads-a", "#decide-heads-b")
    shoot_tab(page, "decide")

    concepts(page)
    variants(page)
    circuits(page)
    training(page)

    page.get_by_role("tab", name="Video").click()
    page.locator("#video-input input[type=file]").set_input_files(str(CLIP))
    page.locator("#video-input video").first.wait_for(timeout=30_000)
    page.locator("#video-run").click()
    page.locator("#video-stability").get_by_text("steadier").first.wait_for(timeout=SLOW)
    drawn(page, "#video-timeline")
    page.evaluate("""async () => {   // a frame from the middle of the clip, not a blank first one
        const v = document.querySelector('#video-result video');
        if (v.readyState < 1) await new Promise(r => v.addEventListener('loadedmetadata', r, {once: true}));
        v.currentTime = v.duration / 2;
        await new Promise(r => v.addEventListener('seeked', r, {once: true}));
    }""")
    shoot_tab(page, "video")

    page.get_by_role("tab", name="Download").click()
    page.locator("#download-build").click()
    page.locator("#download-file a").first.wait_for(timeout=SLOW)
    shoot_tab(page, "download")


def concepts(page) -> None:
    """The Concepts tab as it opens: the bundled pair's own dictionaries, each card with its shipped picture."""
    page.get_by_role("tab", name="Concepts").click()   # opening it reads the bundled pair's own dictionaries
    page.locator("#concepts-words-a table").first.wait_for(timeout=SLOW)
    drawn(page, "#concepts-a", "#concepts-b")
    shoot_tab(page, "concepts")


def variants(page) -> None:
    """On the open Concepts tab: the left column's first card picked and its variants drawn (three and the negative,
    after its shipped picture), the card shown large."""
    page.locator("#concepts-a button.thumbnail-item").first.click()
    page.locator("#concepts-variants").click()
    page.locator("#concepts-pick").get_by_text("drawn in").first.wait_for(timeout=SLOW)
    page.wait_for_timeout(1500)
    loaded(page, "#concepts-a")
    page.locator("#concepts-a").scroll_into_view_if_needed()
    page.wait_for_timeout(1500)
    card = page.evaluate("""() => {   // the largest image shown in the gallery (the picked card, previewed), where
        let best = null;              // its pixels lie in its box (fitted, centred), in the page's coordinates
        for (const i of document.querySelectorAll('#concepts-a img')) {
            const r = i.getBoundingClientRect();
            const s = Math.min(r.width / i.naturalWidth, r.height / i.naturalHeight);
            const width = i.naturalWidth * s, height = i.naturalHeight * s;
            if (i.offsetParent && (!best || width * height > best.width * best.height))
                best = {x: r.x + (r.width - width) / 2, y: r.y + (r.height - height) / 2 + window.scrollY, width,
                        height};
        }
        return best;
    }""")
    save(page.screenshot(full_page=True, clip=card), "tab-concepts-variants.png")


def anatomy(page) -> None:
    """The Anatomy tab with the ViT's block 4 MLP unit 100 drawn (eyes, in 64 steps of MACO) as three variants and
    its negative, and the drawing alone: the pictures, their transparency maps and the objective's curves."""
    page.get_by_role("tab", name="Anatomy").click()
    page.wait_for_function("() => [...document.querySelectorAll('#tabs [role=tabpanel]')].some(p => "
                           "p.offsetParent && p.querySelectorAll('img').length >= 4)", timeout=SLOW)
    page.locator("#looks-block input").fill("4")
    page.locator("#looks-number input").fill("100")
    page.locator("#looks-variants input[type=number]").fill("3")
    page.locator("#looks-variants input[type=number]").press("Enter")
    page.locator("#looks-negative input[type=checkbox]").check()
    page.locator("#looks-draw").click()
    page.locator("#looks-words").get_by_text("drawn in").first.wait_for(timeout=SLOW)
    drawn(page, "#looks-picture", "#looks-alpha", "#looks-curve")
    shoot_tab(page, "anatomy")
    page.locator("#looks-note").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    scrolled = page.evaluate("window.scrollY")   # a clip of the whole page is in its coordinates, not the window's
    top, bottom = (page.locator(part).bounding_box() for part in ("#looks-note", "#looks-words"))
    save(page.screenshot(full_page=True, clip={"x": top["x"] - 8, "y": top["y"] + scrolled - 8,
                                               "width": top["width"] + 16,
                                               "height": bottom["y"] + bottom["height"] - top["y"] + 16}),
         "tab-anatomy-looks.png")


def circuits(page) -> None:
    """The Circuits tab as it opens (both circuits drawn), the strongest node of the left graph's last block picked,
    then the same graphs on a phone, 390 px wide (the first of them in view), then both pruned again to 40 nodes by
    the size slider, then the class over the test set."""
    page.get_by_role("tab", name="Circuits").click()
    page.locator("#circuits-note").get_by_text("F = ").first.wait_for(timeout=SLOW)
    drawn(page, "#circuits-graph-a", "#circuits-graph-b", "#circuits-curves")
    page.locator("#circuits-node input").click()
    page.locator("[role=option]", has_text="left").filter(has_text="block 7").first.click()
    page.locator("#circuits-card-words").get_by_text("Strongest inputs").first.wait_for(timeout=SLOW)
    drawn(page, "#circuits-card")
    shoot_tab(page, "circuits")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(1000)   # the page laid out again
    page.locator("#circuits-graph-a").scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -60)")
    save(page.screenshot(), "tab-circuits-phone.png")
    page.set_viewport_size({"width": WIDTH, "height": FIRST_SCREEN_HEIGHT})
    # the size slider: both circuits pruned again on the host to 40 nodes (the ViT's is larger, the CvT's smaller)
    size = page.locator("#circuits-size input[type=range]")
    size.scroll_into_view_if_needed()
    size.fill("40")
    size.dispatch_event("pointerup")   # the end of a drag: Gradio's `release`
    page.locator("#circuits-note").get_by_text("Circuits of 40 nodes").first.wait_for(timeout=SLOW)
    drawn(page, "#circuits-graph-a", "#circuits-graph-b", "#circuits-curves")
    save(page.locator("#tabs").screenshot(), "tab-circuits-size.png")
    # the class over the test set: the bundled pair's shipped class circuits, the graphs and the words
    page.locator("#circuits-scope").get_by_text("the class over the test set").click()
    page.locator("#circuits-note").get_by_text("test images labelled").first.wait_for(timeout=SLOW)
    drawn(page, "#circuits-graph-a", "#circuits-graph-b")
    page.locator("#circuits-note").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    save(page.locator("#tabs").screenshot(), "tab-circuits-class.png")


def training(page) -> None:
    """The Training tab as it opens (the bundled pair's runs, the photo along training), on a phone too; then the
    training slider dragged to the start: the first screen at the initialisation, and the tab's marks there."""
    page.get_by_role("tab", name="Training").click()
    page.locator("#training-words").get_by_text("CKA").first.wait_for(timeout=SLOW)
    drawn(page, "#training-photo", "#training-curves")
    shoot_tab(page, "training")
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("#training-photo").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    save(page.screenshot(), "tab-training-phone.png")
    page.set_viewport_size({"width": WIDTH, "height": FIRST_SCREEN_HEIGHT})
    before = page.locator("#map-a img").first.get_attribute("src")
    slider = page.locator("#training-slider input[type=range]")
    slider.fill("0")
    slider.dispatch_event("pointerup")   # what Gradio's slider hears as the end of a drag (its `release`)
    page.locator("#training-slider").get_by_text(": step 0").first.wait_for(timeout=SLOW)
    page.wait_for_function("before => document.querySelector('#map-a img').src !== before", arg=before,
                           timeout=SLOW)
    drawn(page, "#map-a", "#map-b", "#training-photo")
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(500)
    save(page.screenshot(), "training-slider.png")


if __name__ == "__main__":
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vitviz-screenshots-") as tmp:
        vit, cvt = BUNDLED_PAIR   # named, so the page carries no offline notice
        server = launch(Path(tmp), "--vit", vit, "--cvt", cvt)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
                page = browser.new_page(viewport={"width": WIDTH, "height": FIRST_SCREEN_HEIGHT})
                if sys.argv[1:]:
                    explained(page, server.url)
                    for part in sys.argv[1:]:
                        {"circuits": circuits, "concepts": concepts, "variants": variants, "anatomy": anatomy,
                         "training": training}[part](page)
                else:
                    first_screen(page, server.url)
                    tabs(page)
                browser.close()
        finally:
            server.stop()
