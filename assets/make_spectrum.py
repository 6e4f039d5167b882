"""Measure the natural-image statistics MACO's feature pictures are held to, from the photographs here.

    python assets/make_spectrum.py     # writes vitviz/looks/natural.safetensors (about 100 KB)

The colour correlation and the mean magnitude spectrum of 64 random crops of each photo listed in README.md, at
128 px (`vitviz.looks.natural` defines both). Every photo is CC0, or Kodak's kodim20, released for unrestricted use
(README.md), so the numbers measured from them ship with vitviz; the feature pictures never download a spectrum.
"""
from pathlib import Path

from PIL import Image

from vitviz.looks import natural

HERE = Path(__file__).resolve().parent
PHOTOS = ("airplane_kodim20.jpg", "automobile_audi.jpg", "bird_kingfisher.jpg", "cat_chelsea.jpg", "coffee.jpg",
          "dog_terrier_puppy.jpg", "horse.jpg", "ship_container.jpg")


def photos() -> list[Image.Image]:
    """The photographs the statistics are measured from, in a fixed order."""
    return [Image.open(HERE / name).convert("RGB") for name in PHOTOS]


def main() -> None:
    statistics = natural.measure(photos())
    natural.save(statistics)
    print(f"{natural.FILE}: colour 3x3, magnitude {tuple(statistics['magnitude'].shape)} from {len(PHOTOS)} photos")


if __name__ == "__main__":
    main()
