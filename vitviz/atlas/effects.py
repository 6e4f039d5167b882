"""What each concept does to each class: its node effect on the class's logit, averaged over the class's images.

Where no class circuit was built for a dictionary (the bundled ones exist for the pair's per-block dictionaries,
`checkpoints/circuits/`), the atlas measures the effect itself, as a class circuit's nodes are measured
(`circuits.classes`): the dictionary spliced in at its block (`circuits.sites`), the metric m the class's logit
minus the mean logit, and each concept's attribution-patching effect (`circuits.effects.attribution`)

    e_c(x) = sum over the concept's rows r of  dm/dz_{r,c} · z_{r,c}          (the zero baseline)

on every image x of the class among the `limit` images spread over the data set (`data.spread`). Per class k with
N_k images, the mean and its 95 % interval by the normal approximation,

    mean_kc = (1/N_k) sum_x e_c(x),     half_kc = 1.96 · s_kc / sqrt(N_k)

(s the sample standard deviation; 0 for a class with one image). One forward and one backward per image and
model, on the CPU a few hundredths of a second each for the bundled CIFAR-10 models.

The result is kept in the site as `class-effects.json` beside the dictionary's pages, with what it was measured on
(the dictionary's weights, the data, the images), so a second build reads it instead of measuring again.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..circuits.effects import Metric, attribution
from ..circuits.sites import image_sites, sites_of
from ..concepts.kinds.dictionary import ConceptsError
from ..data import Dataset
from ..files import write_atomic

FILE = "class-effects.json"
Z95 = 1.959964   # the normal distribution's 97.5 % quantile: a two-sided 95 % interval
DIGITS = 5       # significant digits kept in the file


@dataclass(frozen=True)
class ClassEffects:
    """One model's concept effects per class: `mean` and `half` (the 95 % interval's half width) are k n lists
    (class, concept), `images` how many of each class's images they average."""
    model: str
    classes: list[str]
    images: list[int]
    mean: list[list[float]]
    half: list[list[float]]

    @cached_property
    def silent(self) -> bool:
        """Whether every effect is exactly 0: what the dictionary reads of the block does not reach the logit (the
        patch cells of a model that classifies from its class token, after its last block)."""
        return not any(v for row in self.mean + self.half for v in row)

    def of(self, concept: int) -> list[tuple[str, int, float, float]]:
        """(class, images, mean, half width) of `concept` for every class with images."""
        return [(name, count, self.mean[k][concept], self.half[k][concept])
                for k, (name, count) in enumerate(zip(self.classes, self.images)) if count]


def measured_on(dictionary_sha256: str, data: Dataset, indices: Sequence[int]) -> dict:
    """What a measurement depends on: the dictionary's weights, the data set and which of its images."""
    return {"dictionary_sha256": dictionary_sha256, "data": str(data.name), "images": len(data),
            "indices": [int(i) for i in indices]}


def class_effects(source: str, dictionary, data: Dataset, *, models: Sequence[str], indices: Sequence[int],
                  progress: bool = True) -> list[ClassEffects]:
    """Each of `models`' concept effects per class of `data` (the module docstring) over the images `indices`, with
    `dictionary` (loaded from `source`: one model's, or across models) spliced in. Refused in words: data without
    labels, a model that cannot be loaded, a dictionary that does not fit it."""
    from .. import hub

    if data.labels is None or data.classes is None:
        raise ConceptsError(f"{data.name} has no labels: a class's effects average over the class's images.")
    return [_one_model(hub.load(model), source, dictionary, data, indices, progress) for model in models]


def _one_model(loaded, source: str, dictionary, data: Dataset, indices: Sequence[int],
               progress: bool) -> ClassEffects:
    """`class_effects` of one loaded model."""
    positions = {name: i for i, name in enumerate(loaded.labels or ())}
    classes = [name for name in data.classes if name in positions]
    if not classes:
        raise ConceptsError(f"None of {data.name}'s classes is one of {loaded.name}'s labels: its effects on them "
                            f"cannot be measured.")
    row = {name: k for k, name in enumerate(classes)}
    n = dictionary.n_concepts
    sums, squares = np.zeros((len(classes), n)), np.zeros((len(classes), n))
    counts = np.zeros(len(classes), dtype=np.int64)
    built: dict[tuple[int, int], list] = {}   # a model's site depends on the image's size alone
    mine = [i for i in indices if data.classes[data.labels[i]] in row]
    for i in tqdm(mine, desc=f"{loaded.name}: effects on the classes", unit="image", disable=not progress):
        name, image = data.classes[data.labels[i]], data.image(i)
        size = (image.height, image.width)
        if size not in built:   # placed from a trace of the first image of each size: one forward, not one an image
            built[size] = image_sites(loaded, image, lambda trace, image: sites_of(
                loaded, trace, [(source, dictionary)], image_size=(image.height, image.width)))[2]
        pixels, sites = loaded.preprocess(image).to(loaded.device), built[size]
        _, states = attribution(loaded, pixels, sites, Metric(positions[name], centred=True))
        effects = states[0].effects.double().cpu().numpy()
        k = row[name]
        sums[k] += effects
        squares[k] += effects ** 2
        counts[k] += 1
    mean = sums / np.maximum(counts, 1)[:, None]
    deviation = np.sqrt(np.maximum(squares - counts[:, None] * mean ** 2, 0) / np.maximum(counts - 1, 1)[:, None])
    half = Z95 * deviation / np.sqrt(np.maximum(counts, 1))[:, None]
    return ClassEffects(model=loaded.name, classes=classes, images=counts.tolist(), mean=_rounded(mean),
                        half=_rounded(half))


def saved(folder: Path, inputs: dict) -> list[ClassEffects] | None:
    """The effects kept in `folder` if they were measured on `inputs`, else None."""
    path = folder / FILE
    try:
        kept = json.loads(path.read_text())
        if kept.get("measured_on") != inputs:
            return None
        return [ClassEffects(**model) for model in kept["models"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save(folder: Path, effects: list[ClassEffects], inputs: dict) -> Path:
    """`effects` with what they were measured on, as `class-effects.json` in `folder`, atomically."""
    data = {"what": "each concept's attribution-patching effect on each class's logit minus the mean logit, "
                    "averaged over the class's images, with the half width of its 95 % interval (normal "
                    "approximation)", "measured_on": inputs, "models": [asdict(e) for e in effects]}
    write_atomic(folder / FILE, json.dumps(data).encode())
    return folder / FILE


def _rounded(values: np.ndarray) -> list[list[float]]:
    return [[float(f"{v:.{DIGITS}g}") if math.isfinite(v) else 0.0 for v in row] for row in values.tolist()]



def silence(models: Sequence[str]) -> str:
    """The sentence for models whose every effect is 0."""
    return (f"Every concept's effect on every class is 0 in {', '.join(models)}: what this dictionary reads of "
            f"the block does not reach the logit (after the last block, a model that classifies from its class "
            f"token reads nothing of the patch cells).")
