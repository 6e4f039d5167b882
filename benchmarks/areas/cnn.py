"""The CNN baseline (issue 30): ResNet-50 and ConvNeXt-T against timm, and every block's receptive field against
hooks and autograd on timm's model."""
from __future__ import annotations

import torch

from timing import report, verdict
from workbench import Bench, against_timm

TARGETS = {"cnn": 1.00, "cnn-traced": 1.20, "cnn-receptive": 1.10}


def measure(bench: Bench, items: set[str]) -> None:
    """ResNet-50 and ConvNeXt-T (random weights, BatchNorm statistics moved; timm's layout) against timm: the
    forward at b1 and b8 and the traced forward; and every block's receptive field of one image against the same
    gradients taken with hooks and autograd on timm's model (as `tests/test_receptive.py` writes them)."""
    cases = {"resnet50": dict(layers=(1, 1, 1, 1)), "convnext_tiny": dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40))}
    for name, quick in cases.items():
        reference, loaded = bench.timm_family(name, quick)
        for batch in bench.batches:
            t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), name)
            report(f"cnn forward b{batch} {name}: vitviz {t['vitviz']}, timm {t['timm']}, "
                   + verdict(t["vitviz"].median / t["timm"].median, TARGETS["cnn"]))
            report(f"cnn traced b{batch} {name}: vitviz trace {t['traced']}, timm plain {t['timm']}, "
                   + verdict(t["traced"].median / t["timm"].median, TARGETS["cnn-traced"]))
        receptive_fields(bench, name, reference, loaded)


def receptive_fields(bench: Bench, name: str, reference: torch.nn.Module, loaded) -> None:
    """Every block's receptive field of one image, vitviz's against hooks and `autograd.grad` on timm's model
    (`name`), checked equal before they are timed."""
    from test_receptive import hooked_fields
    from vitviz import explain

    size = 64 if bench.quick else 224
    pixels = torch.randn(1, 3, size, size, device=bench.device)
    found = explain.receptive_field(loaded.model, pixels)
    trace = loaded.model.trace(pixels)
    tokens = []
    for i in found.blocks:
        index = explain.receptive.centre_token(trace, i)[0]
        tokens.append(divmod(index, trace.blocks[i].query_grid[1]))
    blocks = ([b for stage in (reference.layer1, reference.layer2, reference.layer3, reference.layer4)
               for b in stage] if name == "resnet50" else [b for stage in reference.stages for b in stage.blocks])
    theirs = hooked_fields(reference, blocks, pixels, tokens, "bchw")
    if not torch.allclose(theirs, found.maps, rtol=0, atol=1e-4 * float(found.maps.max())):
        raise SystemExit(f"cnn: {name}'s receptive fields differ from timm's: not timed")
    t = bench.time({"vitviz": lambda: explain.receptive_field(loaded.model, pixels),
                    "hooks": lambda: hooked_fields(reference, blocks, pixels, tokens, "bchw")})
    report(f"cnn receptive fields {len(found.blocks)} blocks b1 {name}: vitviz {t['vitviz']}, timm hooks + "
           f"autograd.grad {t['hooks']}, " + verdict(t["vitviz"].median / t["hooks"].median, TARGETS["cnn-receptive"]))
