"""Attention: raw attention per layer and head, for the class token or the token clicked on the image
(where it looks, or who looks at it); every head of one layer at once, with DINO's display; every
layer x head of both models (the model view); and a windowed model's windows (Swin's, shifted every
second block) with the grid as a block cuts it after its roll."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr

from ..explain import DEFAULT_MASS
from ..views import attention_view, head_views, model_view, window_views
from .shared import (
    HIDDEN,
    INSTANT,
    WHOLE,
    Page,
    as_files,
    block_index,
    head_index,
    layer_slider,
    pictures_and_words,
    run_point,
    runs,
)


class Heads(NamedTuple):
    heads_a: list
    heads_b: list
    note: str


class Ready(NamedTuple):
    """The tab after an Explain: its sliders over each model's blocks and heads, and what they show."""
    layer_a: gr.Slider
    head_a: gr.Slider
    layer_b: gr.Slider
    head_b: gr.Slider
    attention_a: object
    attention_b: object
    heads_layer_a: gr.Slider
    heads_layer_b: gr.Slider
    windows_layer_a: gr.Slider
    windows_layer_b: gr.Slider
    heads: Heads


def pick_point(evt: gr.SelectData):
    """A click on the input image: the point (in the pixels of the image the browser shows) every tab reads."""
    return tuple(evt.index)


def render_layers(key, layer_a, head_a, layer_b, head_b, point=None, direction="row") -> tuple:
    """Per-layer, per-head attention (head 0 = the mean over heads), for the chosen token if any."""
    if direction == "column" and point is None:
        raise gr.Error("Click a point on the input image to choose the token.")
    views = []
    for run, layer, head in zip(runs(key), (layer_a, layer_b), (head_a, head_b)):
        block = block_index(run, layer)
        views.append(attention_view(run, layer=block, head=head_index(run, block, head),
                                    point=run_point(run, point), direction=direction))
    return tuple(views)


def render_heads(key, layer_a, layer_b, token="cls", point=None, threshold=False, fraction=DEFAULT_MASS,
                 style="outline") -> Heads:
    """Every head of each model's chosen layer, for the class token or the clicked one; with `threshold`, the
    tokens holding `fraction` of each head's attention (DINO's display)."""
    mass = float(fraction) if threshold else None
    (heads_a, what_a), (heads_b, what_b) = [
        head_views(run, layer=block_index(run, layer), point=run_point(run, point) if token == "point" else None,
                   fraction=mass, style=style) for run, layer in zip(runs(key), (layer_a, layer_b))]
    waiting = token == "point" and point is None
    note = f"Left: {what_a}.\n\nRight: {what_b}." + ("\n\nClick a point on the input image to choose the token; until "
                                                   "then the heads show the class token." if waiting else "")
    return Heads(heads_a, heads_b, note)


def render_windows(key, layer_a, layer_b, point=None) -> tuple:
    """Each model's windows at its chosen layer (and the grid after the block's roll), the clicked token with the
    keys it sees; a model with global attention, or none, says so."""
    items = [window_views(run, layer=block_index(run, layer), point=run_point(run, point))
             for run, layer in zip(runs(key), (layer_a, layer_b))]
    return tuple(pictures_and_words(views)[0] for views in items) + (
        "\n\n".join(f"**{side}**\n{pictures_and_words(views)[1]}" for side, views in zip(("Left", "Right"), items)),)


def render_model_view(key, token="cls", point=None, threshold=False, fraction=DEFAULT_MASS, style="outline") -> tuple:
    """Every layer x head of both models, one row of thumbnails per layer."""
    mass = float(fraction) if threshold else None
    return tuple(model_view(run, point=run_point(run, point) if token == "point" else None, fraction=mass, style=style)
                 for run in runs(key))


def after_explain(key, token="cls", threshold=False, fraction=DEFAULT_MASS, style="outline") -> tuple:
    """Once an Explain is done (no token chosen on the new image yet): every slider over each model's blocks and
    heads, on its last layer and the head mean, with the attention and the heads drawn there."""
    runs_ = runs(key)
    depths = [len(run.trace.blocks) for run in runs_]
    heads = [gr.Slider(minimum=0, maximum=max(run.trace.blocks[-1].heads, 1), value=0, step=1,
                       interactive=run.attends) for run in runs_]
    attention_a, attention_b = render_layers(key, depths[0], 0, depths[1], 0, None, "row")
    ready = Ready(layer_slider(depths[0]), heads[0], layer_slider(depths[1]), heads[1], attention_a, attention_b,
                  layer_slider(depths[0]), layer_slider(depths[1]), *(gr.Slider(minimum=1, maximum=max(d, 2), value=1,
                                                                               step=1, interactive=d > 1)
                                                                     for d in depths),
                  render_heads(key, depths[0], depths[1], token, None, threshold, fraction, style))
    return (*ready[:-1], *ready.heads)   # Gradio's outputs, in the order of Ready's fields


@dataclass
class Attention:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None
    on_point: tuple       # (handler, inputs, outputs) for a click on the input image


