"""vitviz's web app: two vision transformers side by side on one image. Only wiring lives here:
every computation is a vitviz call (load, read_image, explain_image, the runs' views, export).

    python app.py [--vit NAME] [--cvt NAME]     (host and port: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import itertools
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402

from vitviz import catalog, hub  # noqa: E402
from vitviz.export import image_files, manifest, safe_name, write_atomic, write_manifest, zip_folder  # noqa: E402
from vitviz.image import MAX_UPLOAD_BYTES, ImageError, read_image  # noqa: E402
from vitviz.session import METHODS, MODEL_GATE, RunStore, agreement, decode_side, explain_image  # noqa: E402
from vitviz.render import DEFAULT_CMAP, per_uniform, shared_scale, attention_distance_plot, faithfulness_plot  # noqa: E402
from vitviz.render import filter_tiles, embedding_filters, position_tiles  # noqa: E402
from vitviz.explain import mean_attention_distance  # noqa: E402

try:   # ZeroGPU on a Hugging Face Space; a no-op everywhere else
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

ROOT = Path(__file__).resolve().parent
EXAMPLES = sorted(str(p) for p in (ROOT / "assets").glob("*.jpg"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS = RunStore(int(os.environ.get("VITVIZ_SESSIONS", "16")))
# seconds an upload, a drawn view or a zip stays in Gradio's cache folder before it is deleted
FILE_TTL = int(os.environ.get("VITVIZ_FILE_TTL", "3600"))
VIEW_QUALITY = 90   # JPEG quality of the drawn views the page shows
CMAPS = ["viridis", "inferno", "turbo", "magma"]
DEFAULTS: dict[str, str] = {}   # filled by main(): the pair the page opens with
LOCAL_ALLOWED: set[str] = set()  # local folders the server owner named on the command line


def load_model(name: str, progress=None):
    """A model the page asked for: catalog names and Hub ids; local folders only if the owner named them."""
    name = (name or "").strip()
    if not name:
        raise gr.Error("Choose a model for both columns.")
    try:
        return hub.load(name, device=DEVICE, progress=progress, allow_local=name in LOCAL_ALLOWED)
    except hub.LoadError as e:
        raise gr.Error(str(e)) from None


def upload_path(payload) -> str:
    """The uploaded file's path (the event skips Gradio's own decoding, so vitviz checks the file first)."""
    if payload is None:
        raise gr.Error("Upload an image first, or click one of the examples.")
    return payload["path"] if isinstance(payload, dict) else str(payload)


def kept_runs(key):
    """The runs of the page's last Explain, kept server side (bounded: old sessions are dropped)."""
    try:
        return RUNS.get(key)
    except KeyError as e:
        raise gr.Error(e.args[0]) from None


def top5(run) -> dict[str, float]:
    return {p.label: p.prob for p in run.top(5)}


def comparison(runs, maps) -> str:
    a, b = runs
    rho = agreement(a, b, *maps)
    same = a.top(1)[0].label == b.top(1)[0].label
    verdict = (f"Both predict **{a.top(1)[0].label}**." if same else
               f"They disagree: {a.name} says **{a.top(1)[0].label}**, {b.name} says **{b.top(1)[0].label}**.")
    agree = ("Their rollout maps cannot be compared on this image." if rho is None else
             f"Their attention rollout maps agree with a rank correlation of **{rho:.2f}** "
             f"(Spearman, over the image region both models saw; 1 = same ordering, 0 = unrelated).")
    return f"{verdict} {agree}"


def map_views(key, cmap, mode, style, shared):
    runs = kept_runs(key)
    maps = [run.token_map("rollout") for run in runs]
    values = [per_uniform(m) for m in maps] if shared else maps
    scale = shared_scale(*values) if shared else None
    views = [run.map_view("rollout", values=v, scale=scale, cmap=cmap, mode=mode, style=style)
             for run, v in zip(runs, values)]
    return (*views, comparison(runs, maps))


