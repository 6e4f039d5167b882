"""`python -m torch.distributed.run --nproc_per_node=2 tests/concepts_cache_ranks.py OUT`: the two ranks cache
vit-cifar10's last block for `images()` into OUT/cache (four images a shard, shared out by rank), then train one
TopK dictionary on the cache data-parallel, as `python -m vitviz concepts train` does under torchrun; rank 0
writes it to OUT/dictionary. test_concepts_activations.py compares both with one process."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from vitviz import hub
from vitviz.concepts.activations import cache as activations
from vitviz.concepts.build import cache_layers, train_layers
from vitviz.data import Dataset
from vitviz.distributed import ranks

SHARD_IMAGES, COUNT = 4, 10   # three shards: two for rank 0, one for rank 1
SETTINGS = dict(kind="topk", k=4, expansion=2, epochs=2, batch_size=128, warmup=2, seed=3)


def images() -> Dataset:
    rng = np.random.default_rng(11)
    pictures = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(COUNT)]
    return Dataset(name="noise", ids=tuple(f"noise/{i}" for i in range(COUNT)), labels=None, classes=None,
                   source=pictures.__getitem__)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    activations.SHARD_IMAGES = SHARD_IMAGES
    with ranks("cpu") as place:
        model = hub.load("vit-cifar10")
        layers = cache_layers([model], images(), blocks=[-1], tokens=None, root=out / "cache", indices=None,
                              ranks=place, progress=False)
        train_layers([model], layers, out=out / "dictionary", leader=place.leader, progress=False, **SETTINGS)
