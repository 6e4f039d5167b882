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

# On a ZeroGPU Space `spaces` must be imported before torch meets CUDA: it swaps torch's CUDA for an
# emulation in this process and runs each @spaces.GPU event in a worker that holds a real GPU. gradio
# (its helpers) and vitviz import torch, so it comes first. Where it is not installed, nothing changes.
try:
    import spaces
except ImportError:
    spaces = None

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402

from vitviz import catalog, hub  # noqa: E402
from vitviz.export import image_files, manifest, safe_name, write_atomic, write_manifest, zip_folder  # noqa: E402
from vitviz.image import MAX_UPLOAD_BYTES, ImageError, read_image  # noqa: E402
from vitviz.explain import DEFAULT_MASS, FAMILIES, METHODS, mean_attention_distance  # noqa: E402
from vitviz.session import MODEL_GATE, RunStore, agreement, decode_side, explain_image  # noqa: E402
from vitviz.render import DEFAULT_CMAP, per_uniform, shared_scale, attention_distance_plot, faithfulness_plot  # noqa: E402
from vitviz.render import filter_tiles, embedding_filters, position_tiles  # noqa: E402
from vitviz.evaluate import leaderboard  # noqa: E402

ROOT = Path(__file__).resolve().parent
EXAMPLES = sorted(str(p) for p in (ROOT / "assets").glob("*.jpg"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS = RunStore(int(os.environ.get("VITVIZ_SESSIONS", "16")))
# seconds an upload, a drawn view or a zip stays in Gradio's cache folder before it is deleted
FILE_TTL = int(os.environ.get("VITVIZ_FILE_TTL", "3600"))
VIEW_QUALITY = 90   # JPEG quality of the drawn views the page shows
# a gallery showing every item whole: Gradio's height "auto" caps a gallery at 55 % of the window and scrolls the
# rest out of sight, and its default fit crops each item to a square
WHOLE = dict(height="fit-content", object_fit="contain")
CMAPS = ["viridis", "inferno", "turbo", "magma"]
DEFAULTS: dict[str, str] = {}   # filled by main(): the pair the page opens with
LOCAL_ALLOWED: set[str] = set()  # local folders the server owner named on the command line
STARTING: set[str] = set()       # the page's default models while the server is still loading them
ZERO_GPU = spaces is not None and spaces.config.Config.zero_gpu   # a ZeroGPU Space (SPACES_ZERO_GPU=true)
# Seconds each GPU event may hold a ZeroGPU GPU (ZeroGPU's default: 60). A visitor is scheduled only with
# that much of their daily quota left and shorter bounds queue first; the time used is what is charged.
# The GPU work is a few passes of the two models (faithfulness: 4 x (steps + 1) forwards); the rest is
# drawing on the CPU, a worker's start (it moves the models to its GPU) and, for an Explain, loading a
# model that is not in memory, perhaps from the Hub.
EXPLAIN_S, EXPLAIN_LOADING_S, GRADIENTS_S, FAITHFULNESS_S, DOWNLOAD_S = 15, 60, 15, 30, 60


def gpu(*, duration):
    """`spaces.GPU(duration=...)`: on ZeroGPU the event runs in a worker holding a GPU for at most `duration`
    seconds (a number, or a function of the event's arguments); elsewhere the event is returned as it is."""
    return spaces.GPU(duration=duration) if spaces is not None else lambda fn: fn


def explain_seconds(image, model_a, model_b, progress=None) -> int:
    """An Explain's GPU time: two traced forwards, and loading (perhaps downloading) a model not in memory."""
    in_memory = set(hub.CACHE.names())
    return EXPLAIN_S if {model_a, model_b} <= in_memory else EXPLAIN_LOADING_S


def load_model(name: str, progress=None):
    """A model the page asked for: catalog names and Hub ids; local folders only if the owner named them.
    One the server is still loading since it started is waited for, never loaded a second time."""
    name = (name or "").strip()
    if not name:
        raise gr.Error("Choose a model for both columns.")
    if progress is not None and name in STARTING:
        progress(0.0, f"waiting for {name}, which the server has been loading since it started")
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


def predictions(run) -> dict[str, float] | str:
    """The predictions panel: the top 5, or, for a model without a classifier, a line that says so."""
    return top5(run) if run.has_classifier else f"{run.name}: no classifier, so no predictions"


def comparison(runs, maps) -> str:
    a, b = runs
    rho = agreement(a, b, *maps)
    headless = [run.name for run in runs if not run.has_classifier]
    if headless:
        verdict = (f"{' and '.join(headless)} {'has' if len(headless) == 1 else 'have'} no classifier (self-supervised), "
                   f"so there are no classes to compare; the tabs *Heads at a glance*, *Features* and *Registers and "
                   f"artefacts* show what needs no class.")
    elif a.top(1)[0].label == b.top(1)[0].label:
        verdict = f"Both predict **{a.top(1)[0].label}**."
    else:
        verdict = f"They disagree: {a.name} says **{a.top(1)[0].label}**, {b.name} says **{b.top(1)[0].label}**."
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


@gpu(duration=explain_seconds)
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
                           value=r.top(1)[0].index if r.has_classifier else None) for r in runs]
    (grid_a, words_a), (grid_b, words_b) = [pictures_and_words(run.grid_gallery()) for run in runs]
    return (key, predictions(runs[0]), predictions(runs[1]), a_map, b_map, grid_a, grid_b, compare, layer[0], heads[0],
            layer[1], heads[1], targets[0], targets[1], None, layer[0], layer[1], layer[0], layer[1], words_a, words_b)


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
    (grid_a, words_a), (grid_b, words_b) = [pictures_and_words(run.grid_gallery(point=run_point(run, point)))
                                            for run in runs]
    return (point, *render_layers(key, layer_a, head_a, layer_b, head_b, point, direction), grid_a, grid_b, words_a,
            words_b)


