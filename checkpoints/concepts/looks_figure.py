"""`python checkpoints/concepts/looks_figure.py`: what the shipped feature pictures show, drawn for the docs
(docs/images/looks.png).

For each dictionary with pictures among the bundled pair's (vit-cifar10-last, cvt-cifar10-last): its `ROWS`
concepts that fire most often on the test images (the exemplar index's frequency), each a row of its picture
(`looks.pictures_of`, nearest-neighbour enlarged) and its top test images with where it fires.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vitviz.concepts.analysis.exemplars import index_in
from vitviz.looks import pictures_of
from vitviz.render.captions import STRIP, Ink, put_text, tile
from vitviz.render.concepts import exemplar_tile

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "images" / "looks.png"
DICTIONARIES = ("vit-cifar10-last", "cvt-cifar10-last")
SIDE, ROWS, TOP = 72, 3, 3
WHOLE = (0.0, 0.0, 1.0, 1.0)   # the bundled models read the whole 32 px image


def row(name: str, concept: int, pictures, index) -> np.ndarray:
    """One concept: its picture, then its top images with their maps, under a caption."""
    image, _ = pictures.picture(concept)
    picture = np.asarray(Image.fromarray(image).resize((SIDE, SIDE), Image.NEAREST))
    shown = index.of(concept)[:TOP]
    exemplars = [exemplar_tile(np.asarray(e.image), e.map, WHOLE, vmax=shown[0].value, side=SIDE, label=e.label or "")
                 for e in shown]
    body = tile([picture, *exemplars], cols=1 + TOP, gap=2)
    ink = Ink.for_size((SIDE, SIDE))
    band = np.empty((ink.line_height(1.4) + 4, body.shape[1], 3), np.uint8)
    band[:] = STRIP
    put_text(band, f"{name} concept {concept}: its picture, its top test images", (4, band.shape[0] - 4), ink)
    return np.concatenate([band, body])


def main() -> None:
    rows = []
    for name in DICTIONARIES:
        pictures = pictures_of(name)
        if pictures is None:
            continue
        index = index_in(name)
        frequent = np.argsort(-index.frequency.numpy(), kind="stable")[:ROWS]
        rows += [row(name, int(c), pictures, index) for c in frequent]
    width = max(r.shape[1] for r in rows)
    padded = [np.pad(r, ((0, 6), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    Image.fromarray(np.concatenate(padded)).save(OUT, optimize=True)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
