"""Features: each stage's feature map (CvT's three stages; ViT's one token grid) with its most active
channels, and the DINOv2 paper's picture of the last layer's patch features."""
from __future__ import annotations

import gradio as gr

from ..views import channel_view, feature_pca_view, stage_views
from .shared import INSTANT, Page, as_files, runs


def render_stages(key) -> tuple:
    """Per-stage features (PCA as RGB, token norms) and each model's last stage's most active channels."""
    return tuple(stage_views(run) + [channel_view(run, len(run.trace.features) - 1)] for run in runs(key))


def render_features(key) -> tuple:
    """The DINOv2 paper's picture of each model's last-layer patch features, and what each shows in words."""
    (view_a, words_a), (view_b, words_b) = [feature_pca_view(run) for run in runs(key)]
    return view_a, view_b, f"Left: {words_a}.\n\nRight: {words_b}."


def layout(page: Page) -> None:
    with gr.Tab("Features", id="features"), gr.Tabs(selected="stages", elem_id="features-tabs"):
        with gr.Tab("Stages", id="stages") as stages_tab:
            with gr.Row():
                stages_a = gr.Gallery(label="left: features per stage", columns=2, height="auto")
                stages_b = gr.Gallery(label="right: features per stage", columns=2, height="auto")
        with gr.Tab("Last-layer features", id="pca") as pca_tab:
            gr.Markdown("The DINOv2 paper's picture of the last layer's patch features: a first PCA over the "
                        "image's patches splits foreground from background at the first component's mean (the "
                        "background is the side holding more of the border tokens); a second PCA over the "
                        "foreground patches gives their colours. Patches with similar features get similar colours, "
                        "so an object's parts show up as regions.")
            note = gr.Markdown(elem_id="pca-note")
            with gr.Row():
                pca_a = gr.Image(label="left: last-layer features", interactive=False, elem_id="pca-a")
                pca_b = gr.Image(label="right: last-layer features", interactive=False, elem_id="pca-b")
    stages_tab.select(as_files(render_stages), inputs=[page.key], outputs=[stages_a, stages_b],
                      api_name="render_stages", **INSTANT)
    pca_tab.select(as_files(render_features), inputs=[page.key], outputs=[pca_a, pca_b, note],
                   api_name="render_features", **INSTANT)