def method_guide() -> str:
    """What each map method computes, grouped by family (attention-based, gradient-based, relevance
    propagation), for the page."""
    lines = []
    for family, what in FAMILIES.items():
        lines.append(f"\n**{what.capitalize()}.**\n")
        lines += [f"- *{m.title}*: {m.summary}. {m.reference}."
                  + ("" if m.targeted else " The same map for every class: it is the map at the top of the page.")
                  for m in METHODS.values() if m.family == family]
    return "\n".join(lines)


@gpu(duration=GRADIENTS_S)
def render_gradients(key, method, target_a, target_b, point):
    """A map that explains a class chosen from each model's top 5 (a forward and a backward pass each); for
    a model without a classifier, the similarity to the output of the token clicked on the image."""
    runs = kept_runs(key)
    return tuple(run.map_view(method, target=None if t is None else int(t)) if run.has_classifier else
                 run.map_view(method, point=run_point(run, point)) for run, t in zip(runs, (target_a, target_b)))


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


@gpu(duration=FAITHFULNESS_S)
def render_faithfulness(key, method, steps):
    """Deletion and insertion curves of each model's map against a random order."""
    runs = kept_runs(key)
    plots = []
    for run in runs:
        if not run.has_classifier:   # the curves follow a class's probability; the tab's note says so in words
            plots.append(None)
            continue
        curves = run.faithfulness(method, steps=int(steps))
        plots.append(faithfulness_plot(
            fractions=curves["fractions"],
            deletion={METHODS[method].title: curves["deletion/map"]["scores"], "random": curves["deletion/random"]["scores"]},
            insertion={METHODS[method].title: curves["insertion/map"]["scores"], "random": curves["insertion/random"]["scores"]},
            target=f"{run.name}: {run.label(curves['target'])}"))
    return tuple(plots)


def render_leaderboard(model_a, model_b):
    """Each chosen model's faithfulness over a data set (`vitviz evaluate`), where it ships a summary;
    otherwise how to make one."""
    (text_a, plot_a), (text_b, plot_b) = leaderboard((model_a or "").strip()), leaderboard((model_b or "").strip())
    return (text_a if text_a == text_b else f"{text_a}\n{text_b}"), plot_a, plot_b


def render_norms(key, layer_a, layer_b):
    runs = kept_runs(key)
    return tuple(run.norm_view(block_index(run, layer)) for run, layer in zip(runs, (layer_a, layer_b)))


# ---- views that need no class, for every model (and all a self-supervised one has) ------------------------

PAIR_TABS = {"DINOv2 vs DINOv2 with registers": "registers"}   # where a one-click pair opens (default: heads)


