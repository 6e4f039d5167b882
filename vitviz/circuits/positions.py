"""A photo's circuit per position: a node is a concept at one place on the photo, or a site's error there (Marks et
al. 2024's nodes: a feature at one token position).

Nodes. At a site with rows t (the class token first where it reads one, then the grid row-major) and concepts c,
the node (c, t) is the code z_{t,c} and (ε, t) the error at row t. Its effect is the term of the whole concept's
effect (`effects.py`) at that row,

    IE(z_{t,c}) = (∂m/∂z)_{t,c} (z - z₀)_{t,c}        IE(ε_t) = g_rows,t · (ε - ε₀)_t

(integrated gradients: the same terms along the path), so a concept's effects per position add up to its whole
effect. Every node above rounding, of every site and row, is ranked by |effect|, and the circuit is the smallest
prefix whose F reaches the target, by the same search as the whole circuit's (`prefixes.prefix_faithfulness`): a
node taken out sets that row's code of that concept (or that row's error) alone to its baseline. m(∅) is the whole
circuit's (every concept and every error at every row at its baseline), so F is the same ratio of the same model;
completeness and the errors-kept variant (every row's error kept) too.

Edges. Between consecutive sites, from (u, t) to (d, t'):

    IE((u, t) → (d, t')) = ∇_{d,t'} m · ∂d_{t'}/∂u_t · Δu_t

how much u at row t moves d at row t' (through the blocks between, where attention carries it to other rows), as d
there acts on m: `effects.edges_between` with `cells`. The circuit's nodes are the targets (one backward each,
batched) and every upstream node and row a source, so an edge is kept, as in the whole circuit, where it is at least
`edge_share` of its target's absolute inflow; summed over every source row and target row the edges are the whole
concepts' edges. What the downstream site does not read is a node of its own, as in the whole circuit.

Not here: the check against activation patching, and the adjacency kept to be pruned again (`adjacency.py`): a
circuit per position is drawn at the size it was built for, every one of its nodes one by one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from .circuit import NOTHING, check_settings, fixed_header, notes_of
from .effects import IG_STEPS, Metric, SiteState, attribution, check_metric, edges_between, integrated_gradients
from .graph import (
    EDGE_SHARE,
    FAITHFUL,
    INPUT,
    LOGIT,
    UNREAD,
    Circuit,
    Edge,
    Node,
    Place,
    at_cell,
    position_id,
    unread_id,
)
from .host import OnHost, to_host
from .prefixes import KEPT, Prefixes, ablated_rows, prefix_faithfulness
from .sites import Site


def position_circuit(loaded, pixels: Tensor, sites: Sequence[Site], metric: Metric, *, baseline: str = "zero",
                     method: str = "atp", steps: int = IG_STEPS, frozen: bool = False, faithful: float = FAITHFUL,
                     edge_share: float = EDGE_SHARE, nodes: int | None = None,
                     names: Sequence[dict[int, str] | None] | None = None,
                     place: Sequence[int | None] | None = None) -> Circuit:
    """The circuit of `metric` on the photo through `sites` with a node a concept (or an error) at one row: the
    smallest prefix of every such node ranked by |effect| whose F reaches `faithful` (or the first `nodes`), every
    node drawn, the edges between consecutive sites' nodes per position. Arguments as `circuit.circuit`'s.

    `place`: the circuit of one place on the photo, per site the row there (None: the site has none): only the
    nodes at those rows are ranked and taken out, every other node is kept as computed, in m(∅) too, so F is the
    share of what the nodes there do that the circuit does."""
    check_settings(sites, method=method, faithful=faithful, edge_share=edge_share, nodes=nodes)
    check_metric(metric, loaded.labels)
    value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, frozen=frozen)
    if method == "ig":
        integrated_gradients(loaded, pixels, sites, states, metric, steps=steps, frozen=frozen)
    floor = NOTHING * max(1.0, abs(value))
    host, codes = cell_hosts(states)
    concepts = [site.dictionary.n_concepts for site in sites]   # a site's row t, node c: t (n + 1) + c, n the error
    others = None if place is None else [np.arange(h.effects.size) // (n + 1) != row   # every row, where None
                                         for h, n, row in zip(host, concepts, place)]
    prefixes = prefix_faithfulness(loaded, pixels, sites, host, metric, value=value, baseline=baseline, floor=floor,
                                   faithful=faithful, nodes=nodes, cells=True, kept=others)
    prefixes = _counted(prefixes, concepts)
    size, why = prefixes.chosen(faithful, nodes)
    members = [[int(c) for c in np.argsort(where.concepts, kind="stable") if 0 <= where.concepts[c] < size]
               for where in prefixes.positions]
    errors = [np.arange(h.effects.size) % (n + 1) == n for h, n in zip(host, concepts)]
    circuit_in = [(0 <= where.concepts) & (where.concepts < size) for where in prefixes.positions]
    outside = [where.concepts == KEPT for where in prefixes.positions]   # elsewhere than `place`: always kept
    keep = [np.stack([~inside, error | away, error | inside | away])
            for inside, error, away in zip(circuit_in, errors, outside)]
    pairs = [_pair_edges(loaded, pixels, sites, states, i, members[i + 1], frozen=frozen)
             for i in range(len(sites) - 1)]
    m, *pairs = to_host([metric(ablated_rows(loaded, pixels, sites, keep, None, baseline=baseline)), *pairs])
    whole = [concept_host(h, c, n) for h, c, n in zip(host, codes, concepts)]
    places = [Place(site.block, site.grid, site.class_token) for site in sites]
    edges, passed = _edges(places, host, members, pairs, concepts, edge_share=edge_share)
    graph = [*_nodes(places, host, codes, members, concepts, names),
             *(Node(id=unread_id(places[i + 1].block), kind=UNREAD, name="not read by its dictionary", effect=total,
                    block=places[i + 1].block) for i, total in enumerate(passed) if total is not None),
             Node(id=LOGIT, kind="logit", name=metric.describe(loaded.labels), effect=value)]
    result = Circuit(**fixed_header(loaded, sites, states, whole, metric, value=value, baseline=baseline,
                                    method=method, steps=steps, frozen=frozen, edge_share=edge_share),
                     faithful=faithful, nodes=graph, edges=edges,
                     notes=[*notes_of(sites, states, whole, floor=floor, frozen=frozen, method=method,
                                      baseline=baseline), *([why] if why else []), POSITIONS_NOTE,
                            *([] if place is None else [PLACE_NOTE])])
    result.faithfulness = prefixes.report(size, faithful=faithful, without_circuit=float(m[0]),
                                          errors_kept=(float(m[1]), float(m[2])))
    return result


POSITIONS_NOTE = ("Nodes per position: each is a concept (or a dictionary's error) at one cell of the photo, its "
                  "effect that cell's share of the concept's; taking a node out sets that cell's code alone to its "
                  "baseline. An edge is how much a node at one cell moves a node of the next dictionary at another "
                  "cell, as that one acts on the answer.")


PLACE_NOTE = ("The circuit of one place: only the nodes at the clicked cell (at each block, the cell of its grid "
              "under it) are ranked and taken out; every node elsewhere stays as the photo made it, in m(∅) too. F is "
              "(m(C) - m(∅)) / (m(M) - m(∅)) with m(∅) every node at that cell at its baseline: the share of what "
              "happens there that the circuit carries.")


def cell_hosts(states: Sequence[SiteState]) -> tuple[list[OnHost], list[np.ndarray]]:
    """Per site its nodes per position as one vector, row t's concepts then its error at t (n + 1) + c (what
    `prefixes` ranks, `prefixes.split_cells`): their effects and activations (a code, an error's norm) in one
    `OnHost` with no error node of its own; and the site's codes (rows x n). One transfer."""
    parts = []
    for state in states:
        parts += [torch.cat([state.concept_effects, state.error_effects[:, None]], 1).reshape(-1),
                  torch.cat([state.codes[0], state.error[0].norm(dim=-1)[:, None]], 1).reshape(-1), state.codes[0]]
    values = to_host(parts)
    host = [OnHost(effects=effects, estimates=effects, activations=activations, error_effect=0.0,
                   error_map=np.zeros(len(codes)), error_activation=0.0)
            for effects, activations, codes in zip(*[iter(values)] * 3)]
    return host, values[2::3]


def concept_host(host: OnHost, codes: np.ndarray, n: int) -> OnHost:
    """A site's nodes per position summed into its whole concepts and error (`host.OnHost` as `circuit` reads it)."""
    effects = host.effects.reshape(-1, n + 1)
    norms = host.activations.reshape(-1, n + 1)[:, n]
    return OnHost(effects=effects[:, :n].sum(0), estimates=effects[:, :n].sum(0), activations=codes.sum(0),
                  error_effect=float(effects[:, n].sum()), error_map=effects[:, n], error_activation=float(norms.sum()))


def _counted(prefixes: Prefixes, concepts: Sequence[int]) -> Prefixes:
    """`prefixes` with `concept_counts` telling the nodes per position that are concepts from the errors."""
    is_concept = np.zeros(prefixes.ranked, dtype=np.int64)
    for where, n in zip(prefixes.positions, concepts):
        ranked = np.flatnonzero(np.isfinite(where.concepts) & (where.concepts >= 0))
        is_concept[where.concepts[ranked].astype(np.int64)] = ranked % (n + 1) != n
    return replace(prefixes, concept_counts=np.concatenate([[0], np.cumsum(is_concept)]))


def _pair_edges(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState], i: int,
                targets: list[int], *, frozen: bool) -> Tensor:
    """Into each of `targets` (site i + 1's nodes per position) and what it does not read (the last row), from every
    node per position of site i: (targets + 1) x rows (n + 1), on the device."""
    concept_edges, error_edges = edges_between(loaded, pixels, (sites[i], states[i]), (sites[i + 1], states[i + 1]),
                                               targets, unread=True, frozen=frozen, cells=True)
    return torch.cat([concept_edges, error_edges[..., None]], 2).flatten(1)


