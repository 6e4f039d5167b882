"""Batch explain: `python -m vitviz explain` on the bundled pair, in images per second (issue 15)."""
from __future__ import annotations

import contextlib
import io
import time

from timing import report
from workbench import Bench, photos

IMAGES_S = 10   # --formats npy, and png npy, bundled pair: images per second (at least)


def measure(bench: Bench, items: set[str]) -> None:
    """`python -m vitviz explain` on the bundled pair (rollout, the command's defaults), in process: images
    per second writing maps as .npy only and writing every PNG too (both without the deletion/insertion curves,
    which are forwards of their own), and .npy with the default curves. Wall clock whatever --clock says (the
    drawing and encoding run on a thread pool, whose gain a CPU clock would not show); one sample each."""
    from vitviz import cli

    vit, cvt, what = bench.bundled_pair
    folder = bench.folder("explain-photos")
    count, size = (8, (320, 240)) if bench.quick else (48, (640, 480))
    for i, photo in enumerate(photos(count, size)):
        photo.save(folder / f"photo-{i:02d}.jpg", quality=90)
    rates = {}
    for name, options in {"npy": ["--formats", "npy", "--faithfulness-steps", "0"],
                          "png": ["--formats", "png", "npy", "--faithfulness-steps", "0"],
                          "npy+auc": ["--formats", "npy"]}.items():
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["explain", str(folder), "--models", vit, cvt, "--device", str(bench.device),
                      "--out", str(bench.folder(f"explain-{name}")), *options])
        rates[name] = count / (time.perf_counter() - start)
    met = {k: "OK" if rates[k] >= IMAGES_S else "MISSED" for k in ("npy", "png")}
    report(f"batch explain {count} photos {size[0]}x{size[1]}, {what}, wall clock: --formats npy {rates['npy']:.1f} "
           f"images/s (target >= {IMAGES_S}) {met['npy']}; --formats png npy {rates['png']:.1f} images/s "
           f"(target >= {IMAGES_S}) {met['png']}, npy alone {rates['npy'] / rates['png']:.1f}x faster; with "
           f"the default --faithfulness-steps 8 {rates['npy+auc']:.1f} images/s")
