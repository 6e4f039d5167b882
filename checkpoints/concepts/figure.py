"""`python checkpoints/concepts/figure.py`: what the bundled dictionary across the four CIFAR-10 models finds, drawn
for the README (across-cifar10/shared.jpg and across-cifar10/own.jpg).

From across-cifar10/metrics.json (`concepts evaluate`): the shared concepts with the highest firing entropy,
each a row of its top test images in every model (with that model's map), and each family's own concept that
fires most often, a row of its top images in that model. The images and maps are the exemplar indexes'.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from vitviz.concepts import load
from vitviz.concepts.analysis.exemplars import file_name, load_exemplars
from vitviz.render.captions import STRIP, Ink, put_text, tile
from vitviz.render.concepts import exemplar_tile

FOLDER = Path(__file__).resolve().parent / "across-cifar10"
SIDE, PER_MODEL, SHARED_ROWS = 72, 3, 4
WHOLE = (0.0, 0.0, 1.0, 1.0)   # the bundled models all read the whole 32 px image: the cells tile it


def tiles(index, concept: int, count: int) -> list[np.ndarray]:
    """A concept's top `count` images in one model's index, each with that model's map, on the strongest's scale."""
    shown = index.of(concept)[:count]
    return [exemplar_tile(np.asarray(e.image), e.map, WHOLE, vmax=shown[0].value, side=SIDE, label=e.label or "")
            for e in shown]


def labelled(row: np.ndarray, texts: list[tuple[int, str]]) -> np.ndarray:
    """`row` with each (x, text) of `texts` in a band above it."""
    ink = Ink.for_size((SIDE, SIDE))
    band = np.empty((ink.line_height(1.4) + 4, row.shape[1], 3), np.uint8)
    band[:] = STRIP
    for x, text in texts:
        put_text(band, text, (x + 2, band.shape[0] - 4), ink)
    return np.concatenate([band, row])


def main() -> None:
    metrics = json.loads((FOLDER / "metrics.json").read_text())
    across = load(FOLDER)
    indexes = {model: load_exemplars(FOLDER / file_name(i, model), dictionary=across.dictionary(model))
               for i, model in enumerate(across.models)}
    firing = np.asarray([[indexes[m].frequency[c] for c in range(across.n_concepts)] for m in across.models])
    shares = firing / firing.sum(0, keepdims=True)
    entropy = -(np.where(shares > 0, shares * np.log(np.where(shares > 0, shares, 1)), 0)).sum(0) / np.log(4)
    shared = sorted(metrics["shared_concepts"], key=lambda c: -entropy[c])[:SHARED_ROWS]
    rows = []
    for concept in shared:
        parts = [tile(tiles(indexes[m], concept, PER_MODEL), cols=PER_MODEL, gap=2) for m in across.models]
        gap = np.full((parts[0].shape[0], 8, 3), 255, np.uint8)
        row = np.concatenate([x for part in parts for x in (part, gap)][:-1], axis=1)
        starts = np.cumsum([0] + [part.shape[1] + gap.shape[1] for part in parts[:-1]])
        rows.append(labelled(row, [(int(x), f"concept {concept} in {model}" if i == 0 else model)
                                   for i, (x, model) in enumerate(zip(starts, across.models))]))
    write(rows, FOLDER / "shared.jpg")
    rows = []
    for model, ids in metrics["specific_concepts"].items():
        concept = max(ids, key=lambda c: float(indexes[model].frequency[c]))
        rows.append(labelled(tile(tiles(indexes[model], concept, 5), cols=5, gap=2),
                             [(0, f"concept {concept}: {model}'s alone")]))
    write(rows, FOLDER / "own.jpg")


def write(rows: list[np.ndarray], path: Path) -> None:
    width = max(r.shape[1] for r in rows)
    padded = [np.pad(r, ((0, 6), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    Image.fromarray(np.concatenate(padded)).save(path, quality=90)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
