"""How far two models' maps of one image agree: the rank correlation of their token maps over the image region both
saw (the first screen's comparison line, the video's per-frame agreement and its steadiness)."""
from __future__ import annotations

import numpy as np

from . import render


def agreement(a: render.Canvas, b: render.Canvas, map_a: np.ndarray, map_b: np.ndarray, *,
              cells: int = 32) -> float | None:
    """Spearman rank correlation of two models' token maps (each on its model's canvas of the same image) over
    the image region both models saw, after resampling each onto the same `cells`-wide lattice of the original
    image (their grids differ)."""
    seen = a.seen(a.field(grid=map_a.shape)) & b.seen(b.field(grid=map_b.shape))
    if a.size != b.size or seen.sum() < 4:
        return None
    h, w = a.size
    step = max(1, max(h, w) // cells)
    ys, xs = np.mgrid[step // 2:h:step, step // 2:w:step]
    keep = seen[ys, xs]
    va = a.sample(map_a, a.field(grid=map_a.shape), at=(ys, xs))[keep]
    vb = b.sample(map_b, b.field(grid=map_b.shape), at=(ys, xs))[keep]
    return spearman(va, vb)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation of two equal-length samples (ties share their mean rank); None where one of
    them is constant, so has no ranking."""
    def ranks(v):   # average ranks for ties
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
        sums = np.bincount(inverse, weights=r)
        return (sums / counts)[inverse]
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
