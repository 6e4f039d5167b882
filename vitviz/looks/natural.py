"""What natural photographs look like, in the two numbers MACO holds a picture to (their colour correlation and the
magnitude of their Fourier spectrum), and the two numbers a picture is checked by (whether a pixel stands out, and
the share of its energy on the frequency axes). Measured by `assets/make_spectrum.py` from photographs vitviz may
ship (the app's examples in `assets/`, CC0 and Kodak's free image) and CIFAR-10's training set, shipped as
`natural.safetensors` beside this module with where its numbers came from (its metadata); nothing is downloaded
(Horama fetches its ImageNet spectrum from a bucket at run time).

Colours (Olah et al. 2017, Lucid's `color_correlation_svd_sqrt`). Over every pixel x (RGB in [0, 1]) of the
photos, the covariance Σ = U diag(s) Uᵀ; its square root, scaled so its largest column has norm 1,

    C = U diag(√s) / max_j ‖(U diag(√s))_j‖          so that C Cᵀ = Σ / max(s)

maps decorrelated colours y (independent channels of equal spread) to correlated ones, x = y Cᵀ per pixel. A picture
is drawn in y and shown as x; the spectrum below is measured in y, x C⁻ᵀ, so both speak of the same channels.

Spectrum. Every image (each photo's `CROPS` random square crops, a third of its shorter side to all of it, resized
to `SIZE` px; each CIFAR-10 training image at its 32 px) is decorrelated, and each channel split into its periodic
and smooth parts (Moisan 2011, `periodic`): a photo is not periodic, and the jump from its right edge round to its
left (and bottom to top) would put streaks on the frequency axes of its FFT; the periodic part has none. Each image
is scaled to unit standard deviation, so that every image counts alike and the orthonormal FFT's magnitudes at a
frequency in cycles per pixel estimate the same spectral density whatever the image's side. The magnitudes
|rfft2|, averaged over a source's images, are then averaged over orientation: over the rings of frequencies at
one distance from 0 (in cycles per pixel, rings one frequency step wide), which leaves a profile per channel,
P_c(r), r from 1/SIZE to √2/2. The two sources' profiles (each at its own rings, the CIFAR-10 one interpolated to
the photos') are averaged where both reach, the photos' alone below CIFAR-10's lowest ring (1/32). A canvas of
side S gets, at each of its frequencies, the profile at that frequency's distance in cycles per pixel
(`magnitude(S)`, linear between rings; 0 at the mean, which MACO's standardisation removes anyway). Its overall scale
does not matter: MACO standardises the image it makes. Averaged over orientation, no direction carries more than
another: natural photos carry a little more on the horizontal and vertical ones (their edges' directions), so a
picture's axes carry at most what photos' do (`axis_share`).

Checks. `corner_z`: pixel (0, 0)'s luma (Rec. 601) in standard deviations from the picture's mean; every frequency
adds up in step there when the phase is near 0 everywhere (the spot MACO's standardised phase made). `axis_share`:
the share of the energy of a picture's luma (its periodic part, as above, with its mean removed) at frequencies
with a zero row or column coordinate; photos and pictures are measured alike.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save as save_tensors
from torch import Tensor

FILE = Path(__file__).with_name("natural.safetensors")
SIZE = 128    # px, the side the photos' crops are measured at
CROPS = 64    # crops per photo
SEED = 0
LUMA = np.array([0.299, 0.587, 0.114])   # Rec. 601


def periodic(u: np.ndarray) -> np.ndarray:
    """The periodic part of images u (..., h, w) (Moisan 2011, "Periodic plus smooth image decomposition"): u less
    the smooth image s whose discrete Laplacian is zero inside and, on the border, the jumps u makes from one edge to
    the opposite one; solved in the Fourier domain, ŝ = v̂ / (2 cos 2πq/h + 2 cos 2πr/w - 4), ŝ(0, 0) = 0."""
    h, w = u.shape[-2:]
    v = np.zeros_like(u)
    v[..., 0, :] += u[..., -1, :] - u[..., 0, :]
    v[..., -1, :] += u[..., 0, :] - u[..., -1, :]
    v[..., :, 0] += u[..., :, -1] - u[..., :, 0]
    v[..., :, -1] += u[..., :, 0] - u[..., :, -1]
    denominator = (2 * np.cos(2 * np.pi * np.fft.fftfreq(h))[:, None] + 2 * np.cos(2 * np.pi * np.fft.fftfreq(w))
                   - 4)
    denominator[0, 0] = 1.0   # ŝ(0, 0) = 0 below: v sums to 0, so v̂(0, 0) is 0 too
    smooth = np.fft.fft2(v) / denominator
    smooth[..., 0, 0] = 0
    return u - np.fft.ifft2(smooth).real


def radius(h: int, w: int) -> np.ndarray:
    """h x (w // 2 + 1): each rfft2 frequency's distance from 0, in cycles per pixel."""
    return np.hypot(np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :])


