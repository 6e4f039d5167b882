"""A circuit as data: its nodes and edges, and the JSON a graph is written as.

Size. The circuit is the smallest prefix of every node ranked by |effect| across all sites whose faithfulness F
reaches `FAITHFUL` (`circuit.py`); each site draws its strongest `MOST` circuit concepts one by one and the rest as
one group node ("N more concepts", `concepts` lists them), beside its error node (`in_circuit` says whether the
error is one of the circuit's nodes). An edge into a node is kept when its |weight| is at least `edge_share` of that
node's whole absolute inflow (from every upstream node, in the circuit or not); a group's edges are its members'
summed. circuit-tracer prunes by cumulative influence on the logits (`prune_graph`: node_threshold 0.8,
edge_threshold 0.98); here a node's effect is already its influence on m, and the size is set by F itself.

The JSON (one a graph, `Circuit.to_json`): the model, the metric (its words and kind) and its value, the baseline,
the method, whether attention was held fixed, the sites (which dictionary each block's nodes come from), the nodes
(id, kind: concept, group, error, input or logit; block, concept number, name, effect, activation, and where it
fires: the site's grid and the node's value at each of its cells, the class token's apart; a photo's concept node
its effect at each cell too; a node per position its row, `positions.py`), the edges (source, target, weight), the
faithfulness (F, the three values it divides, the curve at the sizes measured) and the check against activation
patching, and the graph's size.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from .host import OnHost

if TYPE_CHECKING:
    from .adjacency import Adjacency

FAITHFUL = 0.6      # the F the circuit must reach
EDGE_SHARE = 0.05   # of each node's absolute inflow
MOST = 12           # concepts a site draws one by one: a column a person can read
DIGITS = 5          # significant digits kept in the JSON
GROUP = "group"     # the kind of a site's node standing for its circuit concepts beyond the drawn ones
UNREAD = "unread"   # the kind of a site's node standing for what its dictionary does not read of the block


def node_id(block: int, concept: int | None) -> str:
    """'b3/c394' for a concept, 'b3/error' for a site's error node."""
    return f"b{block}/error" if concept is None else f"b{block}/c{concept}"


def cell_of(place: Place, row: int) -> tuple[int, int] | None:
    """A site's row -> its (row, column) on the site's grid, or None for the class token."""
    if place.class_token:
        if row == 0:
            return None
        row -= 1
    return divmod(row, place.grid[1])


def at_cell(place: Place, row: int) -> str:
    """Where a site's row is, in words: '(2, 3)' (grid row, column) or 'the class token'."""
    cell = cell_of(place, row)
    return "the class token" if cell is None else f"({cell[0]}, {cell[1]})"


def position_id(place: Place, concept: int | None, row: int) -> str:
    """'b3/c394@2,3' for a concept at one cell, 'b3/error@2,3' for the error there ('@cls': the class token)."""
    cell = cell_of(place, row)
    return f"{node_id(place.block, concept)}@{'cls' if cell is None else f'{cell[0]},{cell[1]}'}"


def group_id(block: int) -> str:
    """'b3/more': a site's group node."""
    return f"b{block}/more"


def unread_id(block: int) -> str:
    """'b3/unread': what a site's dictionary does not read of its block's tokens."""
    return f"b{block}/unread"


INPUT, LOGIT = "input", "logit"


@dataclass(frozen=True)
class Place:
    """What drawing a site's nodes needs of it: its block, the grid of its rows on the photo, whether row 0 is the
    class token (a `sites.Site` has the same three)."""
    block: int
    grid: tuple[int, int]
    class_token: bool


@dataclass(frozen=True)
class Node:
    """A node of the graph: a concept at a block (its codes summed over the rows it fires on), a block's error, the
    photo (input) or the metric (logit); its effect on the metric, and where it is on the photo (`map` over
    `grid`, the class token's value apart)."""
    id: str
    kind: str                       # concept, group, error, unread, input, logit
    name: str
    effect: float | None = None     # on the metric (input, logit: None)
    block: int | None = None
    concept: int | None = None
    activation: float | None = None  # a concept's codes summed over its rows; an error's norm summed
    grid: tuple[int, int] | None = None
    map: list[float] | None = None   # the node on the site's grid (row-major): codes, or the error's effect per row
    class_token: float | None = None  # its value at the class token, where the site reads one
    concepts: list[int] | None = None  # a group's members
    in_circuit: bool | None = None   # an error node: whether it is one of the circuit's nodes
    effect_map: list[float] | None = None   # a concept's (a group's) effect at each grid cell, row-major: the
    #                                         class token's share is `effect` less their sum (an error's: `map`)
    position: int | None = None      # a node per position (`positions.py`): its row at the site (`cell_of`)


