"""Faithfulness along the ranking of a circuit's nodes, and the smallest prefix that reaches a target.

Every node (concepts and error nodes of every site) whose |effect| is above rounding is ranked, largest first,
across all sites. With m(M) the metric on the photo, m(∅) the metric with every node at its baseline (every concept
*and* every error node: Marks et al.'s convention) and m(k) the metric with the first k ranked nodes kept and every
other at its baseline (the sites patched in depth order, each reading what the patched blocks before it made),

    F(k) = (m(k) - m(∅)) / (m(M) - m(∅))

m(k) is measured on a geometric grid of `GRID` sizes, then at every size below the grid's first that reaches the
target, so the circuit, the smallest prefix reaching it, is exact, and costs about as many rows as it has nodes
rather than as the ranking; the grid draws the curve beyond. A photo's circuit is kept to be pruned again on the
host (`adjacency.py`): it has every size measured up to `RESIZE` times its own (at least `RESIZABLE` nodes, and
with `every` every size of the ranking: `Prefixes.held`). Where |m(M) - m(∅)| is below `SPREAD` of the photo's
logits' standard deviation, the nodes together do not move the answer and no ratio means anything: F is None, and
the circuit says so in a sentence (`Prefixes.size`).

Prefixes share their start: two sizes with no ranked node of a site or an earlier one between them patch the model
alike up to that site, so they run as one copy until there (`prefix_tree`): a site encodes as many copies as the
distinct prefixes it sees, not one a size (the bundled ViT's 511 sizes: 148, 327 and 494 copies at its second,
third and fourth site).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ..concepts.kinds.dictionary import ConceptsError
from .effects import Metric, ablated
from .host import OnHost, to_host
from .sites import Site

SPREAD = 0.1  # |m(M) - m(∅)| below this share of the logits' standard deviation: F is no ratio worth reading
PREFIXES = 256   # prefixes of the ranking measured in one forward (the model's batch)
GRID = 24        # prefix sizes measured first, geometric from 1 to every ranked node
RESIZE = 2       # a circuit kept to be pruned again has every size measured up to this many times its own
RESIZABLE = 64   # and at least this many nodes (every node where the ranking is shorter)


@dataclass(frozen=True)
class Position:
    """Where a site's nodes stand in the ranking: each concept's place (`UNRANKED` for one that does nothing) and the
    error node's."""
    concepts: np.ndarray   # n
    error: float


UNRANKED = np.inf
KEPT = -1.0   # the place of a node every prefix keeps (`prefix_faithfulness`'s `kept`): below every size


