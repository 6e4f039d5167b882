"""Tokens: how each model cuts the image into tokens (ViT's patch grid, CvT's three overlapping stage
lattices), each token's norm per layer, and the high-norm artefact tokens and registers."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr

from ..views import artefact_views, grid_gallery, norm_view
from .shared import (
    HIDDEN,
    INSTANT,
    WHOLE,
    Page,
    as_files,
    block_index,
    layer_slider,
    pictures_and_words,
    run_point,
    runs,
)


class Grids(NamedTuple):
    grid_a: list
    grid_b: list
    words_a: str
    words_b: str


class Registers(NamedTuple):
    note: str
    artefacts_a: list
    artefacts_b: list
    registers_a: list
    registers_b: list


def render_tokens(key, point=None) -> Grids:
    """How each model cuts the image into tokens, the token under `point` marked; what each drawing shows as
    page text."""
    (grid_a, words_a), (grid_b, words_b) = [pictures_and_words(grid_gallery(run, point=run_point(run, point)))
                                            for run in runs(key)]
    return Grids(grid_a, grid_b, words_a, words_b)


def render_norms(key, layer_a, layer_b) -> tuple:
    return tuple(norm_view(run, block_index(run, layer)) for run, layer in zip(runs(key), (layer_a, layer_b)))


def render_registers(key) -> Registers:
    """The high-norm artefact tokens of each model's last layer, and its registers' own attention; the counts
    and what each view shows, in words."""
    galleries, notes = [], []
    for side, run in zip(("Left", "Right"), runs(key)):
        views, registers, summary = artefact_views(run)
        (views, views_words), (registers, registers_words) = pictures_and_words(views), pictures_and_words(registers)
        galleries += [views, registers]
        notes.append(f"{side}: {summary}\n\n{views_words}" + (f"\n\nIts registers:\n\n{registers_words}"
                                                            if registers else ""))
    (views_a, registers_a), (views_b, registers_b) = galleries[:2], galleries[2:]
    return Registers("\n\n".join(notes), views_a, views_b, registers_a, registers_b)


class Norms(NamedTuple):
    layer_a: gr.Slider
    layer_b: gr.Slider
    norms_a: object
    norms_b: object


def norm_sliders(key) -> Norms:
    """Both norm sliders over each model's blocks, on its last one, and the norms there."""
    depths = [len(run.trace.blocks) for run in runs(key)]
    return Norms(*(layer_slider(d) for d in depths), *render_norms(key, *depths))


@dataclass
class Tokens:
    tabs: gr.Tabs
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None
    on_point: tuple       # (handler, inputs, outputs) for a click on the input image


def layout(page: Page) -> Tokens:
    with gr.Tab("Tokens", id="tokens"), gr.Tabs(selected="lattices", elem_id="tokens-tabs") as tabs:
        with gr.Tab("How the image is cut", id="lattices"):
            with gr.Row():
                # each view as wide as the column (a CvT's three stages side by side were too small to read), and
                # what it shows as page text under it
                with gr.Column():
                    grid_a = gr.Gallery(label="left: tokens", columns=1, **WHOLE, elem_id="grid-a")
                    words_a = gr.Markdown(elem_id="grid-words-a")
                with gr.Column():
                    grid_b = gr.Gallery(label="right: tokens", columns=1, **WHOLE, elem_id="grid-b")
                    words_b = gr.Markdown(elem_id="grid-words-b")
        with gr.Tab("Token norms", id="norms"):
            gr.Markdown("Each token's L2 norm after the chosen layer: where the model writes large values.")
            with gr.Row():
                layer_a = gr.Slider(1, 12, value=12, step=1, label="left: layer", elem_id="norm-layer-a")
                layer_b = gr.Slider(1, 12, value=12, step=1, label="right: layer", elem_id="norm-layer-b")
            with gr.Row():
                norms_a = gr.Image(label="left: token norms", interactive=False, elem_id="norms-a")
                norms_b = gr.Image(label="right: token norms", interactive=False, elem_id="norms-b")
        with gr.Tab("Registers and artefacts", id="registers"):
            gr.Markdown("Large ViTs trained long (DINOv2 among them) turn a few background patches into scratch "
                        "space: their tokens leave the last layers with norms many times the rest and draw the "
                        "class token's attention (Darcet et al. 2023). Register tokens give the model that space "
                        "elsewhere: compare **DINOv2 vs DINOv2 with registers** (the button above).")
            note = gr.Markdown(elem_id="registers-note")
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
    grids = [grid_a, grid_b, words_a, words_b]
    registers = [note, artefacts_a, artefacts_b, registers_a, registers_b]
    for i, control in enumerate((layer_a, layer_b)):
        control.release(as_files(render_norms), inputs=[page.key, layer_a, layer_b], outputs=[norms_a, norms_b],
                        api_name="render_norms" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))

    def explained(event, public: bool) -> None:
        """After an Explain: the token lattices, the norm sliders on each model's last layer with its norms, and
        the artefacts, so each sub-tab is ready when opened."""
        shown = {} if public else HIDDEN
        event.success(as_files(render_tokens), inputs=[page.key], outputs=grids,
                      api_name="render_tokens" if public else None, **INSTANT, **shown)
        event.success(as_files(norm_sliders), inputs=[page.key], outputs=[layer_a, layer_b, norms_a, norms_b],
                      api_name=None, **INSTANT, **HIDDEN)
        event.success(as_files(render_registers), inputs=[page.key], outputs=registers,
                      api_name="render_registers" if public else None, **INSTANT, **shown)

    on_point = (as_files(render_tokens), [page.key, page.point], grids)
    return Tokens(tabs=tabs, explained=explained, on_point=on_point)
