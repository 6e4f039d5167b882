"""Feature pictures (issue 50): a drawing step against a plain traced forward and backward of the same crops, and
one bundled concept's picture with the default settings."""
from __future__ import annotations

import time

import torch

import vitviz
from timing import Timing, ms, report, verdict
from vitviz import looks
from workbench import Bench

STEP_TARGET = 1.3        # at most: drawing's time per step / a traced forward + backward of its crops alone
CONCEPT_SECONDS = 10.0   # at most: one bundled concept's picture, default settings, this CPU
DICTIONARY = "vit-cifar10-last"
PICTURES = 8             # drawn at once in the step measurement


def measure(bench: Bench, items: set[str]) -> None:
    vit_name, _, what = bench.bundled_pair
    vit = vitviz.load(vit_name, device=bench.device)
    bundled = what == "bundled pair"   # the bundled dictionary reads the bundled ViT; stand-ins get its channels
    targets = [looks.Concept(DICTIONARY, c) if bundled else looks.Channel(-1, c) for c in range(PICTURES)]
    steps(bench, vit, targets)
    if bundled:
        one_concept(bench, vit)
    else:
        report("looks one concept: skipped (needs the bundled pair and its bundled dictionary; not with --quick)")


def steps(bench: Bench, vit, targets: list) -> None:
    """`draw` of `PICTURES` targets for a few steps (the defaults' crops and canvas: K copies each) against the same
    number of traced forwards and backwards to the pixels of as many crops (the floor: the models' own work)."""
    settings = looks.Settings(steps=2 if bench.quick else 8)
    crops = torch.rand(len(targets) * settings.copies, 3, *vit.transform.crop, device=bench.device)

    def draw():
        looks.draw(vit, targets, settings=settings, device=bench.device, bar=False)

    def floor():
        for _ in range(settings.steps):
            pixels = crops.clone().requires_grad_(True)
            with bench.amp():
                trace = vit.model.trace(vit.transform.normalize(pixels), grad=True, attention=False)
            torch.autograd.grad(trace.blocks[-1].tokens.float().sum(), [pixels])
    t = bench.time({"draw": draw, "floor": floor})
    per_step = {name: Timing([s / settings.steps for s in t[name].seconds]) for name in t}
    report(f"looks step, {len(targets)} pictures x {settings.copies} crops of {vit.name} ({settings.method.name}, "
           f"{settings.steps} steps a round): draw {per_step['draw']} a step, traced forward + backward of the crops "
           f"{per_step['floor']}, " + verdict(t["draw"].median / t["floor"].median, STEP_TARGET))


def one_concept(bench: Bench, vit) -> None:
    """One bundled concept's picture at the bundled models' input size with the default settings, wall time from
    the call to the arrays (the dictionary loaded and checked each time, as the command does)."""
    settings = looks.Settings()
    times = []
    for _ in range(max(1, bench.repeats // 2)):
        start = time.perf_counter()
        looks.draw(vit, looks.Concept(DICTIONARY, 394), settings=settings, device=bench.device, bar=False)
        times.append(time.perf_counter() - start)
    t = Timing(times)
    report(f"looks one concept ({DICTIONARY} 394 in {vit.name}, {settings.method.name}, {settings.steps} steps x "
           f"{settings.copies} crops, canvas {settings.side([vit.transform.crop])} px): {t}, "
           f"target <= {ms(CONCEPT_SECONDS)} ms {'OK' if t.median <= CONCEPT_SECONDS else 'MISSED'}")
