"""Anatomy: the ViT paper's figure 7 for both models (the embedding filters' principal components,
position-embedding similarity, mean attention distance per head), and Swin's counterpart of the position
embedding: each head's relative position bias."""
from __future__ import annotations

import gradio as gr

from ..explain import mean_attention_distance
from ..render import attention_distance_plot, filter_tiles, position_tiles, relative_bias_tiles
from .shared import HIDDEN, INSTANT, Page, as_files, session


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


def layout(page: Page) -> None:
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
    tab.select(as_files(render_anatomy), inputs=[page.key],
               outputs=[filters_a, filters_b, pos_a, pos_b, distance, bias_a, bias_b], api_name="render_anatomy",
               **INSTANT)
    for i, control in enumerate((bias_layer_a, bias_layer_b)):
        control.submit(as_files(render_biases), inputs=[page.key, bias_layer_a, bias_layer_b], outputs=[bias_a, bias_b],
                       api_name="render_biases" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))
