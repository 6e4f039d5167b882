"""The first screen's and the Video tab's GPU work: the maps a targeted method needs (a forward and a backward
each), the deletion and insertion curves, the models' cards and a video's frames in chunks."""
from __future__ import annotations

import numpy as np
import torch

from ... import explain, hub
from ...session import MapRequest, class_map, faithfulness_scores
from .boundary import gpu, in_words, loading_seconds, models_of

# the first screen: a forward and a backward per map; faithfulness: 4 x (steps + 1) forwards
MAPS_S, FAITHFULNESS_S = 15, 30
# the Video tab: the models' cards; a chunk of frames (a traced forward of each model per chunk, and a forward and a
# backward per frame for each targeted method)
CARDS_S, VIDEO_CHUNK_S, VIDEO_FRAME_S = 15, 10, 1.0


@gpu(duration=MAPS_S)
def class_maps(names: list[str], pixels: list[torch.Tensor], requests: list[list[MapRequest]],
               prompts: list[str] | None = None) -> list[np.ndarray]:
    """The maps each model is asked for (`requests[i]` of model `names[i]` on `pixels[i]`; a forward and a
    backward each; CLIP over `prompts`) -> per model one array, len(requests[i]) gh gw float32."""
    stacked = []
    for model, image, asked in zip(models_of(names, prompts=prompts), pixels, requests):
        image = image.to(model.device)
        maps = [in_words(class_map, model.model, image, request) for request in asked]
        stacked.append(np.stack(maps) if maps else np.zeros((0, 0, 0), np.float32))
    return stacked


@gpu(duration=FAITHFULNESS_S)
def faithfulness(names: list[str], pixels: list[torch.Tensor], maps: list[np.ndarray], targets: list[int],
                 steps: int, prompts: list[str] | None = None) -> list[dict]:
    """Deletion and insertion curves of each model's map (and of a random order) for class `targets[i]`,
    their AUCs: plain lists and floats (`session.faithfulness_scores`; CLIP over `prompts`)."""
    curves = []
    for model, image, values, target in zip(models_of(names, prompts=prompts), pixels, maps, targets):
        curves += in_words(faithfulness_scores, model.model, image.to(model.device), [values], [target], steps=steps)
    return curves


@gpu(duration=CARDS_S)
def cards(names: list[str], prompts: list[str] | None = None) -> list[hub.LoadedModel]:
    """The models' cards (names, labels, preprocessing; no weights): what the Video tab needs before its first
    frames, to decode them no larger than the models need and to draw them."""
    return [model.card() for model in models_of(names, prompts=prompts)]


def video_seconds(names, pixels, methods, prompts=None) -> int:
    """A chunk's GPU time: a traced forward of each model, a backward per frame of each targeted method."""
    targeted = sum(explain.method(m).targeted for m in methods)
    return int(VIDEO_CHUNK_S + VIDEO_FRAME_S * len(pixels[0]) * (1 + targeted)) + loading_seconds(names)


@gpu(duration=video_seconds)
def video_frames(names: list[str], pixels: list[torch.Tensor], methods: list[str],
                 prompts: list[str] | None = None) -> list:
    """One chunk of a video's frames through each model (`pixels[i]`: b 3 h w, model `names[i]`'s preprocessing):
    per model a `video.BatchReading` (each frame's top 5 and maps, plain arrays)."""
    from ...video import read_batch

    return [in_words(read_batch, model, image, methods)
            for model, image in zip(models_of(names, prompts=prompts), pixels)]