@dataclass(frozen=True)
class Prefixes:
    """m for prefixes of the ranking of all nodes by |effect| (the first k nodes kept, every other at its
    baseline), and what F is made of. `counts` are the sizes measured, increasing from 0: every size up to the
    circuit's (`exact`), so the smallest reaching the target is exact, and a geometric grid beyond it up to every
    node."""
    positions: list[Position]      # per site
    counts: np.ndarray             # the prefix sizes measured, 0 first, every ranked node last
    m: np.ndarray                  # m at each of them
    concept_counts: np.ndarray     # N + 1: how many of the first k nodes are concepts
    effects: np.ndarray            # N: the ranked nodes' |effect|, largest first
    value: float                   # m(M)
    spread: float                  # the standard deviation of the photo's logits (over the classes)
    floor: float

    @property
    def empty(self) -> float:
        return float(self.m[0])

    @property
    def ranked(self) -> int:
        return len(self.effects)

    @property
    def exact(self) -> int:
        """The largest size up to which every size was measured."""
        gaps = np.flatnonzero(np.diff(self.counts) != 1)
        return int(self.counts[gaps[0]] if gaps.size else self.counts[-1])

    @property
    def defined(self) -> bool:
        span = abs(self.value - self.empty)
        return span > self.floor and span >= SPREAD * self.spread

    def faithfulness(self, m: float) -> float | None:
        return (m - self.empty) / (self.value - self.empty) if self.defined else None

    def at(self, k: int) -> float:
        """m with the first k ranked nodes kept (a size that was measured: any other is a mistake, not a guess)."""
        place = int(np.searchsorted(self.counts, k))
        if place == len(self.counts) or self.counts[place] != k:
            raise ValueError(f"the prefix of {k} nodes was not measured")
        return float(self.m[place])

    def reaches(self, faithful: float) -> int | None:
        """The smallest measured size whose F reaches `faithful` (None where none does, or F is undefined)."""
        if not self.defined:
            return None
        reached = np.flatnonzero((self.m - self.empty) / (self.value - self.empty) >= faithful - 1e-9)
        return int(self.counts[reached[0]]) if reached.size else None

    def size(self, faithful: float) -> tuple[int, str | None]:
        """The circuit's number of ranked nodes, and the sentence a reader needs where F cannot choose it."""
        n = self.ranked
        if not self.defined:
            held = np.cumsum(self.effects) / max(self.effects.sum(), 1e-30)
            size = min(int(np.searchsorted(held, UNDEFINED_SHARE - 1e-6)) + 1, n)
            return size, (f"{self.undefined_words()} Drawn instead: the {size} strongest nodes, holding "
                          f"{UNDEFINED_SHARE:.0%} of the total |effect|.")
        reached = self.reaches(faithful)
        if reached is not None:
            return reached, None
        return n, (f"No part of the ranking reaches F = {faithful:.2f}: with every one of the {n} nodes that do "
                   f"something, F = {self.faithfulness(self.at(n)):.2f} (the rest of the answer is in what the sites "
                   f"leave out or in nodes too small to rank).")

    def held(self, size: int, *, every: bool = False) -> int:
        """Up to which size a circuit of `size` nodes, kept to be pruned again, has every size measured: `RESIZE`
        times its own (at least `RESIZABLE`, at most the ranking), or with `every` the whole ranking."""
        return self.ranked if every else min(self.ranked, max(size, RESIZABLE, RESIZE * size))

    def with_sizes(self, sizes: np.ndarray, m: np.ndarray) -> Prefixes:
        """These prefixes with m at more `sizes`."""
        return replace(self, counts=np.concatenate([self.counts, sizes]), m=np.concatenate([self.m, m])).sorted()

    def sorted(self) -> Prefixes:
        order = np.argsort(self.counts, kind="stable")
        return replace(self, counts=self.counts[order], m=self.m[order])

    def chosen(self, faithful: float, nodes: int | None = None) -> tuple[int, str | None]:
        """The circuit's size and the sentence a reader needs: `nodes` where given (refused in words beyond the
        ranking), else the smallest reaching `faithful` (`size`)."""
        if nodes is None:
            return self.size(faithful)
        if not 0 <= nodes <= self.ranked:
            raise ConceptsError(f"A circuit of {nodes} nodes cannot be drawn: {self.ranked} nodes do something here "
                                f"(from 0 to {self.ranked}).")
        return nodes, None if self.defined else self.undefined_words()

    def undefined_words(self) -> str:
        """Why F is undefined here, in a sentence."""
        return (f"F is undefined here: every node at its baseline moves the metric only from {self.value:.3g} to "
                f"{self.empty:.3g}, less than {SPREAD:.0%} of the spread of the logits ({self.spread:.3g}), so the "
                f"nodes together do not carry this answer and no share of it can be measured.")

    def report(self, size: int, *, faithful: float, without_circuit: float | None,
               errors_kept: tuple[float, float | None]) -> dict:
        """`Circuit.faithfulness`: F and the three values it divides, the metric and the curve at the sizes
        measured; completeness and the errors-kept variant where they were measured at this size (else None)."""
        empty_kept, circuit_kept = errors_kept
        kept_span = self.value - empty_kept
        kept_defined = circuit_kept is not None and abs(kept_span) > self.floor and \
            abs(kept_span) >= SPREAD * self.spread
        concepts = int(self.concept_counts[size])
        return {
            "value": self.faithfulness(self.at(size)), "target": faithful,
            "full": self.value, "empty": self.empty, "circuit": self.at(size),
            "completeness": None if without_circuit is None else self.faithfulness(without_circuit),
            "without_circuit": without_circuit,
            "logit_spread": self.spread, "nodes": size, "concept_nodes": concepts, "error_nodes": size - concepts,
            "ranked_nodes": self.ranked, "active_concepts": int(self.concept_counts[-1]),
            "ablation": "m(∅): every concept and every error node at its baseline (Marks et al.)",
            "curve": [{"nodes": int(k), "concept_nodes": int(self.concept_counts[k]),
                       "faithfulness": self.faithfulness(float(m))} for k, m in zip(self.counts, self.m)],
            "errors_kept": {"value": (circuit_kept - empty_kept) / kept_span if kept_defined else None,
                            "empty": empty_kept, "circuit": circuit_kept,
                            "ablation": "m(∅) with every error node kept, in m(C) too (not the paper's)"}}


UNDEFINED_SHARE = 0.8   # of the total |effect|: what is drawn where F cannot choose the size


