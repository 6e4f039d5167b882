"""Anatomy: the ViT paper's figure 7 for both models (the embedding filters' principal components,
position-embedding similarity, mean attention distance per head), Swin's counterpart of the position
embedding: each head's relative position bias; and what a unit looks like: the picture that excites one hidden unit
of a block's MLP most (a block's channel, for a ResNet, which has no MLP; or a dictionary's concept), drawn by
feature visualisation (`vitviz.looks`, through `gpu.draw_pictures`), with its transparency map and the objective's
curve, at one grid cell if asked, as several variants pushed apart and with the picture lowering it most if asked:
the app's `/looks`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr

from .. import catalog
from ..explain import mean_attention_distance
from ..render import attention_distance_plot, filter_tiles, position_tiles, relative_bias_tiles
from ..render.looks import GAP, alpha_view, curve_plot, picture_row, picture_view
from . import gpu
from .drawn import draw_pictures as drawn_pictures
from .pictures import method_words
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, Page, as_files, session

LOOKS_METHODS = ("maco", "pixels")   # `looks.METHODS`' names (vitviz.looks is imported when a picture is drawn)
MAX_STEPS = 256   # a drawing's steps at most: a few minutes of the bundled models on a CPU
MAX_VARIANTS = 4  # pictures of a target drawn together here at most (the library's `draw.MAX_VARIANTS`: 8)
ROW_SIDE = 192    # px: each picture's tile where several are shown, two to a row
LOOKS_WORDS = ("**What a unit looks like**: the picture that excites one hidden unit of a block's MLP most, found by "
               "gradient ascent on an image seen through random crops (feature visualisation; MACO holds it to a "
               "natural photo's spectrum, pixels paints it freely). A ResNet has no MLP, so a block's channel is drawn "
               "for it; a dictionary's concept can be drawn too. Several models: one picture exciting the target in "
               "all of them at once. A position reads the target at one grid cell; variants are pictures from other "
               "starts pushed apart in style (Olah et al. 2017), the negative the picture that lowers it most.")


class Looks(NamedTuple):
    """What `/looks` answers: the picture, its transparency map, the objective's curve and the words."""
    picture: object
    alpha: object
    curve: object
    words: str


def render_anatomy(key) -> tuple:
    """Each model's filters and position similarity (from what `gpu.trace` sent of its weights), the mean
    attention distance of every head of both (models with attention), and each model's first windowed block's
    relative position bias."""
    kept = session(key)
    distances = {run.name: [d[0].tolist() for d in mean_attention_distance(run.trace)] for run in kept.runs
                 if run.attends}
    return (*(filter_tiles(t.filters) for t in kept.traced), *(position_tiles(t.positions) for t in kept.traced),
            attention_distance_plot(distances), *render_biases(key, 1, 1))


def render_biases(key, layer_a, layer_b) -> tuple:
    """Each model's relative position bias per head at its chosen windowed block (1-based)."""
    views = []
    for traced, layer in zip(session(key).traced, (layer_a, layer_b)):
        count = len(traced.biases or [])
        if count and not 1 <= int(layer) <= count:
            raise gr.Error(f"{traced.card.name} has {count} windowed blocks: choose one from 1 to {count}.")
        views.append(relative_bias_tiles(traced.biases, int(layer) - 1 if count else 0))
    return tuple(views)


def model_names(models) -> list[str]:
    """The model box's value (a list; through the API also a comma-separated string) -> the names, each once."""
    names = [m.strip() for m in (models.split(",") if isinstance(models, str) else models or []) if m and m.strip()]
    return list(dict.fromkeys(names))


def position_of(position) -> int | None:
    """The position box's text (or a number, through the API): empty for the grid's mean, else a grid cell (a whole
    number from 0), or a gr.Error saying so."""
    text = "" if position is None else str(position).strip()
    return None if not text else gpu.whole_number(text, "The position (a grid cell)")


