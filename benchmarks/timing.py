"""How every area times its contenders and writes its line: the clocks, the interleaved rounds, the checks that
two contenders compute the same thing before they are timed, and the parts of a line (min / median / max in ms,
a ratio of medians against its target)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

# 'cpu': this process's CPU time, which other jobs on a shared machine do not inflate (with one thread)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class Timing:
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def __str__(self) -> str:
        return " / ".join(ms(t) for t in (min(self.seconds), self.median, max(self.seconds))) + " ms"


def ms(seconds: float) -> str:
    """Seconds as milliseconds, one decimal below a second."""
    milliseconds = seconds * 1e3
    return f"{milliseconds:.1f}" if milliseconds < 1000 else f"{milliseconds:.0f}"


def timed(contenders: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1,
          clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Each contender `warmup` times, then `repeats` interleaved rounds in rotating order."""
    names = list(contenders)
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)   # GPU work is asynchronous
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    seconds = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync()
            start = clock()
            contenders[name]()
            sync()
            seconds[name].append(clock() - start)
    return {name: Timing(s) for name, s in seconds.items()}


def verdict(ratio: float, target: float) -> str:
    """The end of a line: the ratio, its target (at most), and whether it is met."""
    return f"ratio {ratio:.2f} (target <= {target:.2f}) {'OK' if ratio <= target else 'MISSED'}"


def report(line: str) -> None:
    """One benchmark line, printed at once (a run takes minutes)."""
    print(line, flush=True)


def same_logits(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Refuse to time two models that do not compute the same function."""
    error = (ours.float() - theirs.float()).abs().max().item()
    scale = theirs.float().abs().max().item()
    if not error <= 1e-3 * max(1.0, scale):
        raise SystemExit(f"{what}: the two models disagree (max logit difference {error:.3g}): not timed")


def same_map(ours: np.ndarray, theirs: np.ndarray, what: str, *, tol: float) -> None:
    """Refuse to time two implementations that do not compute the same map."""
    error = float(np.abs(ours - theirs).max())
    if not error <= tol:
        raise SystemExit(f"{what}: the two maps disagree (max difference {error:.3g} > {tol:g}): not timed")
