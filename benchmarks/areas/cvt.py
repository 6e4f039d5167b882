"""Item 2: vitviz's CvT-13 against transformers' `CvtForImageClassification`."""
from __future__ import annotations

import torch

from timing import report, same_logits, verdict
from workbench import Bench

TARGET = 1.00


def measure(bench: Bench, items: set[str]) -> None:
    """CvT-13's forward at each batch size against transformers' on the same weights."""
    reference, loaded = bench.cvt_13
    for batch in bench.batches:
        pixels = torch.randn(batch, 3, 224, 224, device=bench.device)
        with torch.inference_mode():
            same_logits(loaded.model(pixels), reference(pixel_values=pixels).logits, "CvT-13")
            with bench.amp():
                t = bench.time({"vitviz": lambda pixels=pixels: loaded.model(pixels),
                                "transformers": lambda pixels=pixels: reference(pixel_values=pixels).logits})
        report(f"cvt forward b{batch} CvT-13: vitviz {t['vitviz']}, transformers {t['transformers']}, "
               + verdict(t["vitviz"].median / t["transformers"].median, TARGET))
