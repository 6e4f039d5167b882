"""Compare: does CvT see like ViT, or a ViT like a CNN? When each model commits to its class (the logit lens, per
block and per token: `gpu.lens`, once per Explain, kept in the session), how alike the two models' layers are
(CKA: shipped for the bundled models, computed over a person's uploads by `gpu.cka`), how much of each block's
output is what its skip connection carries (the residual stream's share, from the kept traces), and how far
each layer looks (effective receptive fields, `gpu.receptive`, beside mean attention distance)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr
import numpy as np

from .. import explain, render
from ..compare import PUBLISHED, CKAResult, heatmaps, markdown, published
from ..render.compare import class_colours, lens_patches, lens_plot, reach_plot, receptive_view, residual_plot
from ..session import ModelRun
from . import gpu
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, Page, as_files, block_index, runs, session

TITLE = "Compare"
MIN_IMAGES, MAX_IMAGES = 8, 256    # CKA over a person's uploads: fewer than 8 says little; 256 fit one GPU call
TOKENS = {"mean": "the mean of its grid tokens", "cls": "its class token"}   # CKA's features per block

LENS_WORDS = ("**When each model commits.** After every block, the probability that block's class token gives the "
              "class the model finally predicts, read through the model's own final norm and classifier (the logit "
              "lens), over relative depth: where a curve rises is where the model makes up its mind.")
PATCH_WORDS = ("**Per token.** Each grid token of the chosen layer read through the final norm and classifier on "
               "its own, coloured by its top class (legend under each picture: tokens per class and their mean "
               "probability); the same class has the same colour on both sides.")
CKA_WORDS = ("**Layer similarity.** Debiased linear CKA (Kornblith et al. 2019, minibatch as Nguyen et al. 2021) "
             "between every block of one model and every block of the other, and of each with itself: 1 means the "
             "same representation up to a rotation and a scale, about 0 unrelated.")
RESIDUAL_WORDS = ("**The residual stream.** Per block, the norm of what the skip connection carries against the norm "
                  "of what the block adds, ||x_in|| / ||x_out - x_in||, for the class token (solid) and the mean over "
                  "grid tokens (dashed), over relative depth: above 1 (dotted) a block mostly passes its input on.")
REACH_WORDS = ("**How far each layer looks** (Raghu et al. 2021's comparison of ViTs and CNNs). For every block, how "
               "strongly each input pixel moves the output of the token nearest the image's centre (the effective "
               "receptive field, Luo et al. 2016: the gradient's magnitude), and the radius around that token "
               "holding 50 % (solid) and 90 % (dashed) of it, as a share of the input's side over relative depth; "
               "dotted, for models with attention, the mean attention distance of their heads. A CNN's field grows "
               "with depth; a ViT's first layers can already look far.")
WAITING = "Press **Explain** first: this panel reads both models on the image."


class LensViews(NamedTuple):
    layer_a: gr.Slider
    layer_b: gr.Slider
    curve: np.ndarray | None
    patches_a: np.ndarray | None
    patches_b: np.ndarray | None
    note: str


class Similarity(NamedTuple):
    note: str
    a_vs_b: np.ndarray | None
    a_vs_a: np.ndarray | None
    b_vs_b: np.ndarray | None
    table: str


@dataclass(frozen=True)
class Uploaded:
    """The last CKA computed over this browser's uploads (kept in a gr.State)."""
    models: tuple[str, str]
    tokens: str
    result: CKAResult


class Computed(NamedTuple):
    uploaded: Uploaded
    note: str
    a_vs_b: np.ndarray
    a_vs_a: np.ndarray
    b_vs_b: np.ndarray
    table: str


# ---- the logit lens ---------------------------------------------------------------------------------------

def lens_readings(key) -> list[gpu.Lens | None]:
    """Each run's logit lens (None for a model without a classifier): one `gpu.lens` call for the classifiers,
    the first time; kept in the session, so a slider never asks again."""
    kept = session(key)

    def compute():
        asked = [i for i, run in enumerate(kept.runs) if run.has_classifier]
        got = (gpu.lens([kept.names[i] for i in asked], [kept.runs[i].pixels for i in asked], kept.prompts)
               if asked else [])
        found = dict(zip(asked, got))
        return [found.get(i) for i in range(len(kept.runs))]
    return kept.reading("lens", compute)