def choose_pair(title: str):
    """A one-click pair of `catalog.PAIRS`: both model boxes, and the tab that shows what the pair is for."""
    return (*catalog.PAIRS[title], gr.Tabs(selected=PAIR_TABS.get(title, "heads")))


def pictures_and_words(items) -> tuple[list, str]:
    """(view, caption) pairs -> (the views for a gallery, their captions as page text, numbered in gallery order):
    a gallery shows a caption cut to its thumbnail's width, page text shows it whole."""
    if len(items) == 1:
        return [items[0][0]], items[0][1]
    return [view for view, _ in items], "\n".join(f"{k}. {caption}" for k, (_, caption) in enumerate(items, 1))


def classifier_notes(key) -> str:
    """Page text for the class-based tabs when a model has no classifier (what they show for it instead)."""
    return "\n\n".join(run.no_classifier for run in kept_runs(key) if not run.has_classifier)


def render_heads(key, layer_a, layer_b, token, point, threshold, fraction, style):
    """Every head of each model's chosen layer, for the class token or the clicked one; with `threshold`, the
    tokens holding `fraction` of each head's attention (DINO's display)."""
    runs = kept_runs(key)
    mass = float(fraction) if threshold else None
    (heads_a, what_a), (heads_b, what_b) = [
        run.head_views(layer=block_index(run, layer), point=run_point(run, point) if token == "point" else None,
                       fraction=mass, style=style) for run, layer in zip(runs, (layer_a, layer_b))]
    waiting = token == "point" and point is None
    note = f"Left: {what_a}.\n\nRight: {what_b}." + ("\n\nClick a point on the input image to choose the token; until "
                                                   "then the heads show the class token." if waiting else "")
    return heads_a, heads_b, note


def render_heads_at_point(key, layer_a, layer_b, token, point, threshold, fraction, style):
    """A click on the input image: the heads again if they show the clicked token (else nothing changes)."""
    if token != "point":
        return gr.skip(), gr.skip(), gr.skip()
    return render_heads(key, layer_a, layer_b, token, point, threshold, fraction, style)


def render_model_view(key, token, point, threshold, fraction, style):
    """Every layer x head of both models, one row of thumbnails per layer."""
    mass = float(fraction) if threshold else None
    return tuple(run.model_view(point=run_point(run, point) if token == "point" else None, fraction=mass, style=style)
                 for run in kept_runs(key))


def render_features(key):
    """The DINOv2 paper's picture of each model's last-layer patch features, and what each shows in words."""
    (view_a, words_a), (view_b, words_b) = [run.feature_pca_view() for run in kept_runs(key)]
    return view_a, view_b, f"Left: {words_a}.\n\nRight: {words_b}."


def render_registers(key):
    """The high-norm artefact tokens of each model's last layer, and its registers' own attention; the counts
    and what each view shows, in words."""
    galleries, notes = [], []
    for side, run in zip(("Left", "Right"), kept_runs(key)):
        views, registers, summary = run.artefact_views()
        (views, views_words), (registers, registers_words) = pictures_and_words(views), pictures_and_words(registers)
        galleries += [views, registers]
        notes.append(f"{side}: {summary}\n\n{views_words}" + (f"\n\nIts registers:\n\n{registers_words}"
                                                            if registers else ""))
    (views_a, registers_a), (views_b, registers_b) = galleries[:2], galleries[2:]
    return "\n\n".join(notes), views_a, views_b, registers_a, registers_b


def render_class_free(key, layer_a, layer_b, token, point, threshold, fraction, style):
    """After an Explain: the heads, the features' PCA and the artefact tokens, so each tab is ready when opened."""
    return (*render_heads(key, layer_a, layer_b, token, point, threshold, fraction, style), *render_features(key),
            *render_registers(key), classifier_notes(key), classifier_notes(key))


@gpu(duration=DOWNLOAD_S)
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


def load_at_start(names) -> threading.Thread | None:
    """Load the page's default models as the server starts, so the first Explain finds them in memory.
    In the background, so the page is served at once: an Explain that asks for one meanwhile waits for
    this load (`hub.load` runs one load of a model at a time) rather than starting its own. On ZeroGPU in
    this thread, before launch: its CUDA emulation sees only this thread's tensors, and what is on 'cuda'
    at launch is what it moves to the GPU of every worker."""
    STARTING.update(names)

    def load_all():
        for name in names:
            try:
                hub.load(name, device=DEVICE, allow_local=name in LOCAL_ALLOWED)
            except hub.LoadError:
                pass   # the first Explain that asks for it tries again and says why
            finally:
                STARTING.discard(name)

    if ZERO_GPU:
        load_all()
        return None
    loading = threading.Thread(target=load_all, daemon=True, name="vitviz-load-defaults")
    loading.start()
    return loading