@gpu
def explain(image, model_a, model_b, progress=gr.Progress()):
    """The one-click run: both models once on the image; predictions, rollout and token grids."""
    loaded = [load_model(name, lambda f, d: progress(f, desc=d)) for name in (model_a, model_b)]
    progress(0.6, desc="reading the image")
    target = decode_side(loaded)
    try:
        picture = read_image(upload_path(image), target_size=target)
    except ImageError as e:
        raise gr.Error(str(e)) from None
    progress(0.7, desc="running both models")
    runs = explain_image(picture, loaded)
    key = RUNS.put(runs)
    progress(0.9, desc="drawing")
    a_map, b_map, compare = map_views(key, DEFAULT_CMAP, "bilinear", "heatmap", False)
    layer = [layer_slider(len(r.trace.blocks)) for r in runs]
    heads = [gr.Slider(minimum=0, maximum=r.trace.blocks[-1].attn.shape[1], value=0, step=1) for r in runs]
    targets = [gr.Dropdown(choices=[(f"{p.label} ({p.prob:.0%})", p.index) for p in r.top(5)],
                           value=r.top(1)[0].index) for r in runs]
    return (key, top5(runs[0]), top5(runs[1]), a_map, b_map, runs[0].grid_views(), runs[1].grid_views(), compare,
            layer[0], heads[0], layer[1], heads[1], targets[0], targets[1], None, layer[0], layer[1])


def layer_slider(depth: int) -> gr.Slider:
    """A layer slider over a model's blocks, on its last one (Gradio has no slider over a single value:
    a one-block model gets 1..2, locked at 1)."""
    return gr.Slider(minimum=1, maximum=max(depth, 2), value=depth, step=1, interactive=depth > 1)


def render_maps(key, cmap, mode, style, shared):
    """Colour options changed: redraw the rollout panels from the kept traces."""
    return map_views(key, cmap, mode, style, shared)


def block_index(run, layer) -> int:
    """A layer slider's 1-based number -> the block index, checked against this model's depth."""
    depth = len(run.trace.blocks)
    if not 1 <= int(layer) <= depth:
        raise gr.Error(f"{run.name} has {depth} layer{'s' * (depth > 1)}: choose a layer from 1 to {depth}.")
    return int(layer) - 1


def head_index(run, block: int, head) -> int | None:
    """A head slider's number (0 = the mean over heads) -> the head index, checked against the block."""
    heads = run.trace.blocks[block].attn.shape[1]
    if not 0 <= int(head) <= heads:
        raise gr.Error(f"Layer {block + 1} of {run.name} has {heads} head{'s' * (heads > 1)}: choose a head "
                       f"from 1 to {heads}, or 0 for their mean.")
    return None if int(head) == 0 else int(head) - 1


def render_layers(key, layer_a, head_a, layer_b, head_b, point, direction):
    """Per-layer, per-head attention (head 0 = the mean over heads), for the chosen token if any."""
    runs = kept_runs(key)
    if direction == "column" and point is None:
        raise gr.Error("Click a point on the input image to choose the token.")
    views = []
    for run, layer, head in zip(runs, (layer_a, layer_b), (head_a, head_b)):
        block = block_index(run, layer)
        views.append(run.attention_view(layer=block, head=head_index(run, block, head),
                                        point=run_point(run, point), direction=direction))
    return tuple(views)


def run_point(run, point):
    """A click on the input image, in the pixels of the image the browser shows (the upload, upright) ->
    the run's display frame. A large JPEG was decoded reduced, so the run's image can be smaller."""
    if point is None:
        return None
    h, w = run.canvas.size
    shown_w, shown_h = run.image.info.get("full_size", run.image.size)
    return point[0] * w / shown_w, point[1] * h / shown_h


def pick_point(key, layer_a, head_a, layer_b, head_b, direction, evt: gr.SelectData):
    """A click on the input image: the token under it, in both models at once."""
    point = tuple(evt.index)
    runs = kept_runs(key)
    grids = [run.grid_views(point=run_point(run, point)) for run in runs]
    return (point, *render_layers(key, layer_a, head_a, layer_b, head_b, point, direction), *grids)