def layout(page: Page) -> Attention:
    key, point = page.key, page.point
    with gr.Tab("Attention", id="attention"), gr.Tabs(selected="layers", elem_id="attention-tabs"):
        with gr.Tab("Layers and heads", id="layers"):
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
                token = gr.Radio([("the class token", "cls"), ("the token you click on the image", "point")],
                                 value="cls", label="where this token looks")
            with gr.Row():
                threshold = gr.Checkbox(label="keep the tokens holding a share of each head's attention")
                fraction = gr.Slider(0.05, 1.0, value=DEFAULT_MASS, step=0.05, label="share of the attention")
                style = gr.Radio(["outline", "mask"], value="outline", label="drawn as")
            note = gr.Markdown(elem_id="heads-note")
            with gr.Row():
                heads_a = gr.Gallery(label="left: every head", columns=3, **WHOLE, elem_id="heads-a")
                heads_b = gr.Gallery(label="right: every head", columns=3, **WHOLE, elem_id="heads-b")
            with gr.Accordion("Every layer x head (the model view)", open=False):
                model_view_run = gr.Button("Draw every layer x head")
                with gr.Row():
                    every_a = gr.Gallery(label="left: one row per layer, head 1 on the left", columns=1, **WHOLE)
                    every_b = gr.Gallery(label="right: one row per layer, head 1 on the left", columns=1, **WHOLE)
        with gr.Tab("Windows", id="windows"):
            gr.Markdown("A windowed model (Swin) attends within windows of its token grid, and every second block "
                        "first rolls the grid by half a window, so its windows straddle the previous block's borders; "
                        "the windows that then wrap around the edges hold parts from both sides of the image, which "
                        "a mask keeps apart. Click the image: the token and the keys it can see are outlined. "
                        "Raw attention per head: the other sub-tabs, for the clicked token.")
            with gr.Row():
                windows_layer_a = gr.Slider(1, 12, value=1, step=1, label="left: layer", elem_id="windows-layer-a")
                windows_layer_b = gr.Slider(1, 12, value=1, step=1, label="right: layer")
            windows_note = gr.Markdown(elem_id="windows-note")
            with gr.Row():
                windows_a = gr.Gallery(label="left: windows, and the grid after the roll", columns=1, **WHOLE,
                                       elem_id="windows-a")
                windows_b = gr.Gallery(label="right: windows, and the grid after the roll", columns=1, **WHOLE,
                                       elem_id="windows-b")

    layer_inputs = [key, layer_a, head_a, layer_b, head_b, point, direction]
    for i, control in enumerate((layer_a, head_a, layer_b, head_b, direction)):
        listen = control.change if control is direction else control.release
        listen(as_files(render_layers), inputs=layer_inputs, outputs=[attn_a, attn_b],
               api_name="render_layers" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
    heads_inputs = [key, heads_layer_a, heads_layer_b, token, point, threshold, fraction, style]
    heads_outputs = [heads_a, heads_b, note]
    controls = [heads_layer_a.release, heads_layer_b.release, fraction.release, token.change, threshold.change,
                style.change]
    for i, listen in enumerate(controls):
        listen(as_files(render_heads), inputs=heads_inputs, outputs=heads_outputs,
               api_name="render_heads" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
    model_view_run.click(as_files(render_model_view), inputs=[key, token, point, threshold, fraction, style],
                         outputs=[every_a, every_b], api_name="render_model_view", **INSTANT)
    windows_inputs = [key, windows_layer_a, windows_layer_b, point]
    windows_outputs = [windows_a, windows_b, windows_note]
    for i, control in enumerate((windows_layer_a, windows_layer_b)):
        control.release(as_files(render_windows), inputs=windows_inputs, outputs=windows_outputs,
                        api_name="render_windows" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))

    def explained(event, public: bool) -> None:
        ready = event.success(as_files(after_explain), inputs=[key, token, threshold, fraction, style],
                              outputs=[layer_a, head_a, layer_b, head_b, attn_a, attn_b, heads_layer_a, heads_layer_b,
                                       windows_layer_a, windows_layer_b, *heads_outputs], **INSTANT, **HIDDEN)
        ready.success(as_files(render_windows), inputs=windows_inputs, outputs=windows_outputs, **INSTANT, **HIDDEN)

    def at_point(key_, layer_a_, head_a_, layer_b_, head_b_, point_, direction_, heads_layer_a_, heads_layer_b_,
                 token_, threshold_, fraction_, style_, windows_layer_a_, windows_layer_b_):
        """A click on the input image: the attention of the token under it, the heads if they show it, and the
        windows with the keys it sees."""
        layers = render_layers(key_, layer_a_, head_a_, layer_b_, head_b_, point_, direction_)
        windows = render_windows(key_, windows_layer_a_, windows_layer_b_, point_)
        if token_ != "point":
            return (*layers, gr.skip(), gr.skip(), gr.skip(), *windows)
        return (*layers, *render_heads(key_, heads_layer_a_, heads_layer_b_, token_, point_, threshold_, fraction_,
                                       style_), *windows)

    on_point = (as_files(at_point), [*layer_inputs, heads_layer_a, heads_layer_b, token, threshold, fraction, style,
                                     windows_layer_a, windows_layer_b],
                [attn_a, attn_b, *heads_outputs, *windows_outputs])
    return Attention(explained=explained, on_point=on_point)
