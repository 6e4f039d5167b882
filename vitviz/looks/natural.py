"""What natural photographs look like, in the two numbers MACO holds a picture to: their colour correlation and the
magnitude of their Fourier spectrum. Measured from photographs vitviz may ship (the app's examples in `assets/`,
CC0 and Kodak's free image) by `assets/make_spectrum.py`, shipped as `natural.safetensors` beside this module;
nothing is downloaded (Horama fetches its ImageNet spectrum from a bucket at run time).

Colours (Olah et al. 2017, Lucid's `color_correlation_svd_sqrt`). Over every pixel x (RGB in [0, 1]) of the
photos, the covariance Σ = U diag(s) Uᵀ; its square root, scaled so its largest column has norm 1,

    C = U diag(√s) / max_j ‖(U diag(√s))_j‖

maps decorrelated colours y (independent channels of equal spread) to correlated ones, x = y Cᵀ per pixel. A picture
is drawn in y and shown as x; the spectrum below is measured in y, x C⁻ᵀ, so both speak of the same channels.

Spectrum. Each photo is cut into `CROPS` square crops of random side (a third of its shorter side to all of it) at
random places, each resized to `SIZE` px (antialiased), decorrelated and centred per channel; the template is the
mean magnitude of their orthonormal 2-D real FFTs,

    M[c, u, v] = mean over crops |rfft2(y_c)|[u, v]          3 x SIZE x (SIZE // 2 + 1)

(rows u in `torch.fft.fftfreq` order, columns v the non-negative frequencies). Its overall scale does not matter:
MACO standardises the image it makes. For a canvas of another side S, `magnitude(S)` samples the template at the
canvas's own frequencies in cycles per pixel (bilinearly, between the template's), so a canvas keeps the photos'
fall-off per pixel, as a crop of them would.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save as save_tensors
from torch import Tensor

FILE = Path(__file__).with_name("natural.safetensors")
SIZE = 128    # px, the side the template is measured at
CROPS = 64    # crops per photo
SEED = 0


def measure(photos: Sequence[Image.Image], *, size: int = SIZE, crops: int = CROPS, seed: int = SEED
            ) -> dict[str, Tensor]:
    """{'colour': C 3 3, 'magnitude': M 3 size size//2+1} (float32) of `photos`, as the module docstring defines
    them; the same photos, size, crops and seed give the same numbers."""
    pixels = [np.asarray(photo.convert("RGB"), dtype=np.float64) / 255 for photo in photos]
    flat = np.concatenate([p.reshape(-1, 3) for p in pixels])
    u, s, _ = np.linalg.svd(np.cov(flat, rowvar=False))
    root = u * np.sqrt(s)
    colour = root / np.linalg.norm(root, axis=0).max()
    rng = np.random.default_rng(seed)
    total, count = np.zeros((3, size, size // 2 + 1)), 0
    for photo in photos:
        width, height = photo.size
        for _ in range(crops):
            side = int(rng.integers(min(width, height) // 3, min(width, height) + 1))
            top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
            crop = photo.convert("RGB").resize((size, size), Image.LANCZOS, box=(left, top, left + side, top + side))
            y = (np.asarray(crop, dtype=np.float64) / 255) @ np.linalg.inv(colour.T)   # x = y Cᵀ
            y = np.moveaxis(y - y.mean(axis=(0, 1)), -1, 0)
            total += np.abs(np.fft.rfft2(y, norm="ortho"))
            count += 1
    return {"colour": torch.from_numpy(colour).float(), "magnitude": torch.from_numpy(total / count).float()}


def save(statistics: dict[str, Tensor], path: Path = FILE) -> None:
    """`measure`'s numbers as the safetensors file this module reads."""
    from ..files import write_atomic

    write_atomic(path, save_tensors({name: t.contiguous() for name, t in statistics.items()}))


@functools.cache
def shipped() -> dict[str, Tensor]:
    """The shipped statistics ('colour' 3 3, 'magnitude' 3 SIZE SIZE//2+1), read once."""
    return load_file(FILE)


def colour_matrix() -> Tensor:
    """C (3 3): decorrelated colours y -> the photos' colours, x = y Cᵀ."""
    return shipped()["colour"]


def magnitude(side: int) -> Tensor:
    """3 x side x (side // 2 + 1): the template at a canvas of `side` px's frequencies (cycles per pixel)."""
    template = shipped()["magnitude"]
    n = template.shape[-2]
    if side == n:
        return template.clone()
    rows = torch.fft.fftshift(template, dim=-2)   # rows from -n/2 to n/2 - 1 cycles per n px, in order
    # the canvas's frequencies in cycles per pixel, as grid_sample's coordinates over the template's (align_corners)
    fu = torch.fft.fftfreq(side, dtype=torch.float64)
    fv = torch.fft.rfftfreq(side, dtype=torch.float64)
    lo_u, hi_u = -0.5, (n // 2 - 1) / n
    gu = (fu - lo_u) / (hi_u - lo_u) * 2 - 1
    gv = fv / 0.5 * 2 - 1
    grid = torch.stack(torch.broadcast_tensors(gv[None, :], gu[:, None]), dim=-1).float()   # x: columns, y: rows
    sampled = F.grid_sample(rows[None], grid[None], mode="bilinear", padding_mode="border", align_corners=True)
    return sampled[0]
