"""A circuit as data: its nodes and edges, how they are pruned, and the JSON a graph is written as.

Pruning. Every site's nodes decompose the whole answer on their own (with integrated gradients a site's effects
add up to m(x) - m(site at baseline)), so the share is taken site by site: a site keeps the fewest concepts, by
|effect| largest first, whose |effects| add up to `share` of the site's total |concept effect| (at most `most`, none
that does nothing); its error node is always drawn, so what the dictionary misses stays in view. An edge into a
node is kept when its |weight| is at least `edge_share` of that node's whole absolute inflow (from every upstream
node, kept or not). circuit-tracer prunes the same two ways, by cumulative influence on the logits
(`prune_graph`: node_threshold 0.8, edge_threshold 0.98); here a node's effect is already its influence on m.

The JSON (one a graph, `Circuit.to_json`): the model, the metric and its value, the baseline, the method, whether
attention was held fixed, the sites (which dictionary each block's nodes come from), the nodes (id, kind: concept,
error, input or logit; block, concept number, name, effect, activation, and where it fires: the site's grid and
the node's value at each of its cells, the class token's apart), the edges (source, target, weight), the
faithfulness and the check against activation patching, and the graph's size.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

SHARE = 0.8         # of each site's total absolute concept effect
EDGE_SHARE = 0.05   # of each node's absolute inflow
MOST = 12           # concepts a site shows at most: a column a person can read
DIGITS = 5          # significant digits kept in the JSON


def kept_concepts(effects: np.ndarray | Sequence[float], *, share: float = SHARE, most: int = MOST,
                  floor: float = 0.0) -> list[int]:
    """The fewest concepts, largest |effect| first, holding `share` of the total |effect| (at most `most`; none
    whose |effect| is `floor` or less: rounding's size, nothing a concept does). `effects` are on the host."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be from 0 to 1, not {share}")
    size = np.abs(np.asarray(effects, dtype=np.float64))
    size[size <= floor] = 0
    total = size.sum()
    if share == 0 or total == 0:
        return []
    order = np.argsort(-size, kind="stable")   # largest first, ties in concept order
    held = np.cumsum(size[order]) / total
    count = int(np.searchsorted(held, share - 1e-6)) + 1   # rounding: not one more
    return [int(c) for c in order[:min(count, most)] if size[c] > 0]


def node_id(block: int, concept: int | None) -> str:
    """'b3/c394' for a concept, 'b3/error' for a site's error node."""
    return f"b{block}/error" if concept is None else f"b{block}/c{concept}"


INPUT, LOGIT = "input", "logit"


@dataclass(frozen=True)
class Node:
    """A node of the graph: a concept at a block (its codes summed over the rows it fires on), a block's error, the
    photo (input) or the metric (logit); its effect on the metric, and where it is on the photo (`map` over
    `grid`, the class token's value apart)."""
    id: str
    kind: str                       # concept, error, input, logit
    name: str
    effect: float | None = None     # on the metric (input, logit: None)
    block: int | None = None
    concept: int | None = None
    activation: float | None = None  # a concept's codes summed over its rows; an error's norm summed
    grid: tuple[int, int] | None = None
    map: list[float] | None = None   # the node on the site's grid (row-major): codes, or the error's effect per row
    class_token: float | None = None  # its value at the class token, where the site reads one


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
    target: int
    target_label: str
    contrast: int | None
    contrast_label: str | None
    value: float                      # m on the photo
    baseline: str
    method: str
    attention: str                    # held fixed, or the model's own
    errors: str                       # kept or removed when faithfulness is measured
    share: float
    edge_share: float
    sites: list[dict]
    nodes: list[Node]
    edges: list[Edge]
    faithfulness: dict = field(default_factory=dict)
    patching: dict = field(default_factory=dict)
    candidates: int = 0               # concept nodes there were to choose from (every site's concepts)
    notes: list[str] = field(default_factory=list)   # what a reader must know to read it, in words

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
        concepts = sum(n.kind == "concept" for n in self.nodes)
        return {"nodes": len(self.nodes), "concept_nodes": concepts, "edges": len(self.edges),
                "concepts_to_choose_from": self.candidates}

    def to_json(self) -> dict:
        """The graph as plain data (numbers to DIGITS significant digits)."""
        data = {k: v for k, v in asdict(self).items() if k not in ("nodes", "edges")}
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