def ring_profile(magnitude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A mean magnitude spectrum (3 n n//2+1) averaged over rings one frequency step wide, the mean left out -> (the
    rings' mean distances in cycles per pixel, R; the profile, 3 R)."""
    n = magnitude.shape[-2]
    r = radius(n, n)
    ring = np.rint(r * n).astype(int)
    rings = np.unique(ring[ring > 0])
    distance = np.array([r[ring == k].mean() for k in rings])
    profile = np.stack([[channel[ring == k].mean() for k in rings] for channel in magnitude])
    return distance, profile


def decorrelated(image: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """RGB images (..., h, w, 3) in [0, 1] -> their decorrelated colours' periodic parts (..., 3, h, w), each image
    scaled to unit standard deviation (the module docstring)."""
    y = np.moveaxis(image @ np.linalg.inv(colour.T), -1, -3)   # x = y Cᵀ
    y = periodic(y - y.mean(axis=(-2, -1), keepdims=True))
    return y / np.maximum(y.std(axis=(-3, -2, -1), keepdims=True), 1e-8)


def mean_magnitude(images: Iterable[np.ndarray], colour: np.ndarray) -> tuple[np.ndarray | None, int]:
    """The mean |rfft2| (orthonormal) of batches of RGB images (b h w 3 in [0, 1], one side per batch), in
    decorrelated colours -> (3 h w//2+1, how many images), or (None, 0) where there are none."""
    total, count = None, 0
    for batch in images:
        summed = np.abs(np.fft.rfft2(decorrelated(batch, colour), norm="ortho")).sum(0)
        total = summed if total is None else total + summed
        count += len(batch)
    return (None if total is None else total / count), count


def measure(photos: Sequence[Image.Image], small: Iterable[np.ndarray] = (), *, size: int = SIZE,
            crops: int = CROPS, seed: int = SEED) -> dict[str, Tensor]:
    """{'colour': C 3 3, 'radius': R, 'profile': 3 R, 'images': [photo crops, small images]} (float32) of `photos`
    and `small` (batches of b h w 3 uint8 images of one side, such as CIFAR-10's), as the module docstring defines
    them; the same photos, small images, size, crops and seed give the same numbers."""
    pixels = [np.asarray(photo.convert("RGB"), dtype=np.float64) / 255 for photo in photos]
    if not pixels:
        raise ValueError("Measure natural statistics from at least one photo.")
    u, s, _ = np.linalg.svd(np.cov(np.concatenate([p.reshape(-1, 3) for p in pixels]), rowvar=False))
    root = u * np.sqrt(s)
    colour = root / np.linalg.norm(root, axis=0).max()
    rng = np.random.default_rng(seed)

    def photo_crops():
        for photo in (p.convert("RGB") for p in photos):
            width, height = photo.size
            batch = []
            for _ in range(crops):
                side = int(rng.integers(min(width, height) // 3, min(width, height) + 1))
                top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
                crop = photo.resize((size, size), Image.LANCZOS, box=(left, top, left + side, top + side))
                batch.append(np.asarray(crop, dtype=np.float64) / 255)
            yield np.stack(batch)
    magnitude, n_crops = mean_magnitude(photo_crops(), colour)
    distance, profile = ring_profile(magnitude)
    small_magnitude, n_small = mean_magnitude((np.asarray(b, dtype=np.float64) / 255 for b in small), colour)
    if n_small:
        small_distance, small_profile = ring_profile(small_magnitude)
        reached = distance >= small_distance[0]
        for c in range(3):
            profile[c, reached] = (profile[c, reached]
                                   + np.interp(distance[reached], small_distance, small_profile[c])) / 2
    return {"colour": torch.from_numpy(colour).float(), "radius": torch.from_numpy(distance).float(),
            "profile": torch.from_numpy(profile).float(), "images": torch.tensor([n_crops, n_small])}


def save(statistics: dict[str, Tensor], provenance: dict[str, str], path: Path = FILE) -> None:
    """`measure`'s numbers as the safetensors file this module reads, `provenance` (what they were measured from, in
    words) as its metadata."""
    from ..files import write_atomic

    write_atomic(path, save_tensors({name: t.contiguous() for name, t in statistics.items()}, provenance))


@functools.cache
def shipped() -> dict[str, Tensor]:
    """The shipped statistics ('colour' 3 3, 'radius' R, 'profile' 3 R, 'images' 2), read once."""
    return load_file(FILE)


def provenance() -> dict[str, str]:
    """Where the shipped statistics came from: the photos, the CIFAR-10 file, the method (the file's metadata)."""
    with safe_open(FILE, framework="pt") as f:
        return dict(f.metadata() or {})


def colour_matrix() -> Tensor:
    """C (3 3): decorrelated colours y -> the photos' colours, x = y Cᵀ."""
    return shipped()["colour"]


def magnitude(side: int) -> Tensor:
    """3 x side x (side // 2 + 1): the profile at the distance of each frequency of a canvas of `side` px (cycles per
    pixel), 0 at the mean."""
    distance, profile = shipped()["radius"].double().numpy(), shipped()["profile"].double().numpy()
    r = radius(side, side)
    out = np.stack([np.interp(r, distance, channel) for channel in profile])
    out[:, 0, 0] = 0
    return torch.from_numpy(out).float()


def luma(images: np.ndarray) -> np.ndarray:
    """Rec. 601 luma (..., h, w) of RGB images (..., h, w, 3), uint8 or floats in [0, 1], as floats in [0, 1]."""
    images = np.asarray(images)
    scale = 255.0 if images.dtype == np.uint8 else 1.0
    return images.astype(np.float64) @ LUMA / scale


def corner_z(images: np.ndarray) -> np.ndarray:
    """(...): pixel (0, 0)'s luma in standard deviations from its picture's mean (signed), of images (..., h, w, 3)."""
    y = luma(images)
    return (y[..., 0, 0] - y.mean(axis=(-2, -1))) / np.maximum(y.std(axis=(-2, -1)), 1e-8)


def axis_share(images: np.ndarray) -> np.ndarray:
    """(...): the share of each image's luma energy (its periodic part, the mean removed) on the frequency axes."""
    y = periodic(luma(images))
    power = np.abs(np.fft.fft2(y - y.mean(axis=(-2, -1), keepdims=True))) ** 2
    power[..., 0, 0] = 0
    on_axes = power[..., 0, :].sum(-1) + power[..., 1:, 0].sum(-1)
    return on_axes / np.maximum(power.sum(axis=(-2, -1)), 1e-30)