def _name(place: Place, flat: int, n: int, named: dict[int, str] | None) -> tuple[int | None, int, str]:
    """(concept or None for the error, row, the node's name: '#613 @ (2, 3)')."""
    row, c = divmod(flat, n + 1)
    if c == n:
        return None, row, f"error @ {at_cell(place, row)}"
    return c, row, f"{(named or {}).get(c) or f'#{c}'} @ {at_cell(place, row)}"


def _nodes(places: Sequence[Place], host: Sequence[OnHost], codes: Sequence[np.ndarray], members: Sequence[list[int]],
           concepts: Sequence[int], names) -> list[Node]:
    """The photo and each site's nodes per position in the circuit, strongest first."""
    nodes = [Node(id=INPUT, kind="input", name="the photo")]
    for s, place in enumerate(places):
        n = concepts[s]
        for flat in members[s]:
            concept, row, name = _name(place, flat, n, names[s] if names else None)
            effects = host[s].effects.reshape(-1, n + 1)[:, n if concept is None else concept]
            values = effects if concept is None else codes[s][:, concept]
            where, token = (values[1:].tolist(), float(values[0])) if place.class_token else (values.tolist(), None)
            nodes.append(Node(id=position_id(place, concept, row), kind="error" if concept is None else "concept",
                              name=name, effect=float(host[s].effects[flat]), block=place.block, concept=concept,
                              activation=float(host[s].activations[flat]), grid=place.grid, map=where,
                              class_token=token, in_circuit=True if concept is None else None, position=row,
                              effect_map=None if concept is None else
                              (effects[1:] if place.class_token else effects).tolist()))
    return nodes