@dataclass(frozen=True)
class Edge:
    """How much node `source` moves node `target` (for the logit: the metric), in the metric's units."""
    source: str
    target: str
    weight: float


@dataclass
class Circuit:
    """One photo's circuit through one model, pruned, with how faithful it is."""
    model: str
    metric: str
    metric_kind: str                  # logit, logit minus mean, contrast (`effects.METRICS`)
    target: int
    target_label: str
    contrast: int | None
    contrast_label: str | None
    value: float                      # m on the photo
    baseline: str
    method: str
    attention: str                    # held fixed, or the model's own
    faithful: float                   # the F the circuit was chosen to reach
    edge_share: float
    sites: list[dict]
    nodes: list[Node]
    edges: list[Edge]
    faithfulness: dict = field(default_factory=dict)
    patching: dict = field(default_factory=dict)
    candidates: int = 0               # concept nodes there were to choose from (every site's concepts)
    notes: list[str] = field(default_factory=list)   # what a reader must know to read it, in words
    # a photo's circuit: what it was pruned from, to be pruned again at another size on the host (`adjacency.py`)
    adjacency: Adjacency | None = field(default=None, repr=False, compare=False)

    def node(self, node: str) -> Node:
        return next(n for n in self.nodes if n.id == node)

    def inputs(self, node: str) -> list[Edge]:
        """The edges into `node`, strongest first."""
        return sorted((e for e in self.edges if e.target == node), key=lambda e: -abs(e.weight))

    def outputs(self, node: str) -> list[Edge]:
        """The edges out of `node`, strongest first."""
        return sorted((e for e in self.edges if e.source == node), key=lambda e: -abs(e.weight))

    @property
    def size(self) -> dict:
        concepts = sum(n.kind == "concept" for n in self.nodes) + sum(len(n.concepts or ()) for n in self.nodes)
        return {"nodes": len(self.nodes), "concept_nodes": concepts, "edges": len(self.edges),
                "concepts_to_choose_from": self.candidates}

    def to_json(self) -> dict:
        """The graph as plain data (numbers to DIGITS significant digits)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("nodes", "edges", "adjacency")}
        data["nodes"] = [{k: _round(v) for k, v in asdict(n).items() if v is not None} for n in self.nodes]
        data["edges"] = [{**asdict(e), "weight": _round(e.weight)} for e in self.edges]
        data["size"] = self.size
        return _round(data)


def _round(value):
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def graph_edges(sites: Sequence[Place], host: Sequence[OnHost], tables: Sequence[np.ndarray],
                drawn: Sequence[list[int]], grouped: Sequence[list[int]], *, edge_share: float
                ) -> tuple[list[Edge], list[float | None]]:
    """The edges between the drawn nodes from their tables (`Adjacency.tables`, `classes.edge_tables` read to the host:
    per site the drawn concepts' maps, then per pair one row a downstream target and one column a drawn upstream
    source, then the row's total and absolute inflow over every upstream node): the input's into the first site (each
    node's effect), each consecutive pair's (pruned by each target's inflow), the last site's into the metric; and
    per site the effect of the upstream site that passes its dictionary by (None where no edge into it is kept)."""
    def ids(s: int, unread: bool = False) -> list[str]:
        block = sites[s].block
        return [*(node_id(block, c) for c in drawn[s]), *([group_id(block)] if grouped[s] else []),
                node_id(block, None), *([unread_id(block)] if unread else [])]

    def effects(s: int) -> list[float]:
        group = [float(host[s].effects[grouped[s]].sum())] if grouped[s] else []
        return [*(float(host[s].effects[c]) for c in drawn[s]), *group, host[s].error_effect]

    edges = [Edge(INPUT, target, weight) for target, weight in zip(ids(0), effects(0))]
    unread: list[float | None] = [None]
    for i, weights in enumerate(tables[len(sites):]):   # targets x (sources, the error, the total, the inflow)
        for target, (*row, _, inflow) in zip(ids(i + 1, unread=True), weights.tolist()):
            edges += [Edge(source, target, weight) for source, weight in zip(ids(i), row)
                      if inflow > 0 and abs(weight) >= edge_share * inflow]
        passed = any(e.target == unread_id(sites[i + 1].block) for e in edges)
        unread.append(float(weights[-1, -2]) if passed else None)   # the unread row's total over every source
    last = len(sites) - 1
    edges += [Edge(source, LOGIT, weight) for source, weight in zip(ids(last), effects(last))]
    return edges, unread


def graph_nodes(sites: Sequence[Place], host: Sequence[OnHost], maps: Sequence[np.ndarray], drawn: Sequence[list[int]],
                grouped: Sequence[list[int]], errors_in: Sequence[bool], unread: Sequence[float | None], *,
                metric_name: str, value: float, names: Sequence[dict[int, str] | None] | None,
                effect_maps: Sequence[np.ndarray] | None = None) -> list[Node]:
    """The graph's nodes: the photo, each site's drawn concepts, its group, its error and what passes it by, the
    metric. `maps` (and `effect_maps`, where known): per site the drawn concepts' codes (effects) at its rows, then
    the group's."""
    nodes = [Node(id=INPUT, kind="input", name="the photo")]
    for s, site in enumerate(sites):
        named = (names[s] if names else None) or {}

        def effect_map(i: int, s=s, site=site) -> list[float] | None:
            return None if effect_maps is None else _grid_values(site, effect_maps[s][:, i])[0]
        nodes += [_concept_node(site, host[s], c, maps[s][:, i], named.get(c), effect_map(i))
                  for i, c in enumerate(drawn[s])]
        if grouped[s]:
            nodes.append(_group_node(site, host[s], grouped[s], maps[s][:, -1], effect_map(-1)))
        nodes.append(_error_node(site, host[s], in_circuit=errors_in[s]))
        if unread[s] is not None:   # the upstream site's effect that passes this dictionary by
            nodes.append(Node(id=unread_id(site.block), kind=UNREAD, name="not read by its dictionary",
                              effect=unread[s], block=site.block))
    nodes.append(Node(id=LOGIT, kind="logit", name=metric_name, effect=value))
    return nodes


def _grid_values(site: Place, values: np.ndarray) -> tuple[list[float], float | None]:
    """A rows-long vector -> (its grid cells row-major, its class token's value or None)."""
    if site.class_token:
        return values[1:].tolist(), float(values[0])
    return values.tolist(), None


def _concept_node(site: Place, host: OnHost, concept: int, codes: np.ndarray, name: str | None,
                  effect_map: list[float] | None) -> Node:
    where, class_token = _grid_values(site, codes)
    return Node(id=node_id(site.block, concept), kind="concept", name=name or f"concept {concept}",
                effect=float(host.effects[concept]), block=site.block, concept=concept,
                activation=float(host.activations[concept]), grid=site.grid, map=where, class_token=class_token,
                effect_map=effect_map)


def _group_node(site: Place, host: OnHost, concepts: list[int], codes: np.ndarray,
                effect_map: list[float] | None) -> Node:
    where, class_token = _grid_values(site, codes)
    return Node(id=group_id(site.block), kind=GROUP, name=f"{len(concepts)} more concepts",
                effect=float(host.effects[concepts].sum()), block=site.block, concepts=concepts,
                activation=float(host.activations[concepts].sum()), grid=site.grid, map=where, class_token=class_token,
                effect_map=effect_map)


def _error_node(site: Place, host: OnHost, *, in_circuit: bool) -> Node:
    where, class_token = _grid_values(site, host.error_map)
    return Node(id=node_id(site.block, None), kind="error", name="error",
                effect=host.error_effect, block=site.block, activation=host.error_activation, grid=site.grid,
                map=where, class_token=class_token, in_circuit=in_circuit)