def ranking(host: Sequence[OnHost], floor: float) -> tuple[list[Position], list[tuple[float, int, int]]]:
    """Every node whose |effect| is above `floor` (concepts and error nodes of every site), largest first (ties in
    site, then concept order): each site's `Position`s and the ranked (|effect|, site, concept or -1 for the
    error)."""
    effects = [(abs(float(h.effects[c])), s, int(c)) for s, h in enumerate(host) for c in np.flatnonzero(
        np.abs(h.effects) > floor)]
    effects += [(abs(h.error_effect), s, -1) for s, h in enumerate(host) if abs(h.error_effect) > floor]
    ranked = sorted(effects, key=lambda e: -e[0])
    return placed(ranked, [h.effects.size for h in host]), ranked


def placed(ranked: Sequence[tuple[float, int, int]], concepts: Sequence[int]) -> list[Position]:
    """Each site's `Position` (`concepts`: how many it has) from the ranked (|effect|, site, concept or -1)."""
    positions = [Position(concepts=np.full(n, UNRANKED), error=UNRANKED) for n in concepts]
    for place, (_, s, c) in enumerate(ranked):
        if c < 0:
            positions[s] = Position(concepts=positions[s].concepts, error=place)
        else:
            positions[s].concepts[c] = place
    return positions


def prefix_faithfulness(loaded, pixels: Tensor, sites: Sequence[Site], host: Sequence[OnHost], metric: Metric, *,
                        value: float, baseline: str, floor: float, faithful: float | None = None,
                        fractions: Sequence[float] = (), nodes: int | None = None, cells: bool = False,
                        kept: Sequence[np.ndarray] | None = None) -> Prefixes:
    """m for prefixes of the `ranking` of every node by |effect|, and the photo's logits' spread: first a geometric
    grid of `GRID` sizes (with 0, every node and the sizes at `fractions` of the ranking), then every size below the
    grid's first whose F reaches `faithful` (without it, or where none does, every size; with `nodes`, every size up
    to it), so the smallest size reaching it is exact and costs about as many rows as the circuit has nodes, not as
    the ranking. Two reads. With `cells`, each site's `host` is per position (`positions.py`: its rows' concepts and
    errors in one vector, `split_cells`). `kept`: per site the nodes no prefix takes out (neither ranked nor at their
    baseline in m(∅): place `KEPT`)."""
    positions, ranked = ranking([h if k is None else replace(h, effects=np.where(k, 0.0, h.effects))
                                 for h, k in zip(host, kept or [None] * len(host))], floor)
    if kept is not None:
        positions = [replace(where, concepts=np.where(k, KEPT, where.concepts)) for where, k in zip(positions, kept)]
    n = len(ranked)

    def measure(sizes: np.ndarray, with_photo: bool = False) -> list[np.ndarray]:
        m = metric(prefix_rows(loaded, pixels, sites, positions, sizes, baseline=baseline, cells=cells))
        if with_photo:   # and the photo through the spliced sites, for the logits' spread
            everything = [torch.ones(1, site.dictionary.n_concepts, dtype=torch.bool, device=pixels.device)
                          for site in sites]
            return to_host([m, ablated(loaded, pixels, sites, everything, baseline=baseline)[0].float().std()])
        return to_host([m])

    grid = np.unique(np.concatenate([[0, n], np.round(np.geomspace(1, max(n, 1), GRID)),
                                     np.round(np.asarray(fractions, dtype=np.float64) * n)]).astype(np.int64))
    grid = grid[grid <= n]   # no node ranked (nothing moves the answer): the empty prefix alone
    m, spread = measure(grid, with_photo=True)
    on_grid = measured(positions, ranked, grid, m, value=value, spread=float(spread), floor=floor)
    reached = on_grid.reaches(faithful) if faithful is not None and nodes is None else None
    if nodes is not None:
        upto = min(nodes, n)
    else:
        upto = n if faithful is None or not on_grid.defined or reached is None else reached
    rest = np.setdiff1d(np.arange(1, upto + 1), grid)
    if rest.size:   # every size below the grid's first that reaches the target: the smallest is exact
        grid, m = np.concatenate([grid, rest]), np.concatenate([m, measure(rest)[0]])
    return measured(positions, ranked, grid, m, value=value, spread=float(spread), floor=floor)


