"""Swin-T (issue 29) against timm: forwards, the traced forward, rollout to stage 1 against a traced forward, and the
memory a trace keeps against its windowed attention."""
from __future__ import annotations

import torch

from timing import report, verdict
from workbench import Bench, against_timm

TARGETS = {"swin": 1.00, "swin-traced": 1.30, "swin-rollout": 0.20, "swin-memory": 2.00}


def trace_bytes(trace) -> tuple[int, int]:
    """(bytes of every tensor a trace keeps, each storage once; bytes of its attention tensors)."""
    seen, total = set(), 0

    def count(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    for block in trace.blocks:
        for t in (block.attn, block.tokens, block.inputs, block.normed):
            count(t)
    for t in (trace.logits, trace.pooled, trace.final_tokens, *trace.features):
        count(t)
    attention = sum(b.attn.numel() * b.attn.element_size() for b in trace.blocks if b.attn is not None)
    return total, attention


def measure(bench: Bench, items: set[str]) -> None:
    """Swin-T (random weights, timm's layout) against timm: the forward at b1 and b8, the traced forward against
    timm's plain one, rollout to the stage-1 grid against a traced forward (never a dense product), and the memory
    the trace keeps against the sum of its windowed attention tensors."""
    from vitviz import explain

    quick = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 1, 2, 2))
    reference, loaded = bench.timm_family("swin_tiny_patch4_window7_224", quick)
    for batch in bench.batches:
        t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), "Swin-T")
        report(f"swin forward b{batch} Swin-T: vitviz {t['vitviz']}, timm {t['timm']}, "
               + verdict(t["vitviz"].median / t["timm"].median, TARGETS["swin"]))
        report(f"swin traced b{batch} Swin-T: vitviz trace {t['traced']}, timm plain {t['timm']}, "
               + verdict(t["traced"].median / t["timm"].median, TARGETS["swin-traced"]))
    pixels = torch.randn(1, 3, 224, 224, device=bench.device)
    with torch.inference_mode():
        trace = loaded.model.trace(pixels)
        t = bench.time({"rollout": lambda: explain.attention_rollout(trace, to_stage=0),
                        "traced": lambda: loaded.model.trace(pixels)})
    report(f"swin rollout to stage 1 b1 Swin-T: {t['rollout']}, traced forward {t['traced']}, "
           + verdict(t["rollout"].median / t["traced"].median, TARGETS["swin-rollout"]))
    kept, attention = trace_bytes(trace)
    dense = sum(4 * b.tokens.shape[1] ** 2 * b.heads for b in trace.blocks)
    report(f"swin trace memory b1 Swin-T 224 px: {kept / 2**20:.1f} MiB kept, windowed attention "
           f"{attention / 2**20:.1f} MiB (dense token x token matrices would be {dense / 2**20:.0f} MiB), "
           + verdict(kept / attention, TARGETS["swin-memory"]))
