"""The concept atlas (issue 58): the class effects it measures against the traced forwards and backwards they
need, and the whole site of the dictionary across the four bundled models over 500 test images against its target
(15 minutes on this CPU)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

import vitviz
from timing import Timing, ms, report, verdict
from vitviz import concepts
from workbench import Bench

DICTIONARY = "across-cifar10"
EFFECTS_TARGET = 1.5      # at most: the effects over some images / a traced forward + backward of each alone (the
                          # floor leaves out decoding each image and the dictionary's work at its block)
IMAGES = 20               # images of the effects' measurement (4 with --quick)
SITE_IMAGES = 500         # the build
SITE_SECONDS = 15 * 60.0  # its target on this CPU


def measure(bench: Bench, items: set[str]) -> None:
    from vitviz.data import DataError, open_data

    _, _, what = bench.bundled_pair
    if what != "bundled pair":
        report("atlas: skipped (needs the bundled models and their dictionary across models; not with --quick)")
        return
    try:
        data = open_data("cifar10")
    except DataError as e:
        report(f"atlas: skipped ({e})")
        return
    effects(bench, data)
    site(data)


def effects(bench: Bench, data) -> None:
    """`class_effects` of the bundled ViT over `IMAGES` test images against, per image, a traced forward with the
    gradient and a backward of the class's logit to the dictionary's block: the floor of attribution patching."""
    from vitviz.atlas.effects import class_effects

    vit = vitviz.load("vit-cifar10", device=bench.device)
    dictionary = concepts.load(DICTIONARY)
    block = dictionary.dictionary(vit.name).block
    indices = list(range(4 if bench.quick else IMAGES))
    pixels = [vit.preprocess(data.image(i)).to(bench.device) for i in indices]

    def measured():
        class_effects(DICTIONARY, dictionary, data, models=[vit.name], indices=indices, progress=False)

    kept = {}

    def keep(index, tokens):
        if index == block:
            kept["tokens"] = tokens
        return tokens

    def floor():
        for i, x in zip(indices, pixels):
            trace = vit.model.trace(x, grad=True, attention=False, edit=keep)
            torch.autograd.grad(trace.logits[0, data.labels[i]], kept["tokens"])
    t = bench.time({"effects": measured, "floor": floor})
    report(f"atlas class effects, {len(indices)} images through {vit.name} with {DICTIONARY}: {t['effects']}, "
           f"traced forward + backward of each {t['floor']}, " + verdict(t["effects"].median / t["floor"].median,
                                                                         EFFECTS_TARGET))


def site(data) -> None:
    """The issue's build, once, wall time: `vitviz atlas --dictionaries across-cifar10 --data cifar10 --limit 500`
    into an empty folder, and the site's size."""
    from vitviz.atlas import build_atlas

    with tempfile.TemporaryDirectory(prefix="vitviz-atlas-") as out:
        start = time.perf_counter()
        summary = build_atlas([DICTIONARY], out=out, data=data, limit=SITE_IMAGES, progress=False)
        seconds = time.perf_counter() - start
        size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    report(f"atlas site of {DICTIONARY} over {SITE_IMAGES} images ({summary.concepts} concept and "
           f"{summary.classes} class pages, {size / 1e6:.1f} MB): {Timing([seconds])}, target <= "
           f"{ms(SITE_SECONDS)} ms {'OK' if seconds <= SITE_SECONDS else 'MISSED'}")
