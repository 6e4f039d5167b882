"""Items 1 and 3: vitviz's ViT forward, plain and traced, against timm's."""
from __future__ import annotations

import torch

from timing import report, verdict
from workbench import Bench, against_timm

SHAPES = ("vit_small_patch16_224", "vit_base_patch16_224")
TARGETS = {"forward": 1.00, "traced": 1.30}


def measure(bench: Bench, items: set[str]) -> None:
    """ViT-S/16 and ViT-B/16 at each batch size: vitviz's forward and its trace against timm's plain forward; the
    medians of ViT-B/16 stay in `bench.results` for `peak`."""
    for shape in SHAPES:
        reference, loaded = bench.vit_base if shape == "vit_base_patch16_224" else bench.timm_vit(shape)
        for batch in bench.batches:
            t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), shape)
            bench.results[("forward", shape, batch)] = t["vitviz"].median
            if "forward" in items:
                report(f"vit forward b{batch} {shape}: vitviz {t['vitviz']}, timm {t['timm']}, "
                       + verdict(t["vitviz"].median / t["timm"].median, TARGETS["forward"]))
            if "traced" in items:
                report(f"vit traced b{batch} {shape}: vitviz trace {t['traced']}, timm plain {t['timm']}, "
                       + verdict(t["traced"].median / t["timm"].median, TARGETS["traced"]))
