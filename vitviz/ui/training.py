"""Training: what changed as each model learned, from the checkpoints its training run kept: mean attention
distance and CKA to the end as block x checkpoint heatmaps, accuracy along training, the measured summary, and
this photo's prediction at every checkpoint. The training slider on the page (`page.py`) moves both models
through their runs; this tab marks where they are."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import numpy as np

from .. import training
from . import gpu
from .shared import HIDDEN, MODEL_EVENTS, Page, as_files, session

INTRO = ("**How they learned.** Each bundled model's training run kept its checkpoints (from the initialisation, "
         "step 0, to the end); `vitviz training` measured each over the same CIFAR-10 test images. Drag the "
         "**training** slider under the photo to see every tab at that point of training; its end is the end of a "
         "re-run of the shipped model's recipe, not the shipped model itself (docs: Watching them learn).")


def base_name(name: str) -> str:
    return (name or "").strip().split("@")[0]


SERIES: OrderedDict = OrderedDict()   # (photo digest, models) -> their series: a slider's moves reuse it
SERIES_KEPT = 16


def photo_series(key) -> list:
    """The session's photo at every checkpoint of its models' runs (`gpu.over_training`), computed once for a photo
    and a pair of models (moving the training slider changes neither)."""
    kept = session(key)
    found = (hashlib.sha1(kept.picture.tobytes()).hexdigest(), tuple(base_name(name) for name in kept.names))
    if found not in SERIES:
        SERIES[found] = gpu.over_training(list(found[1]), [t.pixels for t in kept.traced])
        while len(SERIES) > SERIES_KEPT:
            SERIES.popitem(last=False)
    SERIES.move_to_end(found)
    return SERIES[found]


def render_training(key) -> tuple:
    """The words, each model's attention-distance and CKA heatmaps, the accuracy curves, this photo along training
    (for models whose training run ships) and how many concepts exist along it (where a dictionary across the run
    ships)."""
    kept = session(key)
    results = [training.shipped(name) for name in kept.names]
    words = [INTRO]
    for name, result in zip(kept.names, results):
        words.append(training.summary_words(result) if result is not None else
                     f"**{base_name(name)}**: no training run of it ships, so there is nothing to draw along training "
                     f"(`python -m vitviz.train --save-steps ...` keeps a run's checkpoints, `vitviz training` "
                     f"measures them).")
    if all(r is not None for r in results) and len(results) == 2:
        words.append(training.comparison_words(results))
    attends = [r if r is not None and r["checkpoints"][-1]["attention_distance"][0] is not None else None
               for r in results]
    top = max((np.nanmax(training.block_by_checkpoint(r, "attention_distance")) for r in attends if r), default=None)
    distance = [None if r is None else training.distance_figure(r, top=top) for r in attends]   # one colour scale
    cka = [training.cka_figure(r) if r is not None else None for r in results]
    found = [r for r in results if r is not None]
    curves = training.curves_figure(found) if found else None
    shown = [(one, training.fraction_of(name)) for one, name in zip(photo_series(key), kept.names) if one is not None]
    births = {base_name(name): found for name in kept.names
              if (found := training.concept_births(name)) is not None}
    born = training.births_figure(births) if births else None
    photo = None
    if shown:
        marks = [None if fraction is None else one["epochs"][0] + fraction * (one["epochs"][-1] - one["epochs"][0])
                 for one, fraction in shown]
        photo = training.prediction_figure([one for one, _ in shown], marks=marks)
    return ("\n\n".join(words), *distance, *cka, curves, photo, born)


@dataclass
class TrainingTab:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None


def layout(page: Page) -> TrainingTab:
    with gr.Tab("Training", id="training") as tab:
        words = gr.Markdown(INTRO, elem_id="training-words")
        photo = gr.Image(label="this photo along training (dashed: the checkpoint shown)", interactive=False,
                         elem_id="training-photo")
        curves = gr.Image(label="accuracy along training", interactive=False, elem_id="training-curves")
        born = gr.Image(label="when concepts are born (the Concepts tab's \"born at\" with the dictionary across the "
                              "run)", interactive=False, elem_id="training-births")
        with gr.Row():
            distance_a = gr.Image(label="left: mean attention distance, block x checkpoint", interactive=False,
                                  elem_id="training-distance-a", min_width=280)
            distance_b = gr.Image(label="right: mean attention distance, block x checkpoint", interactive=False,
                                  elem_id="training-distance-b", min_width=280)
        with gr.Row():
            cka_a = gr.Image(label="left: CKA to its final checkpoint", interactive=False, elem_id="training-cka-a",
                             min_width=280)
            cka_b = gr.Image(label="right: CKA to its final checkpoint", interactive=False, elem_id="training-cka-b",
                             min_width=280)
    outputs = [words, distance_a, distance_b, cka_a, cka_b, curves, photo, born]
    tab.select(as_files(render_training), inputs=[page.key], outputs=outputs, api_name="render_training",
               **MODEL_EVENTS)

    def explained(event, public: bool) -> None:
        """After an Explain (a move of the training slider among them): this tab redrawn, its marks where the
        models now are."""
        event.success(as_files(render_training), inputs=[page.key], outputs=outputs, api_name=None, **MODEL_EVENTS,
                      **HIDDEN)

    return TrainingTab(explained=explained)