def looks(models, kind="unit", block=1, number=0, dictionary="", method="maco", steps=64, seed=0, position=None,
          variants=1, negative=False, progress=gr.Progress()) -> Looks:
    """Draw what a target looks like in `models` at once (one `gpu.draw_pictures` call): a `kind` 'unit' (of block
    `block`'s MLP, from 1), 'channel' (of block `block`'s output) or 'concept' (of the dictionary `dictionary`),
    number `number` (from 0), at grid cell `position` (row by row from 0; None: the grid's mean); `method` 'maco' or
    'pixels', `steps` steps, seed `seed`; `variants` pictures pushed apart (1 to `MAX_VARIANTS`) and, with
    `negative`, the one lowering it most. -> the picture (several: two to a row, labelled), its transparency map, the
    objective's curve and the words."""
    from ..looks import LooksError, Settings

    names = model_names(models)
    steps = gpu.whole_number(steps, "The steps", least=1)
    if steps > MAX_STEPS:
        raise gr.Error(f"A drawing here takes at most {MAX_STEPS} steps, not {steps}: the command line takes more "
                       f"(vitviz looks --steps).")
    variants = gpu.whole_number(variants, "The variants", least=1)
    if variants > MAX_VARIANTS:
        raise gr.Error(f"A drawing here makes at most {MAX_VARIANTS} variants, not {variants}: the command line makes "
                       f"more (vitviz looks --variants).")
    try:
        settings = Settings(method=method, steps=steps, seed=gpu.whole_number(seed, "The seed"))
    except LooksError as e:
        raise gr.Error(str(e)) from None
    source = gpu.dictionary_source(dictionary) if kind == "concept" else ""
    drawn = drawn_pictures([names], kind, number, block=block, dictionary=source, settings=settings,
                           position=position_of(position), variants=variants, negative=bool(negative),
                           progress=progress)
    first = drawn[0]
    rising = [p.curve[-1] - p.curve[-max(2, len(p.curve) // 10)] > 0.02 * abs(p.curve[-1]) for p in drawn
              if p.label != "negative"]   # over its last tenth
    went = "; ".join(f"{p.label + ': ' if p.label else ''}{p.curve[0]:.2f} to {p.curve[-1]:.2f}" for p in drawn)
    words = (f"**{' + '.join(first.models)}**, {first.target}: {method_words(settings.method.name)}, {steps} steps of "
             f"{settings.copies} crops, seed {settings.seed}, drawn in {sum(p.seconds for p in drawn):.0f} s; the "
             f"objective went from {went}" + ("; still rising at its end: more steps would take it further"
                                              if any(rising) else "") + ".")
    words = " ".join(line for line in (first.note, words) if line)
    if len(drawn) == 1:
        return Looks(picture_view(first.image), alpha_view(first.alpha), curve_plot({first.target: first.curve}),
                     words)
    row = lambda pairs: picture_row(pairs, side=ROW_SIDE, per_row=2, width=2 * (ROW_SIDE + GAP) + GAP)
    labels = [p.label or "its picture" for p in drawn]
    return Looks(row(list(zip(labels, (p.image for p in drawn)))),
                 row([(label, alpha_view(p.alpha, side=ROW_SIDE)) for label, p in zip(labels, drawn)]),
                 curve_plot({label: p.curve for label, p in zip(labels, drawn)}), words)


def looks_plan(key, models, steps) -> str:
    """The line under the drawing's controls: how long a drawing of the session's models should take (from their
    input sizes), said before it starts; where a model is not the session's, the progress bar says it once loaded."""
    from ..looks import Settings

    if key is None:
        return ""
    kept = session(key)
    sizes = {name: run.loaded.transform.crop for name, run in zip(kept.names, kept.runs)}
    names = model_names(models)
    if not names or any(name not in sizes for name in names):
        return ""
    seconds = gpu.drawing_seconds([[sizes[m] for m in names]], Settings(steps=int(steps or 1)))
    return f"A drawing of {' + '.join(names)} in {int(steps or 1)} steps takes {gpu.duration_words(seconds)} here."


def after_explain(key, models, steps) -> tuple:
    """A new Explain: the drawing's model box offers the session's models (the left one chosen), and its time."""
    names = session(key).names
    chosen = [m for m in (models or []) if m in names] or names[:1]
    return gr.Dropdown(choices=names, value=chosen, multiselect=True), looks_plan(key, chosen, steps)


@dataclass
class AnatomyTab:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None


def layout(page: Page) -> AnatomyTab:
    with gr.Tab("Anatomy", id="anatomy") as tab:
        gr.Markdown("How each model is built, read off its weights and this image's attention (the ViT paper, "
                    "figure 7).", elem_id="anatomy-note")
        with gr.Row():
            filters_a = gr.Image(label="left: embedding filters (principal components)", interactive=False)
            filters_b = gr.Image(label="right: embedding filters (principal components)", interactive=False)
        with gr.Row():
            pos_a = gr.Image(label="left: position-embedding similarity", interactive=False)
            pos_b = gr.Image(label="right: position-embedding similarity", interactive=False)
        distance = gr.Image(label="mean attention distance per head (models with attention)", interactive=False)
        gr.Markdown("**Relative position bias** (Swin's counterpart of the position embedding): per head, the bias "
                    "its attention adds to the logit of a key dy rows below and dx columns right of the query (rows: "
                    "dy from -(w-1) to w-1, top to bottom; columns: dx, left to right; outlined: the query itself).")
        with gr.Row():
            bias_layer_a = gr.Number(value=1, precision=0, minimum=1, label="left: windowed block")
            bias_layer_b = gr.Number(value=1, precision=0, minimum=1, label="right: windowed block")
        with gr.Row():
            bias_a = gr.Image(label="left: relative position bias per head", interactive=False, elem_id="bias-a")
            bias_b = gr.Image(label="right: relative position bias per head", interactive=False, elem_id="bias-b")
        gr.Markdown(LOOKS_WORDS, elem_id="looks-note")
        with gr.Row(equal_height=False):
            models = gr.Dropdown([page.model_a.value], value=[page.model_a.value], multiselect=True,
                                 allow_custom_value=True, label="model(s)", scale=2, min_width=220,
                                 elem_id="looks-models")
            kind = gr.Radio([(words, kind) for kind, words in gpu.TARGET_KINDS.items()], value="unit",
                            label="what to draw", scale=3, min_width=260, elem_id="looks-kind")
            block = gr.Number(value=1, precision=0, minimum=1, label="block (from 1)", min_width=120,
                              elem_id="looks-block")
            number = gr.Number(value=0, precision=0, minimum=0, label="its number (from 0)", min_width=120,
                               elem_id="looks-number")
        with gr.Row(equal_height=False):
            dictionary = gr.Dropdown(["", *catalog.BUNDLED_DICTIONARIES], value="", allow_custom_value=True,
                                     label="dictionary", info="a concept's", min_width=200, elem_id="looks-dictionary")
            method = gr.Radio(list(LOOKS_METHODS), value="maco", label="method", min_width=160, elem_id="looks-method")
            steps = gr.Slider(4, MAX_STEPS, value=64, step=4, label="steps", min_width=200, elem_id="looks-steps")
            seed = gr.Number(value=0, precision=0, minimum=0, label="seed", min_width=100, elem_id="looks-seed")
        with gr.Row(equal_height=False):
            position = gr.Textbox(value="", label="position", placeholder="the whole grid",
                                  info="a grid cell, row by row from 0; empty: the whole grid", min_width=160,
                                  elem_id="looks-position")
            variants = gr.Slider(1, MAX_VARIANTS, value=1, step=1, label="variants",
                                 info="pictures from other starts, pushed apart", min_width=200,
                                 elem_id="looks-variants")
            negative = gr.Checkbox(value=False, label="and the negative", info="the picture lowering it most",
                                   min_width=160, elem_id="looks-negative")
            draw = gr.Button("Draw", variant="primary", scale=0, min_width=120, elem_id="looks-draw")
        plan = gr.Markdown(elem_id="looks-plan")
        with gr.Row(equal_height=False):
            picture = gr.Image(label="its picture", interactive=False, min_width=220, elem_id="looks-picture")
            alpha = gr.Image(label="its transparency map (where the objective cared)", interactive=False,
                             min_width=220, elem_id="looks-alpha")
            curve = gr.Image(label="the objective at each step", interactive=False, min_width=260,
                             elem_id="looks-curve")
        words = gr.Markdown(elem_id="looks-words")
    tab.select(as_files(render_anatomy), inputs=[page.key],
               outputs=[filters_a, filters_b, pos_a, pos_b, distance, bias_a, bias_b], api_name="render_anatomy",
               **INSTANT)
    for i, control in enumerate((bias_layer_a, bias_layer_b)):
        control.submit(as_files(render_biases), inputs=[page.key, bias_layer_a, bias_layer_b], outputs=[bias_a, bias_b],
                       api_name="render_biases" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
    draw.click(as_files(looks), inputs=[models, kind, block, number, dictionary, method, steps, seed, position,
                                        variants, negative],
               outputs=[picture, alpha, curve, words], api_name="looks", **MODEL_EVENTS)
    for control in (models.change, steps.release):
        control(looks_plan, inputs=[page.key, models, steps], outputs=[plan], api_name=None, **INSTANT, **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain: the drawing's model box offers the new models, and says how long a drawing takes."""
        event.success(after_explain, inputs=[page.key, models, steps], outputs=[models, plan], api_name=None,
                      **INSTANT, **HIDDEN)

    return AnatomyTab(explained=explained)