def lens_block(run: ModelRun, layer) -> int:
    """A lens slider's 1-based layer -> the block index, checked to be one the lens reads."""
    layers = explain.lens_layers(run.trace)
    if int(layer) - 1 not in layers:
        where = " (its last stage: only its tokens have the classifier's width)" if layers[0] else ""
        raise gr.Error(f"{run.name}'s logit lens reads layers {layers[0] + 1} to {layers[-1] + 1}{where}: choose "
                       f"one of them, not {layer}.")
    return int(layer) - 1


def lens_slider(run: ModelRun) -> gr.Slider:
    """A slider over the layers the lens reads, on the last (locked for a model without a classifier, or one
    layer: Gradio has no slider over a single value)."""
    layers = explain.lens_layers(run.trace)
    first, last = layers[0] + 1, layers[-1] + 1
    return gr.Slider(minimum=first, maximum=max(last, first + 1), value=last, step=1,
                     interactive=run.has_classifier and last > first)


def lens_curve(runs_: list[ModelRun], readings) -> np.ndarray | None:
    """Each classifier's final-class probability after every lens block on one plot over relative depth."""
    curves = {f"{run.name}: p({run.top(1)[0].label})":
              (explain.relative_depth(run.trace, explain.lens_layers(run.trace)), reading.final_class)
              for run, reading in zip(runs_, readings) if reading is not None}
    if not curves:
        return None
    classes = {len(run.loaded.labels) for run in runs_ if run.has_classifier}
    return lens_plot(curves, chance=1 / classes.pop() if len(classes) == 1 else None)


def lens_views(runs_: list[ModelRun], readings, layers) -> list[np.ndarray | None]:
    """Each classifier's per-token lens at its chosen layer; models with the same classes share the colours."""
    rows = {}
    for i, (run, reading, layer) in enumerate(zip(runs_, readings, layers)):
        if reading is not None:
            block = lens_block(run, layer)
            rows[i] = (block, explain.lens_layers(run.trace).index(block))
    same_classes = len({runs_[i].loaded.labels for i in rows}) == 1
    shared = class_colours(*(readings[i].top_class[row] for i, (_, row) in rows.items())) if same_classes else None
    views = []
    for i, (run, reading) in enumerate(zip(runs_, readings)):
        if i not in rows:
            views.append(None)
            continue
        block, row = rows[i]
        stage = run.trace.blocks[block].stage
        colours = shared if shared is not None else class_colours(reading.top_class[row])
        view = lens_patches(run.canvas, reading.top_class[row], reading.top_prob[row], run.loaded.labels,
                            colours=colours, field=stage)
        note = f"stage {stage + 1}" if len(run.trace.embeddings) > 1 else None
        views.append(render.caption(view, model=run.name, method="logit lens: each token's top class",
                                    layer=block + 1, note=note))
    return views


def lens_note(runs_: list[ModelRun]) -> str:
    lines = []
    for run in runs_:
        first = explain.lens_layers(run.trace)[0]
        if not run.has_classifier:
            lines.append(f"{run.name} has no classifier (self-supervised), so it has no logit lens: the lens reads "
                         f"each block through the classifier.")
        elif first:
            lines.append(f"{run.name}'s lens starts at layer {first + 1} of {len(run.trace.blocks)}: only its last "
                         f"stage's blocks have the classifier's width and a class token.")
    return "\n\n".join(lines)


def render_lens(key) -> LensViews:
    """Both models' logit lens (a model pass the first time, through `gpu.lens`): the final-class curves over
    relative depth, both sliders on each model's last layer and each token's top class there."""
    if key is None:
        return LensViews(gr.skip(), gr.skip(), None, None, None, WAITING)
    runs_, readings = runs(key), lens_readings(key)
    last = [len(run.trace.blocks) for run in runs_]
    return LensViews(*(lens_slider(run) for run in runs_), lens_curve(runs_, readings),
                     *lens_views(runs_, readings, last), lens_note(runs_))


def render_lens_layer(key, layer_a, layer_b) -> tuple:
    """Each token's top class at the chosen layers, from the kept lens (never a model pass)."""
    kept = session(key)
    readings = kept.reading("lens")
    if readings is None:
        raise gr.Error("The logit lens of this Explain is not computed yet: open the Compare tab (or call "
                       "/render_lens) first.")
    return tuple(lens_views(kept.runs, readings, (layer_a, layer_b)))


# ---- the residual stream ----------------------------------------------------------------------------------

