"""The page: the input image, the two model boxes, the one-click pairs, Explain, and the first screen
that answers (both models' predictions, their rollout maps, Grad-CAM for a CNN, and what the two agree
on), with the tabs under it, grouped by the question each answers."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import gradio as gr

from .. import catalog, hub, training
from ..agreement import agreement
from ..explain import METHODS
from ..gate import MODEL_GATE
from ..preprocess import PROMPT_TEMPLATE
from ..render import DEFAULT_CMAP, per_uniform, shared_scale
from ..views import map_view
from . import (
    anatomy,
    attention,
    circuits,
    classes,
    compare as compare_tab,  # build() names its comparison line `compare`
    concepts,
    decide,
    download,
    features,
    gpu,
    linked,
    tokens,
    training as training_tab,
    video,
)
from .shared import DEFAULT_PROMPTS, HIDDEN, INSTANT, MODEL_EVENTS, SESSIONS, Page, as_files, prompts_of, runs, session
from .store import Session

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(str(p) for p in (ROOT / "assets").glob("*.jpg"))
CMAPS = ["viridis", "inferno", "turbo", "magma"]
# where a one-click pair opens (default: attention)
PAIR_TABS = {"DINOv2 vs DINOv2 with registers": ("tokens", "registers")}
PAIRS_AWAY = "Greyed pairs need the Hugging Face Hub."   # which cannot be reached, and their models are not cached
# the page's own rules over Gradio's: an image's label and buttons (fullscreen, download, share) in a row above the
# picture, not over its top (a colour bar's largest value, a chart's top line), at any width; a failed event said
# once, in its message, the panels keeping what they showed instead of each saying "Error"; the Concepts tab's
# tables compact, whole words in their cells, their numbers right-aligned, scrolling sideways on a phone
STYLE = """
.block:has(> .image-container) { display: flex; flex-flow: column nowrap; }
.block:has(> .image-container) > label[data-testid="block-label"] {
    position: static; align-self: flex-start; max-width: calc(100% - 5.5rem); }
.block:has(> .image-container) > .image-container { position: static; flex: 1 1 auto; min-height: 0; height: auto; }
.block:has(> .image-container):not(:has(> label[data-testid="block-label"]:not(.hide))) > .image-container {
    padding-top: 1.75rem; }