@gpu
def render_gradients(key, method, target_a, target_b):
    """Gradient-weighted maps for a class chosen from each model's top 5 (one backward pass each)."""
    runs = kept_runs(key)
    return tuple(run.map_view(method, target=None if t is None else int(t)) for run, t in zip(runs, (target_a, target_b)))


def render_stages(key):
    """Per-stage features (CvT's three stages; ViT's one token grid) and each stage's most active channels."""
    runs = kept_runs(key)
    return tuple(run.stage_views() + [run.channel_view(len(run.trace.features) - 1)] for run in runs)


def render_anatomy(key):
    """ViT paper figure 7: embedding filters, position-embedding similarity, mean attention distance."""
    runs = kept_runs(key)
    distances = {run.name: [d[0].tolist() for d in mean_attention_distance(run.trace)] for run in runs}
    return (*(filter_tiles(embedding_filters(run.loaded.model)) for run in runs),
            *(position_tiles(run.loaded.model) for run in runs), attention_distance_plot(distances))


@gpu
def render_faithfulness(key, method, steps):
    """Deletion and insertion curves of each model's map against a random order."""
    runs = kept_runs(key)
    plots = []
    for run in runs:
        curves = run.faithfulness(method, steps=int(steps))
        plots.append(faithfulness_plot(
            fractions=curves["fractions"],
            deletion={METHODS[method]: curves["deletion/map"]["scores"], "random": curves["deletion/random"]["scores"]},
            insertion={METHODS[method]: curves["insertion/map"]["scores"], "random": curves["insertion/random"]["scores"]},
            target=f"{run.name}: {run.label(curves['target'])}"))
    return tuple(plots)


def render_norms(key, layer_a, layer_b):
    runs = kept_runs(key)
    return tuple(run.norm_view(block_index(run, layer)) for run, layer in zip(runs, (layer_a, layer_b)))


@gpu
def download(key, methods):
    """Every panel as PNG, every map as .npy and a manifest, zipped (the CLI's exporter, same files)."""
    runs = kept_runs(key)
    methods = methods or ["rollout"]
    entry = {"id": "image", "path": "upload", "size": [runs[0].image.height, runs[0].image.width], "models": []}
    with tempfile.TemporaryDirectory(prefix="vitviz-export-") as folder:
        folder = Path(folder)
        for run in runs:
            files, model_entry = image_files(run, methods)
            for name, data in files.items():
                write_atomic(folder / "image" / safe_name(run.name) / name, data)
            entry["models"].append(model_entry)
        write_manifest(folder, manifest(models=[r.loaded for r in runs], methods=methods,
                                        params={"head_fusion": "mean", "discard_ratio": 0.0}, images=[entry],
                                        skipped=[], faithfulness_steps=0))
        # zipped straight into Gradio's cache, which serves it as is and deletes it after FILE_TTL
        return str(zip_folder(folder, cache_folder() / "vitviz-results.zip"))


def stats() -> dict:
    """The server's load, for its owner and the reliability tests: model passes (running now, most ever at
    once, total), kept sessions and loaded models against their bounds."""
    return {"model_slots": MODEL_GATE.slots, "model_running": MODEL_GATE.running, "model_peak": MODEL_GATE.peak,
            "model_passes": MODEL_GATE.passes, "sessions": len(RUNS), "sessions_max": RUNS.capacity,
            "models_loaded": len(hub.CACHE.names()), "models_max": hub.CACHE.max_models}


def default_pair() -> tuple[str, str, str]:
    """(vit, cvt, notice): the ImageNet pair when it can be had, else the bundled CIFAR-10 pair, said so."""
    vit = os.environ.get("VITVIZ_VIT") or DEFAULTS.get("vit")
    cvt = os.environ.get("VITVIZ_CVT") or DEFAULTS.get("cvt")
    if vit and cvt:
        return vit, cvt, ""
    if all(hub.available(name) for name in catalog.IMAGENET_PAIR):
        return (*catalog.IMAGENET_PAIR, "")
    return (*catalog.BUNDLED_PAIR, "**Offline:** the Hugging Face Hub cannot be reached and the ImageNet models are not "
            "cached, so the page uses vitviz's bundled CIFAR-10 models (32x32 classifiers of 10 classes: airplane, "
            "automobile, bird, cat, deer, dog, frog, horse, ship, truck).")


