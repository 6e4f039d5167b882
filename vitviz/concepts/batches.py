"""Activations as training and evaluation read them: one tensor, or an iterable of batches, cut into batches of
tokens of one width.

A tensor (..., d) is its tokens (all leading dimensions flattened); an iterable yields tensors or numpy
arrays (..., d), each flattened the same way, and is re-cut into batches of `batch_size` tokens (the last
one of a pass may be smaller). `Passes` (a cached layer streamed shard by shard, `stream.ShardStream`) are
read pass by pass in an order drawn from a seed, re-cut the same way. Every token must have the same width,
and only floating-point values are read (as float32).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from .dictionary import ConceptsError


@runtime_checkable
class Passes(Protocol):
    """Activations read pass by pass in an order drawn from a seed, `tokens` in each pass."""
    tokens: int

    def epoch(self, number: int, seed: int) -> Iterator[Tensor]:
        """Pass `number`'s tokens, as (..., d) tensors, in the order (seed, number) draws."""


Activations = Tensor | np.ndarray | Iterable | Passes   # a tensor, an iterable of (..., d) batches, or passes


def tokens_of(batch, where: str) -> Tensor:
    """One batch as a float32 (t d) tensor, or a ConceptsError saying what it is instead."""
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if not isinstance(batch, Tensor):
        raise ConceptsError(f"{where} is a {type(batch).__name__}, not a tensor or array of activations.")
    if batch.ndim < 2 or not batch.is_floating_point():
        raise ConceptsError(f"{where} is a {batch.dtype} tensor of shape {tuple(batch.shape)}; activations are "
                            f"floating-point tokens (..., d), one row per token.")
    return batch.reshape(-1, batch.shape[-1]).float()


def is_one_pass(activations: Activations) -> bool:
    """Whether the activations can be read only once (an iterator or generator, not a tensor or a list)."""
    return not isinstance(activations, (Tensor, np.ndarray, Passes)) and iter(activations) is activations


def token_count(activations: Activations) -> int | None:
    """How many tokens one pass reads, where that is known without reading them (a tensor, an array)."""
    if isinstance(activations, (Tensor, np.ndarray)):
        return int(np.prod(activations.shape[:-1]))
    if isinstance(activations, Passes):
        return activations.tokens
    return None


def batches(activations: Activations, batch_size: int, *, order: Tensor | None = None) -> Iterator[Tensor]:
    """The activations in batches of `batch_size` float32 tokens (t d), all of one width. A tensor is read in
    `order` (a permutation of its token indices; default as stored); an iterable is read in its own order, and
    passes in their first pass's order for seed 0."""
    if isinstance(activations, (Tensor, np.ndarray)):
        tokens = tokens_of(torch.as_tensor(activations), "The activations")
        if len(tokens) == 0:
            raise ConceptsError("The activations hold no tokens.")
        for start in range(0, len(tokens), batch_size):
            yield tokens[start:start + batch_size] if order is None else tokens[order[start:start + batch_size]]
        return
    if order is not None:
        raise ValueError("only a tensor's tokens can be read in another order")
    yield from _recut(activations.epoch(0, 0) if isinstance(activations, Passes) else activations, batch_size)


def _recut(activations: Iterable, batch_size: int) -> Iterator[Tensor]:
    """An iterable's batches re-cut into `batch_size` tokens, each checked for its width."""
    if isinstance(activations, (str, bytes)) or not isinstance(activations, Iterable):
        raise ConceptsError(f"The activations are a {type(activations).__name__}: give a tensor (..., d) or an "
                            f"iterable of such batches.")
    pending, held, width, seen = [], 0, None, 0
    for number, batch in enumerate(activations, 1):
        tokens = tokens_of(batch, f"Batch {number} of the activations")
        if width is None:
            width = tokens.shape[1]
        elif tokens.shape[1] != width:
            raise ConceptsError(f"Batch {number} of the activations is {tokens.shape[1]} wide; the ones before "
                                f"were {width} wide.")
        pending.append(tokens)
        held += len(tokens)
        seen += len(tokens)
        while held >= batch_size:
            joined = torch.cat(pending) if len(pending) > 1 else pending[0]
            yield joined[:batch_size]
            pending, held = [joined[batch_size:]], held - batch_size
    if held:
        yield torch.cat(pending)
    if not seen:
        raise ConceptsError("The activations hold no tokens.")
