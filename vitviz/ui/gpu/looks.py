"""The feature pictures' GPU work (`vitviz.looks`): a target (a dictionary's concept, an MLP's hidden unit, a block's
channel) drawn in one model or in several at once, once per entry of a plan, returned as plain arrays (`Picture`).

A plan is a list of model sets: [[a]] draws one picture in model a; [[a, b], [a], [b]] one that excites the target
in a and b at once, then each one's own: what a card of a dictionary across models shows. Each entry can be drawn as
N variants pushed apart (`looks.draw(variants=)`) and with its negative, the picture that lowers the target most; a
concept, unit or channel can be read at one grid cell (`position`, row-major from 0). Blocks are counted from 1
here, as everywhere in the app (the library counts from 0), and checked in those words; a model without an MLP (a
ResNet) has no hidden units, so its block's channel of that number is drawn instead, and the picture's note says so.

The progress bar hears every step: before the first, how long the drawing should take (`drawing_seconds`, from the
models' input sizes), then after each, the time left at the pace measured since the first (which also reads the
dictionaries and warms the models up).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gradio as gr
import numpy as np
import torch

from ...gate import MODEL_GATE
from .boundary import DEVICE, gpu, in_words, loading_seconds, models_of

if TYPE_CHECKING:   # vitviz.looks is imported where it is used: it brings vitviz.concepts (scipy) to the server's start
    from ...looks import Settings, Target

TARGET_KINDS = {"unit": "an MLP's hidden unit", "channel": "a block's channel", "concept": "a dictionary's concept"}
# A step's cost in one model: a floor (the canvas, its crops, the optimiser's step, the small models' many small
# kernels: one picture of a bundled model, 2 crops, took 0.1 to 0.3 s a step on the 2-core CPU these were measured on)
# and a traced forward and backward per pixel of each copy at the model's input size. CPU: the bundled ViT's shipped
# pictures took 1.8 s a step for 128 crops of 32 px on one core (checkpoints/concepts/looks.sh); GPU: ViT-B/16's 4
# crops at 224 px take 0.017 s a step on an H200 (docs/looks.md), doubled for smaller GPUs.
STEP_COST = {"cpu": (0.1, 1.4e-5), "cuda": (0.01, 2e-7)}   # (seconds a step, seconds a crop's pixel)
START_S = 10          # a ZeroGPU call's start: each model's probe trace, the dictionary read
ZERO_GPU_SIDE = 224   # px: the input side a ZeroGPU call's duration assumes (the catalog's models')


@dataclass(frozen=True)
class Picture:
    """One picture as it crosses back: the models it excites the target in, the target in words ("block 4's MLP
    unit 17"), the picture (S S 3 float32 in [0, 1]), its transparency map (S S float32 in [0, 1]), the objective
    before each step (float32), the seconds it took, what was drawn instead of what was asked ('' for nothing), and
    which picture of the target it is ('variant 2', 'negative'; '' for the one picture)."""
    models: tuple[str, ...]
    target: str
    image: np.ndarray
    alpha: np.ndarray
    curve: np.ndarray
    seconds: float
    note: str = ""
    label: str = ""


def drawing_seconds(sizes: Sequence[Sequence[tuple[int, int]]], settings: Settings, device: str = DEVICE) -> float:
    """How long drawing one picture per entry of `sizes` (each entry its models' input sizes, h w) should take on
    `device`: per step and model, `STEP_COST`'s floor and the copies' pixels."""
    floor, per_pixel = STEP_COST["cuda" if str(device).startswith("cuda") else "cpu"]
    return settings.steps * sum(floor + settings.copies * h * w * per_pixel for models in sizes for h, w in models)


def duration_words(duration: float) -> str:
    """A duration as a person says it: 'about a second', 'about 8 s', 'about 3 min'."""
    if duration < 1.5:
        return "about a second"
    return f"about {round(duration)} s" if duration < 90 else f"about {round(duration / 60)} min"


def draw_seconds(plan, kind, number, *, block=None, dictionary="", settings, position=None, variants=1, negative=False,
                 progress=None) -> int:
    """A drawing's GPU time on ZeroGPU: its start, every step of every picture at the catalog's input size, and
    loading a model not in memory."""
    sizes = [[(ZERO_GPU_SIDE, ZERO_GPU_SIDE)] * len(models) for models in plan] * (variants + bool(negative))
    names = {m for models in plan for m in models}
    return int(START_S + drawing_seconds(sizes, settings, "cuda")) + loading_seconds(names)


def whole_number(value, what: str, least: int = 0) -> int:
    """A number a person typed as the whole number it must be, or a gr.Error saying so."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not number.is_integer() or number < least:
        raise gr.Error(f"{what} must be a whole number of at least {least}, not {value!r}.")
    return int(number)


def target_of(loaded: list, kind: str, number, block, dictionary: str, position=None) -> tuple[Target, str, str]:
    """The library's target for what the app asks (blocks from 1; `position` a grid cell or None), checked against
    every model in the app's words: (the target, it in words, what was drawn instead of what was asked: '' for
    nothing). A position beyond the grid is refused by the library, in its words, once the drawing starts."""
    from ...looks import Channel, Concept, Unit

    if kind not in TARGET_KINDS:
        raise gr.Error(f"What to draw is {', '.join(TARGET_KINDS)} ({'; '.join(TARGET_KINDS.values())}), not "
                       f"{kind!r}.")
    number = whole_number(number, f"The {kind}'s number")
    at = "" if position is None else f" at cell {position}"
    if kind == "concept":
        if not dictionary:
            raise gr.Error("A concept is a dictionary's: name the dictionary.")
        return Concept(dictionary, number, position=position), f"concept {number} of {dictionary}{at}", ""
    block = whole_number(block, "The block", least=1)
    probes = []
    for model in loaded:
        with torch.inference_mode():
            probe = model.model.trace(torch.zeros(1, 3, *model.transform.crop, device=model.device), attention=False,
                                      units=True)
        if block > len(probe.blocks):
            raise gr.Error(f"{model.name} has {len(probe.blocks)} blocks: choose a block from 1 to "
                           f"{len(probe.blocks)}.")
        probes.append(probe.blocks[block - 1])
    without = [model.name for model, found in zip(loaded, probes) if found.hidden is None]
    note = ""
    if kind == "unit" and without:
        kind, note = "channel", (f"{without[0]}'s blocks have no MLP, so it has no hidden units: drawn is channel "
                                 f"{number} of block {block}'s output instead.")
    for model, found in zip(loaded, probes):
        count = (found.hidden if kind == "unit" else found.tokens).shape[-1]
        if number >= count:
            what = "units in its MLP" if kind == "unit" else "channels"
            raise gr.Error(f"Block {block} of {model.name} has {count} {what} (0 to {count - 1}): there is no {kind} "
                           f"{number}.")
        h, w = found.query_grid
        if position is not None and position >= h * w:
            raise gr.Error(f"Block {block} of {model.name} has a grid of {h} x {w} cells: the position is a cell from "
                           f"0 to {h * w - 1} (row by row), not {position}.")
    at = "" if position is None else f" at cell {position}"
    if kind == "unit":
        return Unit(block=block - 1, unit=number, position=position), f"block {block}'s MLP unit {number}{at}", note
    return Channel(block=block - 1, channel=number, position=position), f"block {block}'s channel {number}{at}", note


@gpu(duration=draw_seconds)
def draw_pictures(plan: list[list[str]], kind: str, number: int, *, block: int | None = None, dictionary: str = "",
                  settings: Settings, position: int | None = None, variants: int = 1, negative: bool = False,
                  progress=None) -> list[Picture]:
    """Pictures of a target per entry of `plan` (model names: the picture exciting it in all of them at once): a
    `kind` 'concept' `number` of the dictionary `dictionary` (a source `gpu.dictionary_source` allowed), or an MLP's
    'unit' or a 'channel' `number` of block `block` (from 1), at grid cell `position` (None: over the grid); drawn
    with `settings` (`looks.Settings`, seeded: the library's `looks.draw` of the same makes the same picture). Per
    entry its `variants` pictures (one: the ordinary picture), then with `negative` the one lowering the target most.
    `progress(fraction, desc=...)` hears the time it should take, then every step. Whatever cannot be drawn is a
    gr.Error in words."""
    from ...looks import draw

    if not plan or not all(plan):
        raise gr.Error("Name a model to draw in (several: one picture exciting the target in all of them).")
    names = list(dict.fromkeys(m for models in plan for m in models))
    loaded = dict(zip(names, models_of(names)))
    target, words, note = target_of(list(loaded.values()), kind, number, block, dictionary, position)
    rounds = [(models, options) for models in plan for options in (
        {"variants": variants}, *([{"negative": True}] if negative else []))]
    total = settings.steps * len(rounds)
    estimate = drawing_seconds([[loaded[m].transform.crop for m in models] for models in plan], settings,
                               loaded[names[0]].device) * (variants + bool(negative))
    if progress is not None:
        progress(0.0, desc=f"drawing {words}: {duration_words(estimate)}")
    pictures, first_done = [], []   # when the first step ended: the pace is measured from there
    for k, (models, options) in enumerate(rounds):
        def heard(step: int, steps: int, before: int = k * settings.steps) -> None:
            done = before + step
            if done == 1:
                first_done.append(time.perf_counter())
            left = (time.perf_counter() - first_done[0]) / (done - 1) * (total - done) if done > 1 else estimate
            progress(done / total, desc=f"step {done} of {total}" + (f", {duration_words(left)} left" if left else ""))

        began = time.perf_counter()
        with MODEL_GATE():
            drawing = in_words(draw, [loaded[m] for m in models], target, settings=settings,
                               progress=None if progress is None else heard, bar=False, **options)
        seconds = (time.perf_counter() - began) / len(drawing.images)
        labels = (["negative"] if drawing.negative else [""] if drawing.variants == 1 else
                  [f"variant {v + 1}" for v in range(drawing.variants)])
        pictures += [Picture(models=tuple(models), target=words, image=image, alpha=alpha, curve=curve,
                             seconds=seconds, note=note, label=label)
                     for image, alpha, curve, label in zip(drawing.images, drawing.alpha, drawing.curve, labels)]
    return pictures
