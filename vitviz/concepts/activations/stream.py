"""A cached layer read shard by shard: training on more tokens than fit in memory.

`Cached.tokens()` holds a whole layer in memory, and a real data set's does not fit: ViT-B/16's 768-wide
tokens of ImageNet-1k's 1.28 M images at one block are 1.28 M x 197 x 768 float32 = 775 GB. A `ShardStream`
reads the cache's shards instead, a few at a time. Each pass draws an order of the shards from (seed, pass),
takes them `buffer` at a time, shuffles the tokens of those shards together and hands them on, so a batch
mixes the tokens of `buffer` shards (`buffer` x 1,024 images) and memory holds one such group at once
(`peak_tokens` records the most it held). The same seed gives the same order on every rank, so under
torchrun every rank reads the same tokens and trains on its share of each batch, as with a tensor.

`train(stream, ...)` reads it through `epoch(number, seed)`; a run interrupted mid-pass resumes by reading
that pass again and skipping the batches already trained on (its order is drawn again, the same).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from ..kinds.dictionary import ConceptsError
from .cache import Cached, shard_images

BUFFER = 4   # shards shuffled together (4 x 1,024 images)


class ShardStream:
    """A cached layer's tokens (t d), pass after pass in an order drawn from the seed, `buffer` shards held at
    once. `tokens`: how many one pass reads."""

    def __init__(self, cached: Cached, *, buffer: int = BUFFER):
        if not isinstance(buffer, int) or buffer < 1:
            raise ConceptsError(f"The shuffle buffer holds a whole number of shards, at least 1, not {buffer!r}.")
        self.cached, self.buffer = cached, buffer
        self.tokens = sum(shard_images(shard) for shard in cached.shards) * cached.layer["tokens_per_image"]
        if not self.tokens:
            raise ConceptsError(f"No image of the data set could be read into {cached.folder}.")
        self.peak_tokens = 0   # the most tokens held at once, over every pass read so far

    def epoch(self, number: int, seed: int) -> Iterator[Tensor]:
        """Pass `number`: groups of `buffer` shards in an order drawn from (seed, number), each group's tokens
        shuffled together (t d float32 tensors, one a group)."""
        state = np.random.SeedSequence([seed, number, 1]).generate_state(1, dtype=np.uint64)[0] >> 1
        generator = torch.Generator().manual_seed(int(state))
        shards = self.cached.shards
        order = torch.randperm(len(shards), generator=generator).tolist()
        for start in range(0, len(order), self.buffer):
            grids = [self.cached.read_shard(shards[i])["tokens"] for i in order[start:start + self.buffer]]
            group = torch.cat([grid.reshape(-1, grid.shape[-1]) for grid in grids])
            self.peak_tokens = max(self.peak_tokens, len(group))
            yield group[torch.randperm(len(group), generator=generator)]
            del grids, group
