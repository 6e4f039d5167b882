"""Work over many images split across processes with torch.distributed, as torchrun starts them.

    torchrun --nproc_per_node=2 -m vitviz evaluate ...                      # one machine, two processes
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 -m vitviz evaluate ...

A process group is made only when torchrun says there is more than one process (WORLD_SIZE > 1):
gloo on the CPU, NCCL on CUDA with each process on the GPU its LOCAL_RANK names. Work is dealt in
whole chunks, chunk k to rank k % world_size, so an image always meets the same batch whatever the
number of ranks (a batched forward's floats can depend on which images share it). Rank 0 gathers
every rank's results as text through the process group, so the ranks need no shared disk.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

T = TypeVar("T")
RANK_WAIT = timedelta(hours=24)   # how long the ranks wait for the slowest one at the merge


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    device: torch.device

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def mine(self, chunks: Sequence[T]) -> list[T]:
        """This rank's chunks: chunk k goes to rank k % world."""
        return list(chunks[self.rank::self.world])

    def gather(self, text: str) -> list[str] | None:
        """Every rank's text, in rank order, on rank 0 (None on the others); a barrier for all of them. As
        bytes in tensors, not `dist.gather_object`, which pickles."""
        if self.world == 1:
            return [text]
        data = torch.from_numpy(np.frombuffer(text.encode(), dtype=np.uint8).copy()).to(self.device)
        size = torch.tensor([len(data)], device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        dist.all_gather(sizes, size)
        padded = torch.zeros(int(max(sizes).item()), dtype=torch.uint8, device=self.device)
        padded[:len(data)] = data
        received = [torch.zeros_like(padded) for _ in range(self.world)] if self.leader else None
        dist.gather(padded, received, dst=0)
        if not self.leader:
            return None
        return [bytes(r[:int(s.item())].cpu().numpy()).decode() for r, s in zip(received, sizes)]


@contextmanager
def ranks(device: str | torch.device | None = None) -> Iterator[Ranks]:
    """This process's place among torchrun's processes (rank 0 of 1 without torchrun), and its device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world == 1:
        yield Ranks(0, 1, device)
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=RANK_WAIT,
                            device_id=device if device.type == "cuda" else None)
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size(), device)
    finally:
        dist.destroy_process_group()
