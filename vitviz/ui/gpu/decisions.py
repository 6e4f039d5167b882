"""The What decides tab's GPU work: direct logit attribution with every head's token effects, and activation
patching from a second image."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr
import torch

from ... import explain
from ...export import Decided, decide_reading
from ...gate import MODEL_GATE
from ...image import ImageError, read_image
from ...session import decode_side
from .boundary import gpu, in_words, loading_seconds, models_of

# direct logit attribution (a traced forward each); patching, both sites of both models in batched forwards of
# PATCH_BATCH patched images (CvT-13 at 224 px, group 1: 6,674 images)
DECIDE_S, PATCH_S, PATCH_BATCH = 15, 120, 64


@gpu(duration=DECIDE_S)
def decide(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None) -> list[Decided]:
    """Each model's (a classifier's) direct logit attribution of its top class on its pixels: a traced forward
    that keeps how the heads write, read through the frozen final norm (`export.decide_reading`: the table
    decide.json holds and every head's token effects, as the exporter writes them)."""
    readings = []
    for model, image in zip(models_of(names, prompts=prompts), pixels):
        with MODEL_GATE():
            readings.append(in_words(decide_reading, model.model, image.to(model.device), model.labels))
    return readings


def patch_seconds(names, pixels, against, upload, group, prompts=None, progress=None) -> int:
    """Patching's GPU time: the batched forwards of both sites of both models, and loading a model not in
    memory."""
    return PATCH_S + loading_seconds(names)


@gpu(duration=patch_seconds)
def patch(names: list[str], pixels: list[torch.Tensor], against: str, upload: str | None, group: int,
          prompts: list[str] | None = None, progress=gr.Progress()) -> list[tuple[explain.Patching, explain.Patching]]:
    """Activation patching of each model (a classifier) from a second image towards its pixels: `against` one
    of `explain.CORRUPTIONS` (the same pixels blurred or with noise) or 'upload' (the file at `upload`, read
    with every check of `read_image` and preprocessed by each model's own transform). Per model the residual
    stream in `group` x `group` squares and every head's output (`explain.patch_activations`, `PATCH_BATCH`
    patched images per forward) -> (resid, head) `Patching`s on the CPU, fp32 (head: None for a model without
    attention)."""
    loaded = models_of(names, lambda f, d: progress(0.1 * f, desc=d), prompts)
    picture = None
    if against == "upload":
        try:
            picture = read_image(upload, target_size=decode_side(loaded))
        except ImageError as e:
            raise gr.Error(f"The second image: {e}") from None
    found, runs = [], [(model, site) for model in loaded for site in explain.SITES]
    for k, (model, site) in enumerate(runs):
        clean = pixels[k // len(explain.SITES)].to(model.device)
        corrupted = model.preprocess(picture) if picture is not None else explain.corrupt(clean, against)
        words = "the residual stream" if site == "resid" else "each head's output"

        def step(done, total, k=k, name=model.name, words=words):
            progress(0.1 + 0.9 * (k + done / total) / len(runs), desc=f"{name}: {words}, forward {done} of {total}")
        with MODEL_GATE():
            try:
                result = explain.patch_activations(model.model, clean, corrupted, site=site, group=group,
                                                   batch_size=PATCH_BATCH, progress=step)
            except explain.NoAttention:   # a convolutional network has no heads to patch
                found.append(None)
                continue
            except ValueError as e:   # what `in_words` says, for the other requests a model cannot answer
                raise gr.Error(str(e)) from None
        cpu = lambda values: [v.float().cpu() for v in values]
        found.append(replace(result, grid=cpu(result.grid), prefix=cpu(result.prefix),
                             heads=None if result.heads is None else result.heads.float().cpu()))
    return list(zip(found[::2], found[1::2]))
