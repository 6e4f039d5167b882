"""Measure the natural-image statistics MACO's feature pictures are held to, from the photographs here and CIFAR-10's
training set.

    OMP_NUM_THREADS=1 python assets/make_spectrum.py     # writes vitviz/looks/natural.safetensors (a few KB), ~2 min

The colour correlation of the photos listed in README.md, and the magnitude profile over orientation of 64 random
crops of each at 128 px and of CIFAR-10's 50,000 training images (their periodic parts; `vitviz.looks.natural`
defines both). Every photo is CC0, or Kodak's kodim20, released for unrestricted use (README.md); CIFAR-10 is read
from `cifar10_jpeg.npz` (`vitviz.data.open_data("cifar10", split="train")`), and the file records its SHA-256. The
numbers, a few hundred floats, ship with vitviz; the feature pictures never download a spectrum.
"""
import hashlib
from pathlib import Path

import numpy as np
from PIL import Image

from vitviz.data import cifar10_file, open_data
from vitviz.looks import natural

HERE = Path(__file__).resolve().parent
PHOTOS = ("airplane_kodim20.jpg", "automobile_audi.jpg", "bird_kingfisher.jpg", "cat_chelsea.jpg", "coffee.jpg",
          "dog_terrier_puppy.jpg", "horse.jpg", "ship_container.jpg")
BATCH = 1000   # CIFAR-10 images decoded and measured at once


def photos() -> list[Image.Image]:
    """The photographs the statistics are measured from, in a fixed order."""
    return [Image.open(HERE / name).convert("RGB") for name in PHOTOS]


def cifar10_batches(limit: int | None = None):
    """CIFAR-10's training images (the first `limit`), `BATCH` at a time, as b 32 32 3 uint8."""
    data = open_data("cifar10", split="train")
    n = len(data) if limit is None else min(limit, len(data))
    for first in range(0, n, BATCH):
        yield np.stack([np.asarray(data.image(i)) for i in range(first, min(first + BATCH, n))])


def main() -> None:
    statistics = natural.measure(photos(), cifar10_batches())
    crops, small = (int(v) for v in statistics["images"])
    source = cifar10_file()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    provenance = {
        "made_by": "assets/make_spectrum.py",
        "photos": ", ".join(PHOTOS),
        "photo_crops": f"{crops} ({natural.CROPS} a photo at {natural.SIZE} px, seed {natural.SEED})",
        "cifar10": f"{small} training images of {source.name}, sha256 {digest}",
        "method": "periodic part of each image (Moisan 2011), unit standard deviation, mean |rfft2| (orthonormal) "
                  "averaged over rings of one frequency step; the two sources' profiles averaged",
    }
    natural.save(statistics, provenance)
    print(f"{natural.FILE}: colour 3x3, profile {tuple(statistics['profile'].shape)} from {crops} crops of "
          f"{len(PHOTOS)} photos and {small} CIFAR-10 training images")


if __name__ == "__main__":
    main()
