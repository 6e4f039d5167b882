"""Download: every panel as PNG, every map as .npy and a manifest, zipped: the files the CLI's exporter
writes (`export.export_image`), the maps that need a model pass computed by `gpu.class_maps` first, and
what decides (the What decides tab's attribution, from `gpu.decide` unless kept already)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from ..explain import METHODS
from ..export import export_image, manifest, write_manifest, zip_folder
from .decide import attributions
from .shared import MODEL_EVENTS, Page, cache_folder, session

PARAMS = {"head_fusion": "mean", "discard_ratio": 0.0}   # the maps as the page shows them
ZIP_NAME = "vitviz-results.zip"


def download(key, methods, decide=False) -> str:
    """The zip of this session's image and models with the maps of `methods` (default: rollout), and with
    `decide` each classifier's decide.json and token-effect maps."""
    kept = session(key)
    methods = list(dict.fromkeys(methods or ["rollout"]))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise gr.Error(f"Unknown map {unknown[0]!r}: choose from {', '.join(METHODS)}.")
    kept.fill_maps([[(m, PARAMS) for m in methods] for _ in kept.runs])
    decided = attributions(key) if decide else None
    with tempfile.TemporaryDirectory(prefix="vitviz-export-") as folder:
        folder = Path(folder)
        entry = export_image(folder, "image", Path("upload"), kept.picture, kept.runs, methods, formats=["png", "npy"],
                             faithfulness_steps=0, params=PARAMS, decide=bool(decide), decided=decided)
        write_manifest(folder, manifest(models=[run.loaded for run in kept.runs], methods=methods, params=PARAMS,
                                        images=[entry], skipped=[], faithfulness_steps=0))
        # zipped straight into Gradio's cache, which serves it as is and deletes it after VITVIZ_FILE_TTL
        return str(zip_folder(folder, cache_folder() / ZIP_NAME))


def layout(page: Page) -> None:
    with gr.Tab("Download", id="download"):
        methods = gr.CheckboxGroup([(m.title, k) for k, m in METHODS.items()], value=["rollout"],
                                   label="maps to include")
        decide = gr.Checkbox(label="include what decides (decide.json and token-effect maps)",
                             elem_id="download-decide")
        build = gr.Button("Build the zip", elem_id="download-build")
        archive = gr.File(label="results (PNG panels, .npy maps, manifest.json)", elem_id="download-file")
    build.click(download, inputs=[page.key, methods, decide], outputs=[archive], api_name="download", **MODEL_EVENTS)
