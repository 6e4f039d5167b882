"""The Training tab's GPU work: a photo through every kept checkpoint of each model's training run."""
from __future__ import annotations

import numpy as np
import torch

from ... import training
from ...bundle import load_bundle
from .boundary import DEVICE, gpu

# a forward of one photo per checkpoint, and loading each (a few MB) that is not in memory
OVER_TRAINING_S = 30


@gpu(duration=OVER_TRAINING_S)
def over_training(names: list[str], pixels: list[torch.Tensor]) -> list[dict | None]:
    """Per model (`names[i]`, on `pixels[i]` in its preprocessing, which its checkpoints share): its class
    probabilities at every checkpoint its run kept, with the steps, epochs and labels; None for a model that
    keeps none. The checkpoints are read from their folders, past the model cache, so they do not push the page's
    models out of it."""
    series = []
    for name, image in zip(names, pixels):
        kept = training.bundled_run(name)
        if kept is None:
            series.append(None)
            continue
        probs = []
        for checkpoint in kept:
            model, _, labels, _ = load_bundle(checkpoint.folder)
            with torch.inference_mode():
                probs.append(model.to(DEVICE)(image.to(DEVICE)).float().softmax(dim=-1)[0].cpu().numpy())
        series.append({"model": name.split("@")[0], "steps": [c.step for c in kept],
                       "epochs": [c.epoch for c in kept], "probs": np.stack(probs), "labels": list(labels)})
    return series