def render_residual(key) -> tuple:
    """Both models' residual share per block over relative depth (from the kept traces), and a note for a model
    whose class token starts late."""
    if key is None:
        return None, WAITING
    shares, lines = {}, []
    for run in runs(key):
        share = explain.residual_share(run.trace)
        cls, grid = share.cls[0].numpy(), share.grid[0].numpy()
        shares[run.name] = (explain.relative_depth(run.trace), cls, grid)
        if np.isnan(cls).all():
            lines.append(f"{run.name} has no class token: only its grid tokens are drawn.")
        elif np.isnan(cls).any():
            lines.append(f"{run.name} has a class token only from layer {int(np.isnan(cls).sum()) + 1}: its solid "
                         f"line starts there.")
    return residual_plot(shares), "\n\n".join(lines)


# ---- how far each layer looks --------------------------------------------------------------------------------

def receptive_fields(key) -> list[explain.ReceptiveField]:
    """Both runs' receptive fields on the image: one `gpu.receptive` call the first time, kept in the session."""
    kept = session(key)
    return kept.reading("receptive", lambda: gpu.receptive(kept.names, [run.pixels for run in kept.runs],
                                                           kept.prompts))


def reach_figure(runs_: list[ModelRun], fields) -> np.ndarray:
    """The radii of both models over relative depth, with the mean attention distance of those with attention."""
    reaches, distances = {}, {}
    for run, field in zip(runs_, fields):
        depth = explain.relative_depth(run.trace, field.blocks)
        reaches[run.name] = (depth, *(share.tolist() for share in field.share))
        if run.attends:
            side = min(run.trace.input_size)
            distances[run.name] = (explain.relative_depth(run.trace),
                                   [float(d[0].mean()) / side for d in explain.mean_attention_distance(run.trace)])
    return reach_plot(reaches, distances)


def reach_views(runs_: list[ModelRun], fields, layers) -> list[np.ndarray]:
    """Each model's receptive field of its chosen block over the photo, with its two radii."""
    views = []
    for run, field, layer in zip(runs_, fields, layers):
        block = block_index(run, layer)
        k = field.blocks.index(block)
        view = receptive_view(run.canvas, field.maps[k].numpy(), centre=tuple(field.centres[k].tolist()),
                                             r50=float(field.r50[k]), r90=float(field.r90[k]))
        views.append(render.caption(view, model=run.name, method="effective receptive field of the centre token",
                                    layer=block + 1, note=f"50 % within {float(field.r50[k]):.0f} px, 90 % within "
                                                          f"{float(field.r90[k]):.0f} px of the model's input"))
    return views


def render_reach(key) -> tuple:
    """Both models' radii over depth (a model pass the first time, through `gpu.receptive`), both sliders on each
    model's first layer and its receptive field there."""
    if key is None:
        return gr.skip(), gr.skip(), None, None, None, WAITING
    runs_, fields = runs(key), receptive_fields(key)
    sliders = [gr.Slider(minimum=1, maximum=max(len(run.trace.blocks), 2), value=1, step=1,
                         interactive=len(run.trace.blocks) > 1) for run in runs_]
    notes = [f"{run.name}: 90 % of the last block's field within {float(field.r90[-1]):.0f} px of "
             f"{min(run.trace.input_size)} px ({float(field.share[1][-1]):.0%} of the side)"
             for run, field in zip(runs_, fields)]
    return (*sliders, reach_figure(runs_, fields), *reach_views(runs_, fields, (1, 1)), "; ".join(notes) + ".")


def render_reach_layer(key, layer_a, layer_b) -> tuple:
    """Each model's receptive field at the chosen layers, from the kept fields (never a model pass)."""
    kept = session(key)
    fields = kept.reading("receptive")
    if fields is None:
        raise gr.Error("The receptive fields of this Explain are not computed yet: open their sub-tab (or call "
                       "/render_reach) first.")
    return tuple(reach_views(kept.runs, fields, (layer_a, layer_b)))


# ---- layer similarity (CKA) -------------------------------------------------------------------------------

def pair(model_a, model_b) -> tuple[str, str]:
    return (model_a or "").strip(), (model_b or "").strip()


def checked_tokens(tokens) -> str:
    if tokens not in TOKENS:
        raise gr.Error(f"Compare the blocks by {' or '.join(repr(t) for t in TOKENS)} tokens, not {tokens!r}.")
    return tokens


@functools.lru_cache(maxsize=4)
def shipped_views(names: tuple[str, str], tokens: str) -> Similarity | None:
    """The shipped result's heatmaps (drawn once per pair and tokens: they never change), or None."""
    result = published(names, tokens=tokens)
    if result is None:
        return None
    return similarity(result, names, tokens, f"over {result.images:,} CIFAR-10 test images (shipped with vitviz: "
                                             f"`python -m vitviz compare`)")


