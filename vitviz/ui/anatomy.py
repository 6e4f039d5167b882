"""Anatomy: the ViT paper's figure 7 for both models (the embedding filters' principal components,
position-embedding similarity, mean attention distance per head)."""
from __future__ import annotations

import gradio as gr

from ..explain import mean_attention_distance
from ..render import attention_distance_plot, filter_tiles, position_tiles
from .shared import INSTANT, Page, as_files, session


def render_anatomy(key) -> tuple:
    """Each model's filters and position similarity (from what `gpu.trace` sent of its weights), and the mean
    attention distance of every head of both."""
    kept = session(key)
    distances = {run.name: [d[0].tolist() for d in mean_attention_distance(run.trace)] for run in kept.runs}
    return (*(filter_tiles(t.filters) for t in kept.traced), *(position_tiles(t.positions) for t in kept.traced),
            attention_distance_plot(distances))


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
        distance = gr.Image(label="mean attention distance per head", interactive=False)
    tab.select(as_files(render_anatomy), inputs=[page.key], outputs=[filters_a, filters_b, pos_a, pos_b, distance],
               api_name="render_anatomy", **INSTANT)
