"""The Compare tab's GPU work: the logit lens, every block's effective receptive field, and CKA between every
layer of both models over uploaded images."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import numpy as np
import torch

from ... import compare, explain
from ...gate import MODEL_GATE
from ...image import ImageError, read_image
from ...session import decode_side
from .boundary import gpu, in_words, loading_seconds, models_of

# the logit lens (a traced forward each); CKA over up to 256 uploads (decoding them, and a traced forward of each
# model per batch of 64); receptive fields: a traced forward and one backward per block of each model
LENS_S, CKA_S, RECEPTIVE_S = 15, 90, 30


@dataclass(frozen=True)
class Lens:
    """One classifier's logit lens on the picture, as it crosses back (CPU; L: the blocks the lens reads,
    `explain.lens_layers`): the probability of its final class after each block (L, fp32), and each grid
    token's top class and its probability (L gh gw each)."""
    final_class: np.ndarray
    top_class: np.ndarray
    top_prob: np.ndarray


@gpu(duration=LENS_S)
def lens(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None) -> list[Lens]:
    """The logit lens of each model (a classifier) on its pixels: a traced forward, then every lens block through
    the model's own final norm and head (`explain.final_class_probability`, `explain.patch_top_class`)."""
    readings = []
    for model, image in zip(models_of(names, prompts=prompts), pixels):
        with MODEL_GATE(), torch.inference_mode():
            trace = model.model.trace(image.to(model.device), attention=False)   # the lens reads only the tokens
            final = in_words(explain.final_class_probability, model.model, trace)[0]
            tops = [in_words(explain.patch_top_class, model.model, trace, block)
                    for block in explain.lens_layers(trace)]
        readings.append(Lens(final_class=final.float().cpu().numpy(),
                             top_class=torch.cat([top for top, _ in tops]).cpu().numpy(),
                             top_prob=torch.cat([prob for _, prob in tops]).float().cpu().numpy()))
    return readings


@gpu(duration=RECEPTIVE_S)
def receptive(names: list[str], pixels: list[torch.Tensor], prompts: list[str] | None = None
              ) -> list[explain.ReceptiveField]:
    """Every block's effective receptive field of each model on its pixels (`explain.receptive_field`: a traced
    forward, then one backward per block from its centre token), on the CPU, fp32."""
    found = []
    for model, image in zip(models_of(names, prompts=prompts), pixels):
        with MODEL_GATE():
            field = in_words(explain.receptive_field, model.model, image.to(model.device))
        found.append(replace(field, maps=field.maps.float().cpu(), centres=field.centres.float().cpu()))
    return found


def cka_seconds(names, uploads, tokens, progress=None) -> int:
    """CKA's GPU time: decoding the uploads and both models over them, and loading a model not in memory."""
    return CKA_S + loading_seconds(names)


@gpu(duration=cka_seconds)
def cka(names: list[str], uploads: list[str], tokens: str, progress=gr.Progress()) -> compare.CKAResult:
    """Read each uploaded file (every check of `read_image`; a file that fails is named) and compute minibatch
    CKA between every layer of both models over them (`compare.cka_of_images`): float64 matrices."""
    loaded = models_of(names, lambda f, d: progress(0.1 * f, desc=d))
    side = decode_side(loaded)
    images = []
    for k, upload in enumerate(uploads):
        progress(0.1 + 0.2 * k / len(uploads), desc=f"reading image {k + 1} of {len(uploads)}")
        try:
            images.append(read_image(upload, target_size=side))
        except ImageError as e:
            raise gr.Error(f"{Path(upload).name}: {e}") from None
    with MODEL_GATE():
        return in_words(compare.cka_of_images, loaded, images, tokens=tokens,
                        progress=lambda f, d: progress(0.3 + 0.7 * f, desc=d))