def build() -> gr.Blocks:
    vit, cvt, notice = default_pair()
    choices = list(catalog.CATALOG)
    model_events = dict(concurrency_id="model", concurrency_limit=MODEL_GATE.slots)
    instant = dict(concurrency_limit=None, show_progress="minimal")
    with gr.Blocks(title="vitviz: see inside vision transformers", analytics_enabled=False) as demo:
        gr.Markdown("# vitviz: see inside vision transformers\n"
                    "Upload a photo (or click an example), pick two models, press **Explain**. Each column shows "
                    "what one model predicted, where its attention flows (rollout: how much each image region "
                    "feeds the class token through all layers) and how it cuts the image into tokens. "
                    "Hatched regions are parts of your image the model never saw (its centre crop).")
        gr.Markdown(notice, visible=bool(notice), elem_id="notice")
        key, point = gr.State(None), gr.State(None)
        with gr.Row():
            with gr.Column(scale=1):
                image = gr.Image(label="image (click it to pick a token)", type="filepath",
                                 sources=["upload", "clipboard", "webcam"], elem_id="input-image")
                gr.Examples(EXAMPLES, inputs=[image], label="example photos (licences in assets/README.md)")
            with gr.Column(scale=1):
                model_a = gr.Dropdown(choices, value=vit, allow_custom_value=True, label="left model",
                                      info="a catalog name or a Hub id (owner/name)")
                model_b = gr.Dropdown(choices, value=cvt, allow_custom_value=True, label="right model")
                run = gr.Button("Explain", variant="primary", elem_id="explain")
                compare = gr.Markdown(elem_id="comparison")
        with gr.Row():
            label_a = gr.Label(num_top_classes=5, label="left: top 5", elem_id="label-a")
            label_b = gr.Label(num_top_classes=5, label="right: top 5", elem_id="label-b")
        with gr.Row():
            map_a = gr.Image(label="left: attention rollout", interactive=False)
            map_b = gr.Image(label="right: attention rollout", interactive=False)
        with gr.Row():
            cmap = gr.Dropdown(CMAPS, value=DEFAULT_CMAP, label="colour map")
            mode = gr.Radio(["bilinear", "nearest"], value="bilinear", label="upsampling",
                            info="nearest shows each token's cell honestly")
            style = gr.Radio(["heatmap", "mask"], value="heatmap", label="style", info="mask: the ViT paper's")
            shared = gr.Checkbox(label="one colour scale for both (multiples of uniform attention)")
        with gr.Row():
            grid_a = gr.Gallery(label="left: tokens", columns=3, height="auto")
            grid_b = gr.Gallery(label="right: tokens", columns=3, height="auto")
        with gr.Tabs():
            with gr.Tab("Layers and heads"):
                direction = gr.Radio([("where the token looks (its row)", "row"),
                                      ("who looks at the token (its column)", "column")], value="row",
                                     label="attention of the chosen token (click the input image; default: class token)")
                with gr.Row():
                    layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer", elem_id="layer-a")
                    head_a = gr.Slider(0, 12, value=0, step=1, label="left: head (0 = mean)")
                    layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer")
                    head_b = gr.Slider(0, 12, value=0, step=1, label="right: head (0 = mean)")
                with gr.Row():
                    attn_a = gr.Image(label="left: attention", interactive=False, elem_id="attn-a")
                    attn_b = gr.Image(label="right: attention", interactive=False, elem_id="attn-b")
            with gr.Tab("Gradients"):
                method = gr.Radio([("gradient rollout", "grad-rollout"), ("Chefer relevance", "chefer")],
                                  value="grad-rollout", label="method")
                with gr.Row():
                    target_a = gr.Dropdown(label="left: explain class", choices=[])
                    target_b = gr.Dropdown(label="right: explain class", choices=[])
                grad_run = gr.Button("Compute")
                with gr.Row():
                    grad_a = gr.Image(label="left", interactive=False)
                    grad_b = gr.Image(label="right", interactive=False)
            with gr.Tab("Stages") as stages_tab:
                with gr.Row():
                    stages_a = gr.Gallery(label="left: features per stage", columns=2, height="auto")
                    stages_b = gr.Gallery(label="right: features per stage", columns=2, height="auto")
            with gr.Tab("Anatomy") as anatomy_tab:
                with gr.Row():
                    filters_a = gr.Image(label="left: embedding filters (principal components)", interactive=False)
                    filters_b = gr.Image(label="right: embedding filters (principal components)", interactive=False)
                with gr.Row():
                    pos_a = gr.Image(label="left: position-embedding similarity", interactive=False)
                    pos_b = gr.Image(label="right: position-embedding similarity", interactive=False)
                distance = gr.Image(label="mean attention distance per head", interactive=False)
            with gr.Tab("Faithfulness"):
                with gr.Row():
                    faith_method = gr.Radio([(v, k) for k, v in METHODS.items()], value="rollout", label="map")
                    steps = gr.Slider(4, 32, value=16, step=1, label="steps")
                faith_run = gr.Button("Compute curves")
                with gr.Row():
                    faith_a = gr.Image(label="left", interactive=False)
                    faith_b = gr.Image(label="right", interactive=False)
            with gr.Tab("Token norms"):
                with gr.Row():
                    norm_layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer")
                    norm_layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer")
                norms_run = gr.Button("Show")
                with gr.Row():
                    norms_a = gr.Image(label="left: token norms", interactive=False)
                    norms_b = gr.Image(label="right: token norms", interactive=False)
            with gr.Tab("Download"):
                export_methods = gr.CheckboxGroup([(v, k) for k, v in METHODS.items()], value=["rollout"],
                                                  label="maps to include")
                export_run = gr.Button("Build the zip")
                export_file = gr.File(label="results (PNG panels, .npy maps, manifest.json)")

        # every event that draws returns its views as files of its own (see as_files)
        draw = {fn.__name__: as_files(fn) for fn in (explain, render_maps, render_layers, pick_point, render_gradients,
                                                      render_stages, render_anatomy, render_faithfulness, render_norms)}
        run.click(draw["explain"], inputs=[image, model_a, model_b],
                  outputs=[key, label_a, label_b, map_a, map_b, grid_a, grid_b, compare, layer_a, head_a, layer_b,
                           head_b, target_a, target_b, point, norm_layer_a, norm_layer_b],
                  api_name="explain", preprocess=False, **model_events).then(
            draw["render_layers"], inputs=[key, layer_a, head_a, layer_b, head_b, point, direction],
            outputs=[attn_a, attn_b], api_name="render_layers_after_explain", **instant)
        for name, control in {"cmap": cmap, "mode": mode, "style": style, "shared": shared}.items():
            control.change(draw["render_maps"], inputs=[key, cmap, mode, style, shared], outputs=[map_a, map_b, compare],
                           api_name=f"render_maps_on_{name}", **instant)
        layer_inputs = [key, layer_a, head_a, layer_b, head_b, point, direction]
        for name, control in {"layer_a": layer_a, "head_a": head_a, "layer_b": layer_b, "head_b": head_b}.items():
            control.release(draw["render_layers"], inputs=layer_inputs, outputs=[attn_a, attn_b],
                            api_name=f"render_layers_on_{name}", **instant)
        direction.change(draw["render_layers"], inputs=layer_inputs, outputs=[attn_a, attn_b],
                         api_name="render_layers_on_direction", **instant)
        image.select(draw["pick_point"], inputs=[key, layer_a, head_a, layer_b, head_b, direction],
                     outputs=[point, attn_a, attn_b, grid_a, grid_b], api_name="pick_point", **instant)
        grad_run.click(draw["render_gradients"], inputs=[key, method, target_a, target_b], outputs=[grad_a, grad_b],
                       api_name="render_gradients", **model_events)
        stages_tab.select(draw["render_stages"], inputs=[key], outputs=[stages_a, stages_b], api_name="render_stages",
                          **instant)
        anatomy_tab.select(draw["render_anatomy"], inputs=[key], outputs=[filters_a, filters_b, pos_a, pos_b, distance],
                           api_name="render_anatomy", **instant)
        faith_run.click(draw["render_faithfulness"], inputs=[key, faith_method, steps], outputs=[faith_a, faith_b],
                        api_name="render_faithfulness", **model_events)
        norms_run.click(draw["render_norms"], inputs=[key, norm_layer_a, norm_layer_b], outputs=[norms_a, norms_b],
                        api_name="render_norms", **instant)
        export_run.click(download, inputs=[key, export_methods], outputs=[export_file], api_name="download",
                         **model_events)
        gr.api(stats, api_name="stats", concurrency_limit=None)
    return demo