def build(vit: str, cvt: str, notice: str) -> gr.Blocks:
    """The page, opening with the models `vit` and `cvt` (and `notice` above them when not empty)."""
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
                with gr.Row():
                    pairs = {title: gr.Button(title, size="sm", elem_id=f"pair-{i}")
                             for i, title in enumerate(catalog.PAIRS)}
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
            # each view as wide as the column (a CvT's three stages side by side were too small to read), and
            # what it shows as page text under it
            with gr.Column():
                grid_a = gr.Gallery(label="left: tokens", columns=1, **WHOLE,
                                    elem_id="grid-a")
                grid_words_a = gr.Markdown(elem_id="grid-words-a")
            with gr.Column():
                grid_b = gr.Gallery(label="right: tokens", columns=1, **WHOLE,
                                    elem_id="grid-b")
                grid_words_b = gr.Markdown(elem_id="grid-words-b")
        with gr.Tabs() as tabs:
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
            with gr.Tab("Heads at a glance", id="heads"):
                gr.Markdown("Every head of one layer at once, each on its own colour scale, the mean of the heads "
                            "first: where the token looks. Click a thumbnail to enlarge it. DINO's display keeps the "
                            "smallest set of tokens that holds a share of each head's attention (60 % in its paper).")
                with gr.Row():
                    heads_layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer", elem_id="heads-layer-a")
                    heads_layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer")
                    heads_token = gr.Radio([("the class token", "cls"), ("the token you click on the image", "point")],
                                           value="cls", label="where this token looks")
                with gr.Row():
                    heads_threshold = gr.Checkbox(label="keep the tokens holding a share of each head's attention")
                    heads_fraction = gr.Slider(0.05, 1.0, value=DEFAULT_MASS, step=0.05, label="share of the attention")
                    heads_style = gr.Radio(["outline", "mask"], value="outline", label="drawn as")
                heads_note = gr.Markdown(elem_id="heads-note")
                with gr.Row():
                    heads_a = gr.Gallery(label="left: every head", columns=3, **WHOLE,
                                         elem_id="heads-a")
                    heads_b = gr.Gallery(label="right: every head", columns=3, **WHOLE,
                                         elem_id="heads-b")
                with gr.Accordion("Every layer x head (the model view)", open=False):
                    model_view_run = gr.Button("Draw every layer x head")
                    with gr.Row():
                        every_a = gr.Gallery(label="left: one row per layer, head 1 on the left", columns=1,
                                             **WHOLE)
                        every_b = gr.Gallery(label="right: one row per layer, head 1 on the left", columns=1,
                                             **WHOLE)
            with gr.Tab("Explain a class"):
                method = gr.Radio([(f"{m.title} · {FAMILIES[m.family].partition(':')[0]}", m.name)
                                   for m in METHODS.values() if m.targeted],
                                  value="grad-rollout", label="method", elem_id="class-method")
                gr.Markdown(method_guide())
                class_note = gr.Markdown(elem_id="class-note")
                with gr.Row():
                    target_a = gr.Dropdown(label="left: explain class", choices=[])
                    target_b = gr.Dropdown(label="right: explain class", choices=[])
                grad_run = gr.Button("Compute", elem_id="class-compute")
                with gr.Row():
                    grad_a = gr.Image(label="left", interactive=False, elem_id="class-map-a")
                    grad_b = gr.Image(label="right", interactive=False, elem_id="class-map-b")
            with gr.Tab("Stages") as stages_tab:
                with gr.Row():
                    stages_a = gr.Gallery(label="left: features per stage", columns=2, height="auto")
                    stages_b = gr.Gallery(label="right: features per stage", columns=2, height="auto")
            with gr.Tab("Features", id="features"):
                gr.Markdown("The DINOv2 paper's picture of the last layer's patch features: a first PCA over the "
                            "image's patches splits foreground from background at the first component's mean (the "
                            "background is the side holding more of the border tokens); a second PCA over the "
                            "foreground patches gives their colours. Patches with similar features get similar colours, "
                            "so an object's parts show up as regions.")
                pca_note = gr.Markdown(elem_id="pca-note")
                with gr.Row():
                    pca_a = gr.Image(label="left: last-layer features", interactive=False, elem_id="pca-a")
                    pca_b = gr.Image(label="right: last-layer features", interactive=False, elem_id="pca-b")
            with gr.Tab("Anatomy") as anatomy_tab:
                with gr.Row():
                    filters_a = gr.Image(label="left: embedding filters (principal components)", interactive=False)
                    filters_b = gr.Image(label="right: embedding filters (principal components)", interactive=False)
                with gr.Row():
                    pos_a = gr.Image(label="left: position-embedding similarity", interactive=False)
                    pos_b = gr.Image(label="right: position-embedding similarity", interactive=False)
                distance = gr.Image(label="mean attention distance per head", interactive=False)
            with gr.Tab("Faithfulness") as faith_tab:
                with gr.Row():
                    faith_method = gr.Radio([(m.title, k) for k, m in METHODS.items()], value="rollout", label="map")
                    steps = gr.Slider(4, 32, value=16, step=1, label="steps")
                faith_run = gr.Button("Compute curves")
                faith_note = gr.Markdown(elem_id="faithfulness-note")
                with gr.Row():
                    faith_a = gr.Image(label="left", interactive=False)
                    faith_b = gr.Image(label="right", interactive=False)
                gr.Markdown("### Over a data set: which map can you trust?\nEvery method against a random map "
                            "(`python -m vitviz evaluate`), mean and 95 % interval; ↓ lower is better, ↑ higher.")
                board = gr.Markdown(elem_id="leaderboard")
                with gr.Row():
                    board_a = gr.Image(label="left: mean curves over the data set", interactive=False)
                    board_b = gr.Image(label="right: mean curves over the data set", interactive=False)
            with gr.Tab("Token norms"):
                with gr.Row():
                    norm_layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer")
                    norm_layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer")
                norms_run = gr.Button("Show")
                with gr.Row():
                    norms_a = gr.Image(label="left: token norms", interactive=False)
                    norms_b = gr.Image(label="right: token norms", interactive=False)
            with gr.Tab("Registers and artefacts", id="registers"):
                gr.Markdown("Large ViTs trained long (DINOv2 among them) turn a few background patches into scratch "
                            "space: their tokens leave the last layers with norms many times the rest and draw the "
                            "class token's attention (Darcet et al. 2023). Register tokens give the model that space "
                            "elsewhere: compare **DINOv2 vs DINOv2 with registers** (the button above).")
                registers_note = gr.Markdown(elem_id="registers-note")
                with gr.Row():
                    artefacts_a = gr.Gallery(label="left: token norms, and where the class token looks", columns=1,
                                             **WHOLE, elem_id="artefacts-a")
                    artefacts_b = gr.Gallery(label="right: token norms, and where the class token looks", columns=1,
                                             **WHOLE, elem_id="artefacts-b")
                with gr.Row():
                    registers_a = gr.Gallery(label="left: where each register looks", columns=2, **WHOLE,
                                             elem_id="registers-a")
                    registers_b = gr.Gallery(label="right: where each register looks", columns=2, **WHOLE,
                                             elem_id="registers-b")
            with gr.Tab("Download"):
                export_methods = gr.CheckboxGroup([(m.title, k) for k, m in METHODS.items()], value=["rollout"],
                                                  label="maps to include")
                export_run = gr.Button("Build the zip")
                export_file = gr.File(label="results (PNG panels, .npy maps, manifest.json)")

        # every event that draws returns its views as files of its own (see as_files)
        draw = {fn.__name__: as_files(fn) for fn in (explain, render_maps, render_layers, pick_point, render_gradients,
                                                      render_stages, render_anatomy, render_faithfulness, render_norms,
                                                      render_heads, render_heads_at_point, render_model_view,
                                                      render_class_free, render_leaderboard)}
        explain_outputs = [key, label_a, label_b, map_a, map_b, grid_a, grid_b, compare, layer_a, head_a, layer_b,
                           head_b, target_a, target_b, point, norm_layer_a, norm_layer_b, heads_layer_a, heads_layer_b,
                           grid_words_a, grid_words_b]
        heads_inputs = [key, heads_layer_a, heads_layer_b, heads_token, point, heads_threshold, heads_fraction,
                        heads_style]

        def explained(event, name: str) -> None:
            """What an Explain draws after its own outputs: the chosen layer's attention and the tabs of views
            that need no class, so they are ready when opened."""
            event.then(draw["render_layers"], inputs=[key, layer_a, head_a, layer_b, head_b, point, direction],
                       outputs=[attn_a, attn_b], api_name=f"render_layers_after_{name}", **instant)
            event.success(draw["render_class_free"], inputs=heads_inputs,
                          outputs=[heads_a, heads_b, heads_note, pca_a, pca_b, pca_note, registers_note, artefacts_a,
                                   artefacts_b, registers_a, registers_b, class_note, faith_note],
                          api_name=f"render_class_free_after_{name}", **instant)

        explained(run.click(draw["explain"], inputs=[image, model_a, model_b], outputs=explain_outputs,
                            api_name="explain", preprocess=False, **model_events), "explain")
        for title, button in pairs.items():
            name = "_".join(catalog.PAIRS[title]).replace("-", "_")
            chosen = button.click(functools.partial(choose_pair, title), outputs=[model_a, model_b, tabs],
                                  api_name=f"choose_{name}", **instant)
            explained(chosen.success(draw["explain"], inputs=[image, model_a, model_b], outputs=explain_outputs,
                                     api_name=f"explain_{name}", preprocess=False, **model_events), name)
        for name, control in {"layer_a": heads_layer_a, "layer_b": heads_layer_b, "fraction": heads_fraction}.items():
            control.release(draw["render_heads"], inputs=heads_inputs, outputs=[heads_a, heads_b, heads_note],
                            api_name=f"render_heads_on_{name}", **instant)
        for name, control in {"token": heads_token, "threshold": heads_threshold, "style": heads_style}.items():
            control.change(draw["render_heads"], inputs=heads_inputs, outputs=[heads_a, heads_b, heads_note],
                           api_name=f"render_heads_on_{name}", **instant)
        model_view_run.click(draw["render_model_view"], inputs=heads_inputs[:1] + heads_inputs[3:],
                             outputs=[every_a, every_b], api_name="render_model_view", **instant)
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
                     outputs=[point, attn_a, attn_b, grid_a, grid_b, grid_words_a, grid_words_b], api_name="pick_point",
                     **instant).then(
            draw["render_heads_at_point"], inputs=heads_inputs, outputs=[heads_a, heads_b, heads_note],
            api_name="render_heads_at_point", **instant)
        grad_run.click(draw["render_gradients"], inputs=[key, method, target_a, target_b, point],
                       outputs=[grad_a, grad_b], api_name="render_gradients", **model_events)
        stages_tab.select(draw["render_stages"], inputs=[key], outputs=[stages_a, stages_b], api_name="render_stages",
                          **instant)
        anatomy_tab.select(draw["render_anatomy"], inputs=[key], outputs=[filters_a, filters_b, pos_a, pos_b, distance],
                           api_name="render_anatomy", **instant)
        faith_run.click(draw["render_faithfulness"], inputs=[key, faith_method, steps], outputs=[faith_a, faith_b],
                        api_name="render_faithfulness", **model_events)
        for name, event in {"tab": faith_tab.select, "model_a": model_a.change, "model_b": model_b.change}.items():
            event(draw["render_leaderboard"], inputs=[model_a, model_b], outputs=[board, board_a, board_b],
                  api_name="render_leaderboard" if name == "tab" else f"render_leaderboard_on_{name}", **instant)
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
            if isinstance(value, list):   # a gallery: views, or (view, caption) pairs
                return [(saved(v[0]), v[1]) if isinstance(v, tuple) else saved(v) for v in value]
            return value

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
    vit, cvt, notice = default_pair()
    load_at_start((vit, cvt))
    demo = build(vit, cvt, notice)
    sweep_files(demo, age=FILE_TTL)
    demo.queue(default_concurrency_limit=MODEL_GATE.slots, max_size=256)
    demo.launch(max_file_size=MAX_UPLOAD_BYTES, show_error=True)


if __name__ == "__main__":
    main()
