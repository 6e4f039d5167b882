"""Data-parallel training's reductions: what W ranks, each holding a share of every batch, exchange so that
their step is the step one process takes on the whole batch. Without a process group (or with a group of one)
each function is the identity and exchanges nothing.

The shares. Every rank reads the same stream of batches; of a batch of t tokens, rank r of W trains on rows
[⌊r t / W⌋, ⌊(r + 1) t / W⌋) (`share`): contiguous, their sizes differing by at most one, and empty for some
ranks when t < W.

Why the step is the same. A loss written as a sum over the batch's tokens divided by the whole batch's count
(never the rank's own) is on each rank the part of the one-process loss its tokens contribute, so the ranks'
gradients summed (`sum_gradients`) are the one-process gradient. What is not a sum over tokens is reduced
before it is used: a denominator (AuxK's Σ‖e‖²) summed (`total`), a minimum (BatchTopK's smallest kept code)
taken over the ranks (`smallest`), and an order statistic of the whole batch (BatchTopK's cut, its k·t-th
largest pre-activation) found among the ranks' own k·t largest values, gathered (`kth_largest`): the k largest
of a union are among the union of each part's k largest.

They are collectives: every rank must call them in the same order with tensors of the same shape, so code
around them may branch only on what every rank knows alike (the whole batch's count, values already
reduced), never on its own share.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn


def active() -> bool:
    """Whether this process is one of several ranks of an initialised process group (torchrun's)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 alone): rank 0 writes the checkpoints and shows the progress."""
    return dist.get_rank() if active() else 0


def share(batch: Tensor) -> Tensor:
    """This rank's contiguous rows of a batch (t ...): [⌊r t / W⌋, ⌊(r + 1) t / W⌋), the whole batch alone."""
    if not active():
        return batch
    r, world = dist.get_rank(), dist.get_world_size()
    return batch[r * len(batch) // world:(r + 1) * len(batch) // world]


def total(values: Tensor) -> Tensor:
    """The sum of every rank's `values` (the same shape on all), elementwise; `values` itself alone."""
    if not active():
        return values
    summed = values.clone()
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed


def smallest(values: Tensor) -> Tensor:
    """The minimum over the ranks of `values` (the same shape on all), elementwise; `values` itself alone."""
    if not active():
        return values
    least = values.clone()
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return least


def extremes(values: Tensor) -> tuple[Tensor, Tensor]:
    """The elementwise minimum and maximum over the ranks of `values` (the same shape on all), in one exchange:
    equal where every rank holds the same."""
    least = smallest(torch.cat([values.flatten(), -values.flatten()]))
    return least[:values.numel()].view_as(values), -least[values.numel():].view_as(values)


def kth_largest(values: Tensor, k: int) -> Tensor:
    """The k-th largest of all ranks' `values` (1-D, any length, even 0) taken together; k is the same on every
    rank and at most their total length."""
    own = values.topk(min(k, len(values))).values
    if not active():
        return own[-1]
    padded = torch.cat([own, own.new_full((k - len(own),), -torch.inf)])   # all_gather needs equal lengths
    gathered = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, padded)
    return torch.cat(gathered).topk(k).values[-1]


def sum_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Each parameter's gradient replaced by the sum of every rank's (a missing one counting as zeros), in one
    exchange of all of them flattened together."""
    if not active():
        return
    parameters = list(parameters)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, grad, summed in zip(parameters, grads, flat.split([g.numel() for g in grads])):
        p.grad = grad.copy_(summed.view_as(grad))