def similarity(result: CKAResult, names: tuple[str, str], tokens: str, source: str) -> Similarity:
    maps = heatmaps(result, names, tokens=tokens)
    note = (f"{names[0]} (rows) x {names[1]} (columns) on top, each model with itself below, {source}; each "
            f"block's features: {TOKENS[tokens]}. Colours clamp to [0, 1]; the values are kept.")
    return Similarity(note, maps["a_vs_b"], maps["a_vs_a"], maps["b_vs_b"], markdown(result, names))


def render_cka(model_a, model_b, tokens="mean", uploaded: Uploaded | None = None) -> Similarity:
    """The CKA heatmaps of the two models in the boxes: over this browser's uploads if computed for them and
    these tokens, else the shipped result of a pair of bundled models, else how to compute them."""
    names, tokens = pair(model_a, model_b), checked_tokens(tokens)
    if uploaded is not None and (uploaded.models, uploaded.tokens) == (names, tokens):
        return similarity(uploaded.result, names, tokens, f"over the {uploaded.result.images} images you uploaded")
    shipped = shipped_views(names, tokens)
    if shipped is not None:
        return shipped
    pairs = "; ".join(" and ".join(names) for names in PUBLISHED)
    return Similarity(f"vitviz ships CKA for pairs of its bundled models only ({pairs}): for "
                      f"{names[0]} and {names[1]}, upload {MIN_IMAGES} to {MAX_IMAGES} images below and press "
                      f"**Compute CKA**.", None, None, None, "")


def upload_paths(files) -> list[str]:
    """gr.File's uploads -> their paths, at least MIN_IMAGES and at most MAX_IMAGES, said plainly otherwise."""
    paths = [f if isinstance(f, str) else f["path"] for f in (files or [])]
    if len(paths) < MIN_IMAGES:
        raise gr.Error(f"CKA compares the layers over a set of images: upload at least {MIN_IMAGES} (you gave "
                       f"{len(paths)}). More give steadier values; up to {MAX_IMAGES}.")
    if len(paths) > MAX_IMAGES:
        raise gr.Error(f"Upload at most {MAX_IMAGES} images at once (you gave {len(paths)}).")
    return paths


def compute_cka(model_a, model_b, tokens, files, progress=gr.Progress()) -> Computed:
    """CKA between every layer of the two models over the uploaded images (both models over every image, through
    `gpu.cka`, with a progress bar); kept for this browser, so changing the tokens back draws it again."""
    names, tokens = pair(model_a, model_b), checked_tokens(tokens)
    paths = upload_paths(files)
    result = gpu.cka(list(names), paths, tokens, progress=progress)
    uploaded = Uploaded(names, tokens, result)
    return Computed(uploaded, *render_cka(*names, tokens, uploaded))


# ---- the tab ------------------------------------------------------------------------------------------------

def compare_open(evt: gr.SelectData) -> bool:
    """Whether the top-level tab just selected is this one (an Explain then draws the lens at once)."""
    return evt.value == TITLE


def lens_if_open(key, is_open: bool) -> LensViews:
    """After an Explain: the lens of the new image if this tab is open, else nothing (it draws when opened)."""
    return render_lens(key) if is_open else LensViews(*(gr.skip(),) * len(LensViews._fields))


def residual_if_open(key, is_open: bool) -> tuple:
    return render_residual(key) if is_open else (gr.skip(), gr.skip())


@dataclass
class Compare:
    explained: callable