def _edges(places: Sequence[Place], host: Sequence[OnHost], members: Sequence[list[int]], pairs: Sequence[np.ndarray],
           concepts: Sequence[int], *, edge_share: float) -> tuple[list[Edge], list[float | None]]:
    """The photo's edges into the first site's nodes (their effects), each pair's kept by each target's absolute
    inflow from every upstream node per position, the last site's into the metric (their effects); and per pair the
    total the upstream site passes the downstream dictionary by (None where no edge into it is kept)."""
    def ids(s: int) -> list[str]:
        return [position_id(places[s], *_name(places[s], flat, concepts[s], None)[:2]) for flat in members[s]]

    edges = [Edge(INPUT, target, float(host[0].effects[flat])) for target, flat in zip(ids(0), members[0])]
    passed: list[float | None] = []
    for i, weights in enumerate(pairs):
        sources = ids(i)
        targets = [*ids(i + 1), unread_id(places[i + 1].block)]
        for target, row in zip(targets, weights):
            inflow = float(np.abs(row).sum())
            edges += [Edge(source, target, float(row[flat])) for source, flat in zip(sources, members[i])
                      if inflow > 0 and abs(row[flat]) >= edge_share * inflow]
        kept = any(e.target == targets[-1] for e in edges)
        passed.append(float(weights[-1].sum()) if kept else None)
    last = len(places) - 1
    edges += [Edge(source, LOGIT, float(host[last].effects[flat])) for source, flat in zip(ids(last), members[last])]
    return edges, passed