def cache_folder() -> Path:
    """A new folder of this request's own in Gradio's cache folder, which serves what is in it."""
    folder = Path(get_upload_folder()) / f"vitviz-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    return folder


def as_files(fn):
    """`fn` with the views it draws (arrays, alone or in a gallery's list) returned as JPEG files of their
    own in Gradio's cache folder, which the sweeper deletes after FILE_TTL. Left to Gradio, an array is
    encoded as WebP (many times slower than JPEG) into a file named by its content and rewritten in
    place: two people given the same picture at once share that file, and one request rewrites it while
    the other's browser reads it."""
    @functools.wraps(fn)   # Gradio reads the signature for gr.Progress and gr.SelectData
    def with_files(*args, **kwargs):
        folder = functools.cache(cache_folder)   # made on the first view only
        numbers = itertools.count()

        def saved(value):
            if isinstance(value, np.ndarray):
                path = folder() / f"view-{next(numbers)}.jpg"
                Image.fromarray(value).save(path, quality=VIEW_QUALITY)
                return str(path)
            return [saved(v) for v in value] if isinstance(value, list) else value

        outputs = fn(*args, **kwargs)
        return tuple(saved(v) for v in outputs) if isinstance(outputs, tuple) else saved(outputs)
    return with_files


def sweep_files(demo: gr.Blocks, *, age: float) -> None:
    """Every age/4 s, delete the files this app put in Gradio's cache folder (uploads, drawn views, zips)
    once they are `age` s old; the example photos stay. Gradio's own `delete_cache` does the same, but its
    sweeper stops for good the first time a request adds a file while it sweeps ('Set changed size during
    iteration', Gradio 6.31); this one sweeps copies of the file lists."""
    def sweep_forever():
        while True:
            time.sleep(age / 4)
            keep = set().union(*(getattr(block, "keep_in_cache", set()) for block in demo.blocks.values()))
            for files in demo.temp_file_sets:   # Gradio's record of what this app wrote
                for path in files.copy() - keep:
                    try:
                        if time.time() - os.lstat(path).st_ctime < age:
                            continue
                        os.remove(path)
                    except FileNotFoundError:
                        pass
                    except OSError:   # not ours to delete after all: try again next time
                        continue
                    files.discard(path)
                    with contextlib.suppress(OSError):   # the folder Gradio made for it, unless another file is there
                        os.rmdir(os.path.dirname(path))

    threading.Thread(target=sweep_forever, daemon=True, name="vitviz-sweep-files").start()


def fewer_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread its own heap (up to 8 per core) and never reuses memory freed in one for
    another: with Gradio's worker threads loading, evicting and reloading models, the server's RSS kept
    growing (by ~200 MB over 300 requests). Two heaps keep it flat, as MALLOC_ARENA_MAX=2 does, which
    wins if set. Without glibc (macOS, Windows, musl) this does nothing."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)   # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vit", help="left model (catalog name, Hub id, or a local folder you allow)")
    p.add_argument("--cvt", help="right model")
    args = p.parse_args(argv)
    for side in ("vit", "cvt"):
        if getattr(args, side):
            DEFAULTS[side] = getattr(args, side)
            LOCAL_ALLOWED.add(getattr(args, side))
    fewer_malloc_arenas()
    demo = build()
    sweep_files(demo, age=FILE_TTL)
    demo.queue(default_concurrency_limit=MODEL_GATE.slots, max_size=256)
    demo.launch(max_file_size=MAX_UPLOAD_BYTES, show_error=True)


if __name__ == "__main__":
    main()