def measured(positions: list[Position], ranked: list[tuple[float, int, int]], sizes: np.ndarray, m: np.ndarray, *,
             value: float, spread: float, floor: float) -> Prefixes:
    """`Prefixes` of a `ranking` from m at the prefix `sizes` (in any order)."""
    is_concept = np.array([c >= 0 for _, _, c in ranked], dtype=np.int64)
    return Prefixes(positions=positions, counts=np.asarray(sizes), m=np.asarray(m),
                    concept_counts=np.concatenate([[0], np.cumsum(is_concept)]).astype(np.int64),
                    effects=np.array([e for e, _, _ in ranked], dtype=np.float64), value=value, spread=spread,
                    floor=floor).sorted()


def prefix_tree(positions: Sequence[Position], sizes: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                           list[np.ndarray], np.ndarray]:
    """The prefixes `sizes` (increasing) as `ablated` runs them: prefixes alike up to a site (no ranked node of that
    site or an earlier one between their sizes) are one copy until there. Per site its copies' kept concepts
    (copies x n) and kept errors (copies), and which copy arriving there each continues (at the first site: the
    photo); and for each size its copy at the last site."""
    keep, errors, parents = [], [], []
    ranks = np.zeros(0)
    arriving = np.zeros(len(sizes), dtype=np.int64)
    for where in positions:
        ranks = np.sort(np.concatenate([ranks, where.concepts[np.isfinite(where.concepts)],
                                        [where.error] if np.isfinite(where.error) else []]))
        seen = np.searchsorted(ranks, sizes)   # how many of this site's and the earlier sites' nodes each keeps
        _, first, copy = np.unique(seen, return_index=True, return_inverse=True)
        alike = sizes[first]   # one size a copy: every size of a copy keeps the same nodes up to here
        keep.append(where.concepts[None, :] < alike[:, None])
        errors.append(where.error < alike)
        parents.append(arriving[first])
        arriving = copy.reshape(-1)
    return keep, errors, parents, arriving


def split_cells(keep: np.ndarray, site: Site) -> tuple[np.ndarray, np.ndarray]:
    """A per-position mask (b x rows (n + 1): each row's n concepts, then its error) -> (b rows n, b rows)."""
    cells = keep.reshape(len(keep), -1, site.dictionary.n_concepts + 1)
    return cells[..., :-1], cells[..., -1]


def prefix_rows(loaded, pixels: Tensor, sites: Sequence[Site], positions: Sequence[Position], sizes: np.ndarray, *,
                baseline: str, cells: bool = False) -> Tensor:
    """`ablated`'s logits for the prefixes `sizes` (increasing) of the ranking (`prefix_tree`), `PREFIXES` sizes a
    forward; the results stay on the device until read with the rest. With `cells`, positions per position
    (`split_cells`)."""
    device = pixels.device
    out = []
    for start in range(0, len(sizes), PREFIXES):
        keep, errors, parents, last = prefix_tree(positions, np.asarray(sizes[start:start + PREFIXES]))
        if cells:
            keep, errors = zip(*(split_cells(k, site) for k, site in zip(keep, sites)))
        logits = ablated(loaded, pixels, sites, [torch.from_numpy(k).to(device) for k in keep], baseline=baseline,
                         keep_errors=[torch.from_numpy(e).to(device) for e in errors],
                         parents=[torch.from_numpy(p).to(device) for p in parents])
        out.append(logits[torch.from_numpy(last).to(device)])
    return torch.cat(out)


def ablated_rows(loaded, pixels: Tensor, sites: Sequence[Site], keep: Sequence[np.ndarray],
                 errors: np.ndarray | None, *, baseline: str) -> Tensor:
    """`ablated`'s logits for rows of host masks (per site rows x n, and rows x sites for the errors; `errors` None:
    per site rows x positions, each row's concepts and error in one mask, `split_cells`), `PREFIXES` rows a forward;
    the results stay on the device until read with the rest."""
    device = pixels.device
    out = []
    for start in range(0, len(keep[0]), PREFIXES):
        part = slice(start, start + PREFIXES)
        if errors is None:
            kept, at = zip(*(split_cells(k[part], site) for k, site in zip(keep, sites)))
            copies = torch.arange(len(kept[0]), device=device)
            out.append(ablated(loaded, pixels, sites, [torch.from_numpy(k).to(device) for k in kept],
                               baseline=baseline, keep_errors=[torch.from_numpy(e).to(device) for e in at],
                               parents=[copies] * len(sites)))
        else:
            out.append(ablated(loaded, pixels, sites, [torch.from_numpy(k[part]).to(device) for k in keep],
                               baseline=baseline, keep_errors=torch.from_numpy(errors[part]).to(device)))
    return torch.cat(out)
