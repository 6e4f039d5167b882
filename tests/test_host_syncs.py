"""The hot loops never make the host wait for a GPU per step: counted on the CPU (tests/syncs.py says what
counts and why a timing could not show it). A training run reads its numbers back once every PROGRESS_EVERY
steps and at the end of each epoch, and nothing else in the loop."""
from __future__ import annotations

import pytest
import torch

from syncs import counting
from vitviz import concepts
from vitviz.concepts.across import train_across
from vitviz.concepts.train import PROGRESS_EVERY

BATCH = 64
SETTINGS = dict(expansion=4, batch_size=BATCH, warmup=5, dead_after=500, norm_tokens=BATCH, progress=False)
SETUP = 4   # before the loop: the normalisation's checks and the first read of the dead-concept counters


def activations(steps: int, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps * BATCH, d, generator=g) * 2 + 1


def single(kind: str):
    return lambda steps: concepts.train(activations(steps), kind=kind, **({} if kind == "standard" else {"k": 4}),
                                        **SETTINGS)


def across(steps: int):
    return train_across([activations(steps), activations(steps, d=8, seed=1)], models=["a", "b"], blocks=None,
                        tokens=None, kind="topk", k=4, **SETTINGS)


@pytest.mark.parametrize("run", [single("topk"), single("batchtopk"), single("standard"), across],
                         ids=["topk", "batchtopk", "standard", "across"])
def test_training_waits_for_the_device_once_per_progress_read_not_per_step(run):
    counts = {}
    for steps in (50, 100):
        with counting() as calls:
            run(steps)
        counts[steps] = sum(calls.values())
    reads = 50 // PROGRESS_EVERY + 1   # every PROGRESS_EVERY steps, and the epoch's end
    assert counts[50] <= reads + SETUP + 2, counts   # across: one more normalisation check per model
    assert counts[100] - counts[50] == 50 // PROGRESS_EVERY, counts   # 50 more steps: their reads alone


def test_the_dead_concepts_auxk_revives_are_the_ones_reading_every_step_would_find():
    """AuxK runs when the host's bound on the dead concepts says some may be dead, and takes the top k over that
    bound: with few dead concepts and a bound above them, it equals AuxK over exactly the dead ones."""
    from vitviz.concepts.train import auxk
    g = torch.Generator().manual_seed(0)
    pre, residual, W_dec = torch.randn(32, 12, generator=g), torch.randn(32, 5, generator=g), torch.randn(12, 5,
                                                                                                         generator=g)
    dead = torch.zeros(12, dtype=torch.bool)
    dead[[2, 7, 9]] = True
    exact = auxk(pre, residual, dead, W_dec, 3)   # k = the number dead
    assert torch.equal(auxk(pre, residual, dead, W_dec, 8), exact)   # a bound above it: the others masked to 0
    assert torch.equal(auxk(pre, residual, dead, W_dec, 512), exact)


def test_caching_activations_never_waits_for_the_device_per_batch(tmp_path):
    """The loop that drives the traced forwards reads nothing back: 6 more batches, no more waits (the
    background writer waits for each shard's copies; the probe and the cache's key are before the loop)."""
    from PIL import Image

    from vitviz import hub
    from vitviz.concepts.activations import cache_activations
    from vitviz.data import Dataset

    vit = hub.load("vit-cifar10", device="cpu")
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy())
              for _ in range(16)]
    counts = {}
    for n in (4, 16):
        data = Dataset(name=f"{n} photos", ids=tuple(map(str, range(n))), labels=None, classes=None,
                       source=images.__getitem__)
        with counting() as calls:
            cache_activations(vit, data, block=-1, root=tmp_path, batch_size=2, progress=False)
        counts[n] = sum(calls.values())
    assert counts[16] == counts[4], counts
