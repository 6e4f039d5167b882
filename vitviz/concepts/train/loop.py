"""The training loop `train` (`single.py`) and `train_across` (`across.py`) share: the schedule and its warm-up,
the progress kept on the device, the checkpoints. The data's training order is `activations.batches.epoch_order`'s.

Optimisation. Adam at `lr` (4e-4), linearly warmed up over the first `warmup` steps, then constant.
The normalisation (offset, scale) is estimated once, from the first `norm_tokens` tokens training
reads. A tensor's tokens are shuffled anew each epoch by a permutation drawn from (seed, epoch); an
iterable is read in its own order, re-cut into batches of `batch_size` tokens.

Nothing waits on the device per step. A GPU runs the steps queued behind each other; anything that reads a
number back (`.item()`, `.cpu()`, a tensor in an `if`, a boolean mask) stops the host until the queue is empty.
So the progress numbers, a loss that stopped being finite and the dead-concept counters stay on the device and
are read together every `PROGRESS_EVERY` steps (`TrainingProgress`): a diverged run is refused at that read,
naming the first step whose loss was not finite. Whether AuxK runs is decided on the host from the counters'
last read: a concept can be dead now only if its count then plus the tokens trained since reaches `dead_after`,
and the top k_aux is taken over that many (the concepts not dead are masked to -inf and give exactly 0), so
the step computes what reading the counters every step would.

Repeatable and resumable. The same activations, settings and seed give the same dictionary (on one
device and thread count). With `checkpoint=PATH` the whole state (weights, Adam's moments, the
position in the data, the dead-concept counters, the progress numbers) is written there every
`checkpoint_every` steps and after each epoch, atomically; calling `train` again with the same path
and settings continues from it, reading the activations again from the start and skipping the
batches already trained on, and ends with the same dictionary as a run never interrupted. A larger
`epochs` extends a finished run. The checkpoint is read with `torch.load(weights_only=True)`: numbers
only, never pickled code.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ..activations.batches import Activations, is_one_pass
from ..kinds.dictionary import ConceptsError, Dictionary

PROGRESS_EVERY = 25  # steps between reads of the progress numbers (each read waits for the device's queue)


class TrainingProgress:
    """A training run's numbers kept on the device and read back every `PROGRESS_EVERY` steps: the epoch's running
    sums (squared errors, spread, codes > 0, tokens), the first step whose loss was not finite (its loss and the
    activations' non-finite entries then), and the tokens since each concept fired. Shared by `train` and
    `across.train_across`."""

    def __init__(self, running: Tensor, since_fired: Tensor, dead_after: int | None):
        self.running, self.since_fired, self.dead_after = running, since_fired, dead_after
        self.diverged = torch.zeros(3, dtype=torch.float64, device=running.device)  # step (0: none), loss, not finite
        self.since_fired_read = since_fired.cpu().numpy()   # the counters as last read, and the tokens since
        self.tokens_since_read = 0

    @classmethod
    def started(cls, state: dict | None, n_concepts: int, dead_after: int | None,
                device: torch.device) -> tuple[dict, TrainingProgress]:
        """A run's position (epoch, batch, step, tokens) and numbers: a fresh run's, or the checkpoint `state`'s."""
        if state is None:
            return ({"epoch": 0, "batch": 0, "step": 0, "tokens": 0},
                    cls(torch.zeros(4, dtype=torch.float64, device=device),
                        torch.zeros(n_concepts, dtype=torch.int64, device=device), dead_after))
        return dict(state["position"]), cls(state["running"].to(device), state["since_fired"].to(device), dead_after)

    def add(self, numbers: Tensor, loss: Tensor, not_finite: Tensor, *, step: int, tokens: int) -> None:
        """A step's progress numbers, its whole batch's loss and the count of its non-finite activations."""
        self.running += numbers
        first = (self.diverged[0] == 0) & ~loss.isfinite()
        now = torch.stack([torch.full_like(self.diverged[0], step + 1), loss.double(), not_finite.double()])
        self.diverged = torch.where(first, now, self.diverged)
        self.tokens_since_read += tokens

    def may_be_dead(self) -> int:
        """At most how many concepts are dead now (0: no AuxK this step), known on the host."""
        if self.dead_after is None:
            return 0
        return int(np.count_nonzero(self.since_fired_read + self.tokens_since_read >= self.dead_after))

    def read(self) -> dict:
        """The epoch's FVU and L0 so far (one wait for the device); a ConceptsError if a step diverged."""
        numbers = torch.cat([self.running, self.diverged, self.since_fired.double()]).tolist()
        self.since_fired_read, self.tokens_since_read = np.array(numbers[7:], dtype=np.int64), 0
        step, loss, not_finite = numbers[4:7]
        if step:
            where = "the activations hold NaN or infinite values" if not_finite else "the learning rate may be too high"
            raise ConceptsError(f"Training diverged at step {int(step)}: the loss is {loss} ({where}).")
        squared_errors, spread, fired, tokens = numbers[:4]
        return {"fvu": squared_errors / spread if spread else math.nan, "l0": fired / tokens if tokens else math.nan}

    def newepoch_order(self) -> None:
        self.running = torch.zeros_like(self.running)


class Schedule:
    """How long a run trains: `epochs` whole passes, or `steps` steps in all (passes as many as they need, the
    last one cut where the steps end), with the learning rate warmed up linearly over `warmup` steps."""

    def __init__(self, *, epochs: int | None, steps: int | None, warmup: int, lr: float):
        self.epochs, self.steps, self.warmup, self.lr = epochs, steps, warmup, lr

    def total(self, steps_per_epoch: int | None) -> int | None:
        """Steps in all, where known."""
        return self.steps if self.steps is not None else steps_per_epoch and steps_per_epoch * self.epochs

    def learning_rate(self, step: int) -> float:
        return self.lr * min(1.0, (step + 1) / self.warmup) if self.warmup > 0 else self.lr

    def done(self, position: dict) -> bool:
        return position["step"] >= self.steps if self.steps is not None else position["epoch"] >= self.epochs


def run_schedule(epoch_batches: Callable[[int], Iterator], train_step: Callable[[object, int], int], *,
                 schedule: Schedule, position: dict, numbers: TrainingProgress, optimizer: torch.optim.Optimizer,
                 bar: tqdm, save: Callable[[dict | None], None] | None, checkpoint_every: int) -> dict | None:
    """The training loop `train` and `across.train_across` share: from `position` (epoch, batch, step, tokens;
    updated in place) until the schedule is done, each batch of `epoch_batches(epoch)` through `train_step(batch,
    step)` (-> the tokens it trained on) at the schedule's learning rate, the progress read every
    PROGRESS_EVERY steps, `save(last_epoch)` (the checkpoint; None: none) every `checkpoint_every` steps and where
    a pass or the run ends. -> the last pass's FVU and L0 (None if nothing was trained)."""
    last_epoch = None
    while not schedule.done(position):
        epoch, trained = position["epoch"], False
        for batch in itertools.islice(epoch_batches(epoch), position["batch"], None):
            if schedule.done(position):
                break
            for group in optimizer.param_groups:
                group["lr"] = schedule.learning_rate(position["step"])
            position["tokens"] += train_step(batch, position["step"])
            position["batch"] += 1
            position["step"] += 1
            trained = True
            bar.update()
            due = save is not None and position["step"] % checkpoint_every == 0
            if due or position["step"] % PROGRESS_EVERY == 0:
                bar.set_postfix(epoch=epoch + 1, **shown(numbers.read()), refresh=False)
            if due:
                save(None)
        else:   # the pass ended
            if not trained and position["batch"] == 0:
                raise ConceptsError("The activations hold no tokens.")
            position.update(epoch=epoch + 1, batch=0)
        last_epoch = numbers.read()
        bar.set_postfix(epoch=epoch + 1, **shown(last_epoch), refresh=False)
        if position["batch"] == 0:
            numbers.newepoch_order()
        if save is not None:
            save(last_epoch)
    return last_epoch


def check_schedule(sources: Sequence[Activations], *, expansion: int | None, epochs: int, steps: int | None,
                   batch_size: int, checkpoint_every: int, warmup: int) -> None:
    """Refuses, in words, a schedule or setting `train` and `train_across` cannot run on `sources` (one model's
    activations, or each model's)."""
    for name, value in (("expansion", expansion), ("epochs", epochs), ("steps", steps), ("batch_size", batch_size),
                        ("checkpoint_every", checkpoint_every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConceptsError(f"{name} must be a whole number of at least 1, not {value!r}.")
    if not isinstance(warmup, int) or warmup < 0:
        raise ConceptsError(f"warmup must be a whole number of steps (0: none), not {warmup!r}.")
    one_pass = any(is_one_pass(source) for source in sources)
    if one_pass and steps is not None:
        raise ConceptsError(f"steps={steps} may need the activations more than once, and an iterator can be read "
                            f"only once: pass a tensor or a re-iterable (a list, a cache) instead, or epochs=1.")
    if one_pass and epochs > 1:
        raise ConceptsError(f"{epochs} epochs need the activations {epochs} times, and an iterator can be read only "
                            f"once: pass a tensor or a re-iterable (a list, a cache) instead.")


def shown(progress: dict) -> dict:
    """The progress bar's FVU and L0."""
    return {"FVU": f"{progress['fvu']:.4f}", "L0": f"{progress['l0']:.1f}"}


def write_checkpoint(path: Path, dictionary: Dictionary, optimizer: torch.optim.Optimizer, settings: dict,
                      position: dict, running: Tensor, since_fired: Tensor, *, last_epoch: dict | None = None) -> None:
    """The training state, written through a temporary file renamed into place."""
    state = {"settings": json.dumps(settings, sort_keys=True), "d": dictionary.d,
             "dictionary": dictionary.state_dict(), "optimizer": optimizer.state_dict(), "position": dict(position),
             "running": running, "since_fired": since_fired, "last_epoch": last_epoch}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def read_checkpoint(path: Path, settings: dict, device: torch.device) -> dict:
    """A checkpoint of this run (its settings equal `settings`), or a ConceptsError that says why not."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise ConceptsError(f"{path} is not a vitviz training checkpoint: it holds pickled objects other than "
                            f"numbers, which are never loaded. Delete it, or choose another checkpoint path.") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ConceptsError(f"{path} is damaged ({(str(e).splitlines() or [type(e).__name__])[0]}): delete it to "
                            f"train from the start.") from None
    if not isinstance(state, dict) or "settings" not in state:
        raise ConceptsError(f"{path} is not a vitviz training checkpoint. Delete it, or choose another path.")
    theirs = json.loads(state["settings"])
    differ = [key for key in sorted(set(theirs) | set(settings)) if theirs.get(key) != settings.get(key)]
    if differ:
        key = differ[0]
        raise ConceptsError(f"{path} is the checkpoint of another run: its {key} is {theirs.get(key)!r}, this run's "
                            f"is {settings.get(key)!r}. Train with its settings to resume it, or choose another "
                            f"checkpoint path.")
    return state
