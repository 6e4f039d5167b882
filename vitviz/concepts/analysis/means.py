"""Each read row's mean code and mean reconstruction error over a data set: the "mean" baseline a circuit sets a
concept or an error node to when it takes it out (Marks et al. 2024 evaluate their circuits by mean ablation).

Over N images, with x_{i,r} the raw activation of read row r (the class token first where the dictionary reads
it, then the grid, as `activations.cache.block_tokens` orders them; a dictionary across models: the cells),
z = encode(x) and ε = x - decode(z):

    mean code   z̄_r = (1/N) Σ_i z_{i,r}      (rows n)      mean error   ε̄_r = (1/N) Σ_i ε_{i,r}      (rows d)

kept per row, not pooled over the rows: a class token's statistics are not a patch's, and a patch at the border
of the photo is not one in its middle. Summed in float64, one batch of images at a time.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor

from ...files import safe_name, write_atomic
from ..kinds.dictionary import ConceptsError, Dictionary

MEANS = "means.safetensors"   # beside a dictionary (an across dictionary's: one per model, `file_name`)


@dataclass(frozen=True)
class Means:
    """The mean code (rows n) and mean reconstruction error (rows d) of each read row over `images` images."""
    codes: Tensor
    error: Tensor
    images: int


def row_means(dictionary: Dictionary, grids: Iterable[Tensor]) -> Means:
    """`Means` of `dictionary` over batches of raw activations (images rows d)."""
    codes_sum = error_sum = None
    images = 0
    with torch.inference_mode():
        for x in grids:
            z = dictionary.encode(x)
            error = x.to(z) - dictionary.decode(z, x)
            batch_codes, batch_error = z.double().sum(0), error.double().sum(0)
            codes_sum = batch_codes if codes_sum is None else codes_sum + batch_codes
            error_sum = batch_error if error_sum is None else error_sum + batch_error
            images += x.shape[0]
    if not images:
        raise ConceptsError("There are no activations to take the mean of.")
    return Means(codes=(codes_sum / images).float(), error=(error_sum / images).float(), images=images)


def file_name(model: str | None = None) -> str:
    """`means.safetensors`, or for one model of a dictionary across models `means-<model>.safetensors`."""
    return MEANS if model is None else f"means-{safe_name(model)}.safetensors"


def save_means(means: Means, path: str | Path) -> Path:
    """`means` written to `path` (safetensors, atomically)."""
    path = Path(path)
    write_atomic(path, save_tensors({"codes": means.codes.contiguous(), "error": means.error.contiguous()},
                                    metadata={"images": str(means.images)}))
    return path


def load_means(path: str | Path, dictionary: Dictionary) -> Means:
    """The means in `path`, refused in words when they are not `dictionary`'s (another width or concept count)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        tensors = load_tensors(raw)
    except (OSError, SafetensorError) as e:
        raise ConceptsError(f"The mean activations {path} cannot be read ({e}); make them again with "
                            f"`vitviz concepts evaluate`.") from None
    codes, error = tensors.get("codes"), tensors.get("error")
    if codes is None or error is None or codes.shape[-1] != dictionary.n_concepts or error.shape[-1] != dictionary.d:
        raise ConceptsError(f"The mean activations {path} are not this dictionary's ({dictionary.n_concepts} "
                            f"concepts over {dictionary.d}-wide activations): make them again with "
                            f"`vitviz concepts evaluate`.")
    header = int.from_bytes(raw[:8], "little")
    images = int(json.loads(raw[8:8 + header]).get("__metadata__", {}).get("images", 0))
    return Means(codes=codes, error=error, images=images)
