"""Along training (issue 59): a kept checkpoint's load against the bundled model's own, and `vitviz training`'s views
of every kept checkpoint of a run, projected to the issue's 10 checkpoints x 100 images x 2 models."""
from __future__ import annotations

import time

import vitviz
from timing import report, verdict
from workbench import Bench

TARGETS = {"training-load": 1.20, "training-load-s": 0.30, "training-s": 300.0}
RUN = "cvt-cifar10"   # the bundled run timed (the larger of the pair)


def measure(bench: Bench, items: set[str]) -> None:
    """`vitviz.load("<model>@<step>")` (an int8 checkpoint, the model cache emptied first) against
    `vitviz.load("<model>")` (the fp16 bundle), and `training.follow` over the run's checkpoints."""
    from vitviz import training
    from vitviz.hub import clear_cache

    if bench.quick:
        report("training: skipped (times the bundled run's checkpoints; not with --quick)")
        return
    kept = training.bundled_run(RUN)
    if kept is None:
        report(f"training: skipped ({RUN} keeps no training run)")
        return
    step = kept[len(kept) // 2]

    def load(name):
        clear_cache()
        return vitviz.load(name, device=bench.device)

    t = bench.time({"step": lambda: load(step.name), "bundled": lambda: load(RUN)})
    seconds = t["step"].median
    report(f"training checkpoint load, {step.name} (int8): vitviz.load {t['step']}, of {RUN} (fp16) {t['bundled']}, "
           f"{verdict(seconds / t['bundled'].median, TARGETS['training-load'])}; {seconds:.3f} s (target <= "
           f"{TARGETS['training-load-s']} s) {'OK' if seconds <= TARGETS['training-load-s'] else 'MISSED'}")
    images = 100
    start = time.perf_counter()
    training.follow(RUN, limit=images, device=str(bench.device))
    took = time.perf_counter() - start
    projected = took * 10 / len(kept) * 2
    report(f"training views, {RUN}, {len(kept)} checkpoints x {images} CIFAR-10 test images: {took:.1f} s; 10 "
           f"checkpoints x 100 images x 2 models {projected:.0f} s (target <= {TARGETS['training-s']:.0f} s) "
           f"{'OK' if projected <= TARGETS['training-s'] else 'MISSED'}")
