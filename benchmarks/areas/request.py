"""Items 5 and 6: the app's Explain request, in process, against the two models' plain forwards; and a re-render
of the kept runs (a slider move, a colour-map change) against that request."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from PIL import Image

from timing import ms, report, verdict
from vitviz.image import read_image
from vitviz.session import decode_side
from workbench import PHOTO, Bench

TARGETS = {"request": 1.50, "rerender": 0.10}


def page_handlers(bench: Bench) -> SimpleNamespace:
    """The page's handlers (`vitviz.ui`), running the models on this bench's device."""
    from vitviz.ui import attention, gpu, page
    gpu.boundary.DEVICE = str(bench.device)
    gpu.LOCAL_ALLOWED.update(bench.imagenet_pair)
    gpu.LOCAL_ALLOWED.update(bench.bundled_pair[:2])
    return SimpleNamespace(attention=attention, gpu=gpu, page=page)


def measure(bench: Bench, items: set[str]) -> None:
    """The app's Explain on a JPEG from a phone, for the ImageNet pair and the bundled pair, against the two
    models' plain forwards; then, on the runs it kept, a layer/head slider move and a colour-map change."""
    app = page_handlers(bench)
    for what, (a, b) in (("ImageNet pair (ViT-B/16 + CvT-13)", bench.imagenet_pair),
                         (bench.bundled_pair[2], bench.bundled_pair[:2])):
        one_pair(bench, items, app, what, a, b)


def one_pair(bench: Bench, items: set[str], app: SimpleNamespace, what: str, a: str, b: str) -> None:
    """The request and re-render lines of one pair of models (`what`: how the lines name it)."""
    photo = {"path": str(bench.jpeg)}
    megapixels = Image.open(bench.jpeg).width * Image.open(bench.jpeg).height / 1e6
    models = [app.gpu.load_model(name) for name in (a, b)]
    inputs = [m.preprocess(Image.open(PHOTO).convert("RGB")) for m in models]
    keys = []

    def click():
        keys.append(app.page.explain(photo, a, b, progress=lambda *args, **kwargs: None).key)

    def forward(i: int):
        with torch.inference_mode(), bench.amp():   # the request runs as the server runs it, bare
            return models[i].model(inputs[i])

    t = bench.time({"request": click, "a": lambda: forward(0), "b": lambda: forward(1),
                    "decode": lambda: read_image(bench.jpeg, target_size=decode_side(models))})
    forwards = t["a"].median + t["b"].median
    decoded = read_image(bench.jpeg, target_size=decode_side(models)).size
    if "request" in items:
        report(f"app request {megapixels:.0f} MP JPEG, {what}: request {t['request']} (of which JPEG decode to "
               f"{decoded[0]}x{decoded[1]} {ms(t['decode'].median)} ms), plain forwards {ms(t['a'].median)} + "
               f"{ms(t['b'].median)} ms, " + verdict(t["request"].median / forwards, TARGETS["request"]))
    if "rerender" in items:
        key = keys[-1]
        r = bench.time({"layers": lambda: app.attention.render_layers(key, 2, 1, 2, 0, None, "row"),
                        "maps": lambda: app.page.render_maps(key, "viridis", "nearest", "heatmap", True)})
        for name, action in (("layers", "layer/head slider"), ("maps", "colour map")):
            report(f"app re-render ({action}), {what}: {r[name]} vs request {ms(t['request'].median)} ms, "
                   + verdict(r[name].median / t["request"].median, TARGETS["rerender"]))
