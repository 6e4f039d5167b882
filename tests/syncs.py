"""Counting what would make the host wait for a GPU, on the CPU.

On a GPU the host queues work and goes on; it waits for the device only where a value must come back:
`Tensor.item`, `tolist`, `cpu`, `numpy`, a tensor in an `if` or a number conversion (`__bool__`, `__float__`,
`__int__`, `__index__`), `nonzero` and indexing with a boolean mask (its result's size depends on the data),
and `torch.cuda.synchronize`. A CPU has no queue, so timings cannot show these waits; `counting()` counts the
calls instead (../shared/GPU.md). Tensors handed out by these calls are plain CPU values, so the count is of
the host's requests, not of their internal work. Calls made by torch itself are not counted: its optimizers
read their step counters with `.item()`, and those live on the host even when the model is on a GPU. Only the
thread that counts is counted: the one that drives the device (a background writer may wait for copies).
"""
from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Iterator

import torch

WAITING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "nonzero")


def _uncounted(thread: int) -> bool:
    """Whether a call is made by another thread, or by torch's own Python code (two frames up: past the wrapper)."""
    return threading.get_ident() != thread or sys._getframe(2).f_globals.get("__name__", "").startswith("torch.")


def _is_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter]:
    """Within the block, count each call that would wait for a GPU, by name (a Counter; `sum(c.values())`)."""
    counts: collections.Counter = collections.Counter()
    thread = threading.get_ident()
    originals = {name: getattr(torch.Tensor, name) for name in (*WAITING, "__getitem__", "__setitem__")}

    def counted(name):
        original = originals[name]

        def wrapper(self, *args, **kwargs):
            if not _uncounted(thread):
                counts[name] += 1
            return original(self, *args, **kwargs)
        return wrapper

    def masked(name):
        original = originals[name]

        def wrapper(self, index, *args):
            if _is_mask(index) and not _uncounted(thread):
                counts[f"boolean mask {name}"] += 1
            return original(self, index, *args)
        return wrapper

    synchronize = torch.cuda.synchronize

    def counted_synchronize(*args, **kwargs):
        if threading.get_ident() == thread:
            counts["torch.cuda.synchronize"] += 1
        return synchronize(*args, **kwargs)

    try:
        for name in WAITING:
            setattr(torch.Tensor, name, counted(name))
        for name in ("__getitem__", "__setitem__"):
            setattr(torch.Tensor, name, masked(name))
        torch.cuda.synchronize = counted_synchronize
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.cuda.synchronize = synchronize
