"""`python checkpoints/concepts/looks_figure.py`: what the shipped feature pictures show, drawn for the docs
(docs/images/looks.png and docs/images/looks-across.png).

For each dictionary with pictures among the bundled pair's (vit-cifar10-last, cvt-cifar10-last): its `ROWS`
concepts that fire most often on the test images (the exemplar index's frequency), each a row of its picture
(`looks.pictures_of`, nearest-neighbour enlarged) and its top test images with where it fires. For the dictionary
across the four models (`ACROSS`): the `ACROSS_ROWS` concepts that fire most often summed over the four models'
indexes, each a row of its shared picture (drawn in the four at once) and each model's own.
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
OUT_ACROSS = ROOT / "docs" / "images" / "looks-across.png"
DICTIONARIES = ("vit-cifar10-last", "cvt-cifar10-last")
ACROSS, ACROSS_ROWS = "across-cifar10", 4
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
    return np.concatenate([caption(f"{name} concept {concept}: its picture, its top test images", body.shape[1]),
                           body])


def caption(text: str, width: int) -> np.ndarray:
    ink = Ink.for_size((SIDE, SIDE))
    band = np.empty((ink.line_height(1.4) + 4, width, 3), np.uint8)
    band[:] = STRIP
    put_text(band, text, (4, band.shape[0] - 4), ink)
    return band


def across_row(concept: int, pictures) -> np.ndarray:
    """One concept across the models: its shared picture, then each model's own, under a caption."""
    shown = [pictures.picture(concept, model)[0] for model in (None, *pictures.models)]
    body = tile([np.asarray(Image.fromarray(p).resize((SIDE, SIDE), Image.NEAREST)) for p in shown],
                cols=len(shown), gap=2)
    return np.concatenate([caption(f"concept {concept}", body.shape[1]), body])


def across_header(models: tuple[str, ...], width: int) -> np.ndarray:
    """The columns' names: the shared picture's, then each model's."""
    band = caption("", width)
    ink = Ink.for_size((SIDE, SIDE))
    for k, name in enumerate(("shared", *(m.split("-")[0] for m in models))):
        put_text(band, name, (4 + k * (SIDE + 2), band.shape[0] - 4), ink)
    return band


def write(rows: list[np.ndarray], out: Path) -> None:
    width = max(r.shape[1] for r in rows)
    padded = [np.pad(r, ((0, 6), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    Image.fromarray(np.concatenate(padded)).save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")


def main() -> None:
    rows = []
    for name in DICTIONARIES:
        pictures = pictures_of(name)
        if pictures is None:
            continue
        index = index_in(name)
        frequent = np.argsort(-index.frequency.numpy(), kind="stable")[:ROWS]
        rows += [row(name, int(c), pictures, index) for c in frequent]
    write(rows, OUT)
    pictures = pictures_of(ACROSS)
    if pictures is not None:
        frequency = sum(index_in(ACROSS, model=model).frequency.numpy() for model in pictures.models)
        rows = [across_row(int(c), pictures) for c in np.argsort(-frequency, kind="stable")[:ACROSS_ROWS]]
        write([across_header(pictures.models, rows[0].shape[1]), *rows], OUT_ACROSS)


if __name__ == "__main__":
    main()
