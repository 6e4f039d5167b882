"""Activations as training and evaluation read them: one tensor, or an iterable of batches, cut into batches of
tokens of one width.

A tensor (..., d) is its tokens (all leading dimensions flattened); an iterable yields tensors or numpy
arrays (..., d), each flattened the same way, and is re-cut into batches of `batch_size` tokens (the last
one of a pass may be smaller). `Passes` (a cached layer streamed shard by shard, `stream.ShardStream`) are
read pass by pass in an order drawn from a seed, re-cut the same way. Every token must have the same width,
and only floating-point values are read (as float32). Several models' aligned activations (row r the same place
of the same image in each, as a dictionary across models reads them) are read side by side (`aligned`).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from ..kinds.dictionary import ConceptsError


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


def refuse_unlike_models(activations, models: Sequence[str]) -> None:
    """A ConceptsError unless `activations` is a list (or tuple) of one model's activations per model."""
    if not isinstance(activations, (list, tuple)) or len(activations) != len(models):
        given = f"{len(activations)} sets of activations" if isinstance(activations, (list, tuple)) else \
            f"a {type(activations).__name__}"
        raise ConceptsError(f"A dictionary across models reads one set of activations per model, in a list in the "
                            f"order of its models ({', '.join(models)}); {given} given.")


def aligned_count(activations: Sequence[Activations], models: Sequence[str]) -> int | None:
    """The number of rows each model's activations hold where that is known without reading them; refused
    when the models' counts differ."""
    counts = [token_count(model_activations) for model_activations in activations]
    known = {model: count for model, count in zip(models, counts) if count is not None}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{model} {count}" for model, count in known.items())
        raise ConceptsError(f"The activations are not aligned: the models hold different numbers of tokens "
                            f"({listed}). Row r of every model's activations must be the same place of the same "
                            f"image: resample the models' grids onto common cells first.")
    return counts[0] if None not in counts else None


def aligned(streams: Sequence[Iterator[Tensor]], models: Sequence[str]) -> Iterator[tuple[Tensor, ...]]:
    """The models' batches side by side, refused where they stop holding the same number of rows."""
    seen = 0
    for rows in itertools.zip_longest(*streams):
        lengths = [None if x is None else len(x) for x in rows]
        if len(set(lengths)) > 1:
            listed = ", ".join(f"{model} {'none' if length is None else length}" for model, length in
                               zip(models, lengths))
            raise ConceptsError(f"The activations are not aligned: after {seen} tokens, the next batch holds "
                                f"different numbers of tokens ({listed}). Row r of every model's activations must "
                                f"be the same place of the same image: resample the models' grids onto common "
                                f"cells first.")
        seen += lengths[0]
        yield rows


def epoch_order(activations: Activations, epoch: int, batch_size: int, seed: int) -> Iterator[Tensor]:
    """One pass over the activations in training order: a tensor's tokens in a permutation drawn from (seed,
    epoch), passes' in the order they draw from them, an iterable's in its own order."""
    if isinstance(activations, Passes):
        return batches(activations.epoch(epoch, seed), batch_size)
    count = token_count(activations)
    if count is None:
        return batches(activations, batch_size)
    epoch_seed = int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0] >> 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(epoch_seed))
    return batches(activations, batch_size, order=order)


def head_of(stream: Iterator[Tensor], tokens: int) -> tuple[list[Tensor], Iterator[Tensor]]:
    """The first batches of `stream` that hold at least `tokens` tokens (or all of them), and the rest."""
    head, held = [], 0
    for x in stream:
        head.append(x)
        held += len(x)
        if held >= tokens:
            break
    return head, stream