def layout(page: Page) -> Compare:
    key = page.key
    with gr.Tab(TITLE, id="compare") as tab, gr.Tabs(selected="lens", elem_id="compare-tabs"):
        with gr.Tab("When each model commits", id="lens"):
            gr.Markdown(LENS_WORDS)
            lens_words = gr.Markdown(elem_id="lens-note")
            # the plots and heatmaps say in their titles what they show: no label over them
            curve = gr.Image(label="probability of each model's final class after every block", show_label=False,
                             interactive=False, elem_id="lens-curve")
            gr.Markdown(PATCH_WORDS)
            with gr.Row():
                layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer", elem_id="lens-layer-a")
                layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer", elem_id="lens-layer-b")
            with gr.Row():
                patches_a = gr.Image(label="left: each token's top class", interactive=False, elem_id="lens-a")
                patches_b = gr.Image(label="right: each token's top class", interactive=False, elem_id="lens-b")
        with gr.Tab("Layer similarity (CKA)", id="cka"):
            gr.Markdown(CKA_WORDS)
            tokens = gr.Radio([("mean of the grid tokens", "mean"), ("class token", "cls")], value="mean",
                              label="each block's features", elem_id="cka-tokens")
            cka_words = gr.Markdown(elem_id="cka-note")
            a_vs_b = gr.Image(label="left x right", show_label=False, interactive=False, elem_id="cka-a-b")
            with gr.Row():
                a_vs_a = gr.Image(label="left x left", show_label=False, interactive=False, elem_id="cka-a-a")
                b_vs_b = gr.Image(label="right x right", show_label=False, interactive=False, elem_id="cka-b-b")
            with gr.Accordion("Per block of the left model, the most similar block of the right", open=False):
                table = gr.Markdown(elem_id="cka-table")
            gr.Markdown(f"**On your images**, for any pair of models: upload {MIN_IMAGES} to {MAX_IMAGES} images (both "
                        f"models read each one through their own preprocessing).")
            files = gr.File(file_count="multiple", file_types=["image"], label="images for CKA", height=180,
                            elem_id="cka-files")
            compute = gr.Button("Compute CKA", elem_id="cka-compute")
        with gr.Tab("How far each layer looks", id="reach") as reach_tab:
            gr.Markdown(REACH_WORDS)
            reach_words = gr.Markdown(elem_id="reach-note")
            reach = gr.Image(label="receptive field radii over depth", show_label=False, interactive=False,
                             elem_id="reach-plot")
            with gr.Row():
                reach_layer_a = gr.Slider(1, 12, value=1, step=1, label="left: layer", elem_id="reach-layer-a")
                reach_layer_b = gr.Slider(1, 12, value=1, step=1, label="right: layer", elem_id="reach-layer-b")
            with gr.Row():
                reach_a = gr.Image(label="left: the centre token's receptive field", interactive=False,
                                   elem_id="reach-a")
                reach_b = gr.Image(label="right: the centre token's receptive field", interactive=False,
                                   elem_id="reach-b")
        with gr.Tab("Residual stream", id="residual"):
            gr.Markdown(RESIDUAL_WORDS)
            residual_words = gr.Markdown(elem_id="residual-note")
            residual = gr.Image(label="residual share per block", show_label=False, interactive=False,
                                elem_id="residual-plot")

    with tab:   # not among the top-level Tabs' children, which Gradio's frontend counts as its tabs' indices
        is_open, uploaded = gr.State(False), gr.State(None)
    lens_outputs = [layer_a, layer_b, curve, patches_a, patches_b, lens_words]
    residual_outputs = [residual, residual_words]
    cka_inputs, cka_outputs = [page.model_a, page.model_b, tokens, uploaded], [cka_words, a_vs_b, a_vs_a, b_vs_b, table]
    tab.select(as_files(render_lens), inputs=[key], outputs=lens_outputs, api_name="render_lens", **MODEL_EVENTS)
    tab.select(as_files(render_residual), inputs=[key], outputs=residual_outputs, api_name="render_residual",
               **INSTANT)
    for i, listen in enumerate((tab.select, tokens.change, page.model_a.change, page.model_b.change)):
        listen(as_files(render_cka), inputs=cka_inputs, outputs=cka_outputs,
               api_name="render_cka" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
    compute.click(as_files(compute_cka), inputs=[page.model_a, page.model_b, tokens, files],
                  outputs=[uploaded, *cka_outputs], api_name="compute_cka", **MODEL_EVENTS)
    for i, control in enumerate((layer_a, layer_b)):
        control.release(as_files(render_lens_layer), inputs=[key, layer_a, layer_b], outputs=[patches_a, patches_b],
                        api_name="render_lens_layer" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
    reach_outputs = [reach_layer_a, reach_layer_b, reach, reach_a, reach_b, reach_words]
    reach_tab.select(as_files(render_reach), inputs=[key], outputs=reach_outputs, api_name="render_reach",
                     **MODEL_EVENTS)
    for i, control in enumerate((reach_layer_a, reach_layer_b)):
        control.release(as_files(render_reach_layer), inputs=[key, reach_layer_a, reach_layer_b],
                        outputs=[reach_a, reach_b], api_name="render_reach_layer" if i == 0 else None, **INSTANT,
                        **({} if i == 0 else HIDDEN))
    page.tabs.select(compare_open, outputs=[is_open], api_name="compare_open", **INSTANT, **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain, with this tab open: the lens (a model pass) and the residual stream of the new image."""
        event.success(as_files(lens_if_open), inputs=[key, is_open], outputs=lens_outputs, api_name=None,
                      **MODEL_EVENTS, **HIDDEN)
        event.success(as_files(residual_if_open), inputs=[key, is_open], outputs=residual_outputs, api_name=None,
                      **INSTANT, **HIDDEN)

    return Compare(explained=explained)