.image-container:fullscreen { position: relative; }
[data-testid="status-tracker"]:has(> .error) { display: none; }
.concept-table [data-testid="markdown"] { overflow-x: auto; }
.concept-table table { word-break: normal; }
.concept-table :is(th, td) { padding: 0.15rem 0.5rem; white-space: nowrap; }
.concept-table td:last-child { white-space: normal; min-width: 9rem; }
.concept-table [align="right"] { text-align: right; }
"""
# after an answer: the comparison line brought into view where it is out of it (on a phone it lies below the pairs
# and the example photos); where it is in view nothing moves
SHOW_ANSWER = """() => {
    const answer = document.querySelector('#comparison');
    const box = answer.getBoundingClientRect();
    if (box.top < 0 || box.bottom > window.innerHeight) answer.scrollIntoView({behavior: 'smooth', block: 'start'});
}"""


class Answer(NamedTuple):
    """What an Explain shows on the first screen, in the order of its outputs (the session key is a State)."""
    key: str
    label_a: dict | str
    label_b: dict | str
    map_a: object
    map_b: object
    comparison: str
    point: tuple[float, float] | None = None   # the clicked token: none yet on a new image


def upload_path(payload) -> str:
    """The uploaded file's path (the event skips Gradio's own decoding, so vitviz checks the file first)."""
    if payload is None:
        raise gr.Error("Upload an image first, or click one of the examples.")
    return payload["path"] if isinstance(payload, dict) else str(payload)


def predictions(run) -> dict[str, float] | str:
    """The predictions panel: the top 5 (a CLIP model: its zero-shot probabilities over the prompts), or, for a
    model without a classifier, a line that says so."""
    if run.loaded.takes_prompts and not run.has_classifier:
        return f"{run.name}: type what to look for (comma separated) to get predictions"
    if not run.has_classifier:
        return f"{run.name}: no classifier, so no predictions"
    return {p.label: p.prob for p in run.top(5)}


def prompt_box(model_a, model_b) -> gr.Textbox:
    """The prompt box, shown while a catalog CLIP model is chosen (a CLIP model by Hub id shows it once
    explained)."""
    return gr.Textbox(visible=any(takes_prompts(name) for name in (model_a, model_b)))


def takes_prompts(name) -> bool:
    entry = catalog.CATALOG.get((name or "").strip())
    return bool(entry and entry.takes_prompts)


def comparison(runs_, maps) -> str:
    a, b = runs_
    rho = agreement(a.canvas, b.canvas, *maps)
    headless = [run.name for run in runs_ if not run.has_classifier]
    if headless:
        verdict = (f"{' and '.join(headless)} {'has' if len(headless) == 1 else 'have'} no classifier "
                   f"(self-supervised), so there are no classes to compare; the tabs *Attention*, *Features* and "
                   f"*Tokens* show what needs no class.")
    elif a.top(1)[0].label == b.top(1)[0].label:
        verdict = f"Both predict **{a.top(1)[0].label}**."
    else:
        verdict = f"They disagree: {a.name} says **{a.top(1)[0].label}**, {b.name} says **{b.top(1)[0].label}**."
    titles = sorted({METHODS[run.overview_method].title for run in runs_})
    what = f"{' and '.join(titles)} maps"
    agree = (f"Their {what} cannot be compared on this image." if rho is None else
             f"Their {what} agree with a rank correlation of **{rho:.2f}** "
             f"(Spearman, over the image region both models saw; 1 = same ordering, 0 = unrelated).")
    return f"{verdict} {agree}"


def render_maps(key, cmap=DEFAULT_CMAP, mode="bilinear", style="heatmap", shared=False) -> tuple:
    """The first screen's panels, each model's `overview_method` (rollout; Grad-CAM for a model without
    attention), with the colour map, upsampling, style, one colour scale or two, and the comparison line."""
    kept = session(key)
    kept.fill_maps([[(run.overview_method, {})] for run in kept.runs])   # Grad-CAM: one GPU call, then kept
    runs_ = kept.runs
    maps = [run.token_map(run.overview_method) for run in runs_]
    values = [per_uniform(m) for m in maps] if shared else maps
    scale = shared_scale(*values) if shared else None
    views = [map_view(run, run.overview_method, values=v, scale=scale, cmap=cmap, mode=mode, style=style)
             for run, v in zip(runs_, values)]
    return (*views, comparison(runs_, maps))


def explain(image, model_a, model_b, prompts=DEFAULT_PROMPTS, progress=gr.Progress()) -> Answer:
    """The one-click run: both models once on the image (`gpu.trace`; a CLIP model over the prompts typed,
    comma separated); the predictions, the rollout maps and the comparison. The tabs draw from the kept
    session afterwards."""
    prompts = prompts_of(prompts)
    picture, traced = gpu.trace(upload_path(image), [model_a, model_b], prompts, progress=progress)
    key = SESSIONS.put(Session.from_traced(picture, traced, [model_a, model_b], prompts))
    progress(0.9, desc="drawing")
    map_a, map_b, compare = render_maps(key)
    a, b = runs(key)
    return Answer(key, predictions(a), predictions(b), map_a, map_b, compare)


def training_point(model_a, model_b) -> tuple[bool, float, str]:
    """(whether a chosen model keeps its training run, the point of training the boxes name (1, the end, where they
    name the models as shipped), the line saying where each model is)."""
    names = (model_a, model_b)
    kept = any(training.bundled_run(name) is not None for name in names)
    at = next((f for f in map(training.fraction_of, names) if f is not None), 1.0)
    return kept, round(at, 3), "; ".join(map(training.where_words, names)) if kept else ""


def training_controls(model_a, model_b) -> gr.Slider:
    """The training slider with its line, shown while a chosen model keeps its training run (`training_point`)."""
    kept, at, words = training_point(model_a, model_b)
    return gr.Slider(value=at, info=words, visible=kept)


def move_training(model_a, model_b, fraction) -> tuple:
    """Both model boxes at the checkpoint nearest `fraction` of their training (0: the initialisation, 1: the end
    of the kept run; a model that keeps none stays as it is)."""
    if not 0 <= float(fraction) <= 1:
        raise gr.Error(f"The training slider goes from 0 (initialisation) to 1 (end of training), not {fraction}.")
    return training.at_fraction(model_a, fraction), training.at_fraction(model_b, fraction)


def choose_pair(title: str):
    """A one-click pair of `catalog.PAIRS`: both model boxes, and the tab that shows what the pair is for."""
    outer, inner = PAIR_TABS.get(title, ("attention", None))
    return (*catalog.PAIRS[title], gr.Tabs(selected=outer)) + ((gr.Tabs(selected=inner),) if inner else (gr.skip(),))


def pairs_at_hand() -> set[str]:
    """The one-click pairs whose two models can be had now: bundled, cached, or on a Hub that answers for them (one
    metadata request a model, all at once, so a Hub that cannot be reached costs one `hub.HUB_TIMEOUT`)."""
    names = sorted({name for pair in catalog.PAIRS.values() for name in pair})
    with ThreadPoolExecutor(len(names)) as pool:
        found = dict(zip(names, pool.map(hub.available, names)))
    return {title for title, pair in catalog.PAIRS.items() if all(found[name] for name in pair)}


def stats() -> dict:
    """The server's load, for its owner and the reliability tests: model passes (running now, most ever at
    once, total), kept sessions and loaded models against their bounds."""
    return {"model_slots": MODEL_GATE.slots, "model_running": MODEL_GATE.running, "model_peak": MODEL_GATE.peak,
            "model_passes": MODEL_GATE.passes, "sessions": len(SESSIONS), "sessions_max": SESSIONS.capacity,
            "models_loaded": len(hub.CACHE.names()), "models_max": hub.CACHE.max_models}


INTRO = ("## vitviz: see inside vision transformers\n"
         "Upload a photo (or click an example), pick two models, press **Explain**: what each predicts and where its "
         "attention flows (rollout; a CNN: Grad-CAM); hatched: what a model never saw. The tabs go deeper.")


def build(vit: str, cvt: str, notice: str = "", at_hand: set[str] | None = None) -> gr.Blocks:
    """The page, opening with the models `vit` and `cvt` (and `notice` above them when not empty); the one-click
    pairs not `at_hand` (`pairs_at_hand`'s; None: all of them) greyed, the notice saying why. Served with `STYLE`."""
    choices = list(catalog.CATALOG)
    at_hand = set(catalog.PAIRS) if at_hand is None else at_hand
    with gr.Blocks(title="vitviz: see inside vision transformers", analytics_enabled=False) as demo:
        gr.Markdown(INTRO, elem_id="intro")
        notice = " ".join(words for words in (notice, PAIRS_AWAY if set(catalog.PAIRS) - at_hand else "") if words)
        gr.Markdown(notice, visible=bool(notice), elem_id="notice")
        key, point = gr.State(None), gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=240):
                image = gr.Image(label="image (click it to pick a token)", type="filepath", height=230,
                                 sources=["upload", "clipboard", "webcam"], elem_id="input-image")
                # under the photo, where the column beside the model boxes leaves room: the first screen still fits
                kept, at, words = training_point(vit, cvt)
                training_at = gr.Slider(0, 1, value=at, step=0.01, label="training (0: initialisation, 1: end)",
                                        info=words, visible=kept, elem_id="training-slider")
            with gr.Column(scale=5, min_width=300):
                with gr.Row():
                    model_a = gr.Dropdown(choices, value=vit, allow_custom_value=True, label="left model",
                                          info="a catalog name or a Hub id (owner/name)", scale=2)
                    model_b = gr.Dropdown(choices, value=cvt, allow_custom_value=True, label="right model",
                                          info="the same: the two are compared", scale=2)
                    run = gr.Button("Explain", variant="primary", elem_id="explain", scale=1)
                prompts = gr.Textbox(DEFAULT_PROMPTS, label="what to look for, comma separated (CLIP models)",
                                     info=f"each becomes a prompt \"{PROMPT_TEMPLATE.format('...')}\"; the "
                                     "predictions are the zero-shot probabilities over them",
                                     visible=takes_prompts(vit) or takes_prompts(cvt), elem_id="prompts")
                with gr.Row():
                    pairs = {title: gr.Button(title, size="sm", interactive=title in at_hand, elem_id=f"pair-{i}")
                             for i, title in enumerate(catalog.PAIRS)}
                gr.Examples(EXAMPLES, inputs=[image], label="example photos (licences in assets/README.md)",
                            examples_per_page=12)
                with gr.Accordion("colours of the rollout maps", open=False):
                    with gr.Row():
                        cmap = gr.Dropdown(CMAPS, value=DEFAULT_CMAP, label="colour map")
                        mode = gr.Radio(["bilinear", "nearest"], value="bilinear", label="upsampling",
                                        info="nearest shows each token's cell honestly")
                        style = gr.Radio(["heatmap", "mask"], value="heatmap", label="style",
                                         info="mask: the ViT paper's")
                        shared = gr.Checkbox(label="one colour scale for both (multiples of uniform attention)")
        compare = gr.Markdown(elem_id="comparison")
        with gr.Row(equal_height=False):
            label_a = gr.Label(num_top_classes=5, label="left: top 5", elem_id="label-a", min_width=200, scale=2)
            map_a = gr.Image(label="left: attention rollout (a CNN: Grad-CAM)", interactive=False, height=240,
                             elem_id="map-a", min_width=200, scale=3)
            map_b = gr.Image(label="right: attention rollout (a CNN: Grad-CAM)", interactive=False, height=240,
                             elem_id="map-b", min_width=200, scale=3)
            label_b = gr.Label(num_top_classes=5, label="right: top 5", elem_id="label-b", min_width=200, scale=2)
        with gr.Tabs(selected="attention", elem_id="tabs") as tabs:
            page = Page(key=key, point=point, image=image, model_a=model_a, model_b=model_b, tabs=tabs)
            token_parts = tokens.layout(page)
            attention_parts = attention.layout(page)
            class_parts = classes.layout(page)
            features.layout(page)
            anatomy_parts = anatomy.layout(page)
            compare_parts = compare_tab.layout(page)
            decide_parts = decide.layout(page)
            concepts_parts = concepts.layout(page)
            circuits_parts = circuits.layout(page)
            training_parts = training_tab.layout(page)
            video_parts = video.layout(page, prompts)
            download.layout(page)

        answer = [key, label_a, label_b, map_a, map_b, compare, point]
        maps_inputs = [key, cmap, mode, style, shared]

        def explained(event, public: bool = False) -> None:
            """What follows an Explain: each tab draws what it shows without a click, so it is ready when opened
            (the first Explain event documents the endpoints; the pairs' copies stay unlisted)."""
            for tab in (token_parts, attention_parts, class_parts, anatomy_parts, compare_parts, decide_parts,
                        concepts_parts, circuits_parts, training_parts):
                tab.explained(event, public)

        answered = run.click(as_files(explain), inputs=[image, model_a, model_b, prompts], outputs=answer,
                             api_name="explain", preprocess=False, **MODEL_EVENTS)
        explained(answered, public=True)
        answered.success(None, js=SHOW_ANSWER, api_name="show_answer")
        for title, button in pairs.items():
            name = "_".join(catalog.PAIRS[title]).replace("-", "_")
            chosen = button.click(functools.partial(choose_pair, title),
                                  outputs=[model_a, model_b, tabs, token_parts.tabs], api_name=f"choose_{name}",
                                  **INSTANT, **HIDDEN)
            answered = chosen.success(as_files(explain), inputs=[image, model_a, model_b, prompts], outputs=answer,
                                      api_name=f"explain_{name}", preprocess=False, **MODEL_EVENTS, **HIDDEN)
            explained(answered)
            answered.success(None, js=SHOW_ANSWER, api_name=f"show_answer_{name}")
        explained(video_parts.chosen.success(as_files(explain), inputs=[image, model_a, model_b, prompts],
                                             outputs=answer, api_name="explain_frame", preprocess=False,
                                             **MODEL_EVENTS, **HIDDEN))
        for i, control in enumerate((cmap, mode, style, shared)):
            control.change(as_files(render_maps), inputs=maps_inputs, outputs=[map_a, map_b, compare],
                           api_name="render_maps" if i == 0 else f"render_maps_{i}", **INSTANT,
                           **({} if i == 0 else HIDDEN))
        image.select(attention.pick_point, inputs=None, outputs=[point], api_name="pick_point", **INSTANT).then(
            *attention_parts.on_point, **INSTANT, **HIDDEN).then(*token_parts.on_point, **INSTANT, **HIDDEN).then(
            *concepts_parts.on_point, **INSTANT, **HIDDEN).then(
            *circuits_parts.on_point, api_name=None, **MODEL_EVENTS, **HIDDEN)   # the circuit of the place clicked
        moved = training_at.release(move_training, inputs=[model_a, model_b, training_at], outputs=[model_a, model_b],
                                    api_name="move_training", **INSTANT)
        explained(moved.success(as_files(explain), inputs=[image, model_a, model_b, prompts], outputs=answer,
                                api_name="explain_training", preprocess=False, **MODEL_EVENTS, **HIDDEN))
        for listen in (model_a.change, model_b.change):
            listen(prompt_box, inputs=[model_a, model_b], outputs=[prompts], **INSTANT, **HIDDEN)
            listen(training_controls, inputs=[model_a, model_b], outputs=[training_at], **INSTANT,
                   **HIDDEN)
        demo.load(linked.opened, inputs=[model_a, model_b], outputs=[model_a, model_b, tabs, *concepts_parts.linked],
                  api_name=None, **INSTANT, **HIDDEN)   # `?dictionary=...&concept=...`: a link opening it on a concept
        gr.api(stats, api_name="stats", concurrency_limit=None)
    return demo

