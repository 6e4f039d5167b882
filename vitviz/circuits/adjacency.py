"""A photo's circuit kept whole, to be pruned again at any size on the host with no model pass.

`circuit.circuit` measures more than the circuit it draws: every ranked node (each concept and error node of every
site whose |effect| is above rounding, largest first), the edges between consecutive sites into each of the first
`held` ranked nodes and what the downstream site does not read, from every upstream node (the same edges as
`effects.edges_between` gives the drawn graph), and m(k), so F, at every prefix size up to `held` (`Prefixes.exact`;
`prefixes.RESIZE` times the circuit's own, or with `every` the whole ranking) and on the grid beyond. That is an
`Adjacency`; `resized` prunes it to k nodes (or to the smallest reaching a faithfulness) exactly as `circuit` prunes
its own, which is how `circuit` builds the graph it returns: the same nodes, groups, edges, F and its three values.
Completeness and the errors-kept variant need forwards of their own and are measured at the circuit's size only.

The file (`save_adjacency`, `load_adjacency`: safetensors, never a pickle), `circuit-<model>.adjacency.safetensors`
beside the graph's JSON (`vitviz circuits PHOTO --out DIR`); every float in float64, as computed:

    ranked            N x 2 int64      each ranked node, strongest first: (its site, its concept; -1 the error node)
    counts, m         K int64, K f64   the prefix sizes measured (0 to N, increasing) and m with the first k kept
    site<s>.effects   n f64            each concept's effect on m (attribution patching or integrated gradients)
    site<s>.activations  n f64         each concept's codes summed over the site's rows
    site<s>.error     2 f64            the error node's effect and its norm summed over the rows
    site<s>.error_map rows f64         the error's effect at each row
    site<s>.maps      rows x c f64     the codes at each row of the site's concepts among the first `held` ranked
                                       nodes (c of them, in concept order): where each fires
    site<s>.effect_maps  rows x c f64  their effects on m at each row (they sum to `effects`): where each acts
    pair<i>.sources   S int64          the concepts of site i with an edge into site i + 1 (every other one's is 0)
    pair<i>.edges     (c + 2) x (S + 1) f64   rows: site i + 1's concepts above (in concept order), its error, what
                                       it does not read; columns: the sources, then site i's error
    __metadata__ {"vitviz_circuit_adjacency": JSON}: format, version, sha256 (of the tensors), held, spread (the
        standard deviation of the photo's logits), floor, and circuit: the graph's fields no size changes (model,
        metric, value m(M), baseline, method, sites, the patching check, the notes), most, faithful (the F it was
        drawn for), names (per site, its concepts' names), measured (its size, and m without the circuit and with
        every error kept, there)
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save as save_tensors
from torch import Tensor

from ..concepts.files.own import checksum, read_checked
from ..concepts.kinds.dictionary import ConceptsError
from ..files import write_atomic
from .effects import SiteState, edges_between
from .graph import Circuit, Place, graph_edges, graph_nodes
from .host import OnHost
from .prefixes import Position, Prefixes, measured, placed
from .sites import Site

FORMAT, VERSION = "vitviz-circuit-adjacency", 2   # 2: the effect maps
HEADER_KEY = "vitviz_circuit_adjacency"
FIXED = ("model", "metric", "metric_kind", "target", "target_label", "contrast", "contrast_label", "value", "baseline",
         "method", "attention", "edge_share", "sites", "patching", "candidates")   # a Circuit's fields no size changes


@dataclass(frozen=True)
class Adjacency:
    """What `resized` prunes a photo's circuit from (the module docstring names each part)."""
    header: dict                 # FIXED's fields, notes, most, faithful, names, measured
    places: list[Place]          # per site
    host: list[OnHost]           # per site: its concepts' effects and activations, its error node's
    ranked: np.ndarray           # N x 2: (site, concept or -1), strongest first
    held: int                    # the first `held` ranked nodes have their maps and their edges in
    maps: list[np.ndarray]       # per site: rows x its concepts among them, in concept order
    effect_maps: list[np.ndarray]   # per site: their effects at each row, the same columns
    sources: list[np.ndarray]    # per pair: the upstream concepts with an edge
    edges: list[np.ndarray]      # per pair: (downstream concepts held, error, unread) x (sources, error)
    counts: np.ndarray           # prefix sizes measured
    m: np.ndarray
    spread: float
    floor: float

    @cached_property
    def prefixes(self) -> Prefixes:
        """m at the sizes measured along the ranking, and what F is made of."""
        ranking = [(abs(self.host[s].error_effect if c < 0 else float(self.host[s].effects[c])), s, c)
                   for s, c in self.ranked.tolist()]
        return measured(placed(ranking, [h.effects.size for h in self.host]), ranking, self.counts, self.m,
                        value=self.header["value"], spread=self.spread, floor=self.floor)

    def held_concepts(self, s: int) -> np.ndarray:
        """Site s's concepts among the first `held` ranked nodes, in concept order: the columns of its maps."""
        return held_of(self.prefixes.positions[s], self.held)

    def columns(self) -> list[dict[int, int]]:
        """Per site: concept -> its column in the maps."""
        return [{int(c): i for i, c in enumerate(self.held_concepts(s))} for s in range(len(self.places))]

    def site_tables(self, maps: Sequence[np.ndarray], drawn: Sequence[list[int]], grouped: Sequence[list[int]]
                    ) -> list[np.ndarray]:
        """Per site the drawn concepts' columns of `maps` (`maps` or `effect_maps`), then the group's summed."""
        columns, tables = self.columns(), []
        for s, values in enumerate(maps):
            group = [values[:, [columns[s][c] for c in grouped[s]]].sum(1)] if grouped[s] else []
            cells = [*(values[:, columns[s][c]] for c in drawn[s]), *group]
            tables.append(np.stack(cells, 1) if cells else np.zeros((len(values), 0)))
        return tables

    def tables(self, drawn: Sequence[list[int]], grouped: Sequence[list[int]]) -> list[np.ndarray]:
        """The drawn nodes' tables as `graph.graph_edges` and `graph_nodes` read them: per site the drawn concepts'
        codes at its rows (then the group's, summed), then per pair one row a downstream target (the drawn concepts,
        the group, the error, what the site does not read) and one column a drawn upstream source (the concepts, the
        group, the error), then each row's total over every upstream node and its absolute inflow."""
        columns = self.columns()
        tables = self.site_tables(self.maps, drawn, grouped)
        for i, (sources, edges) in enumerate(zip(self.sources, self.edges)):
            held = len(columns[i + 1])   # rows: the drawn downstream concepts, the group, the error, the unread
            group = [edges[[columns[i + 1][c] for c in grouped[i + 1]]].sum(0)] if grouped[i + 1] else []
            rows = np.stack([*(edges[columns[i + 1][c]] for c in drawn[i + 1]), *group, *edges[held:]])
            at = {int(c): j for j, c in enumerate(sources)}   # a concept with no edge is no source: its column is 0

            def column(concepts: list[int], rows=rows, at=at) -> np.ndarray:
                return rows[:, [at[c] for c in concepts if c in at]].sum(1)
            cells = [column([c]) for c in drawn[i]] + ([column(grouped[i])] if grouped[i] else [])
            tables.append(np.stack([*cells, rows[:, -1], rows.sum(1), np.abs(rows).sum(1)], 1))
        return tables


def held_of(position: Position, held: int) -> np.ndarray:
    """A site's concepts among the first `held` ranked nodes, in concept order."""
    return np.flatnonzero(position.concepts < held)


def device_parts(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                 positions: Sequence[Position], held: int, *, frozen: bool) -> list[Tensor]:
    """On the device, queued and none read: per site its codes at its rows (rows x n), then per site its concepts'
    effects at its rows (rows x n), then per pair the edges into
    each of the downstream site's concepts among the first `held` ranked nodes (in concept order), its error and what
    it does not read, from every upstream concept and the error ((c + 2) x (n + 1)): one forward and one backward
    batched over the targets a pair (`effects.edges_between`)."""
    parts = [*(state.codes[0] for state in states), *(state.concept_effects for state in states)]
    for i in range(len(sites) - 1):
        targets = [*held_of(positions[i + 1], held).tolist(), None]
        concept_edges, error_edges = edges_between(loaded, pixels, (sites[i], states[i]), (sites[i + 1], states[i + 1]),
                                                   targets, unread=True, frozen=frozen)
        parts.append(torch.cat([concept_edges, error_edges[:, None]], 1))
    return parts


def kept(header: dict, places: list[Place], host: list[OnHost], prefixes: Prefixes, held: int,
         parts: Sequence[np.ndarray]) -> Adjacency:
    """The adjacency from `device_parts` read to the host: each site's maps and effect maps of its held concepts, each
    pair's edges from the upstream concepts that have any (every other one's are 0: its codes are at its baseline)."""
    codes, effects, pairs = parts[:len(places)], parts[len(places):2 * len(places)], parts[2 * len(places):]
    ranked = np.zeros((prefixes.ranked, 2), dtype=np.int64)
    for s, where in enumerate(prefixes.positions):
        concepts = np.flatnonzero(np.isfinite(where.concepts))
        ranked[where.concepts[concepts].astype(np.int64)] = np.stack([np.full_like(concepts, s), concepts], 1)
        if np.isfinite(where.error):
            ranked[int(where.error)] = (s, -1)
    sources = [np.flatnonzero(np.abs(edges[:, :-1]).sum(0) > 0) for edges in pairs]
    return Adjacency(header=header, places=places, host=host, ranked=ranked, held=held,
                     maps=[c[:, held_of(where, held)] for c, where in zip(codes, prefixes.positions)],
                     effect_maps=[e[:, held_of(where, held)] for e, where in zip(effects, prefixes.positions)],
                     sources=sources, edges=[edges[:, [*chosen, -1]] for edges, chosen in zip(pairs, sources)],
                     counts=prefixes.counts, m=prefixes.m, spread=prefixes.spread, floor=prefixes.floor)


def resized(adjacency: Adjacency, *, nodes: int | None = None, faithful: float | None = None) -> Circuit:
    """The circuit of `nodes` ranked nodes, or (without) of the smallest number reaching `faithful` (by default the
    one it was drawn for), pruned from `adjacency` on the host exactly as `circuit.circuit` prunes its own: its
    nodes, groups and edges, F and the three values it divides. Refused in words: a size it holds no edges or no m
    for."""
    header = adjacency.header
    faithful = header["faithful"] if faithful is None else faithful
    prefixes = adjacency.prefixes
    size, why = prefixes.chosen(faithful, nodes)
    if size > adjacency.held or size not in set(prefixes.counts.tolist()):
        asked = f"{size} nodes" if nodes is not None else f"{size} nodes (the smallest reaching F = {faithful:.2f})"
        raise ConceptsError(f"This circuit was kept with every size up to {prefixes.exact} nodes; one of {asked} needs "
                            f"the model again (`vitviz circuits --every-size` keeps every size).")
    positions = prefixes.positions
    members = [[int(c) for c in np.argsort(where.concepts) if where.concepts[c] < size] for where in positions]
    drawn, grouped = [m[:header["most"]] for m in members], [m[header["most"]:] for m in members]
    tables = adjacency.tables(drawn, grouped)
    edges, unread = graph_edges(adjacency.places, adjacency.host, tables, drawn, grouped,
                                edge_share=header["edge_share"])
    graph = graph_nodes(adjacency.places, adjacency.host, tables[:len(positions)], drawn, grouped,
                        [bool(where.error < size) for where in positions], unread, metric_name=header["metric"],
                        value=header["value"], names=header["names"],
                        effect_maps=adjacency.site_tables(adjacency.effect_maps, drawn, grouped))
    at = header["measured"]
    here = at["nodes"] == size
    notes = [*header["notes"], *([why] if why else []), *([] if here else [
        f"Pruned again on the host to {size} nodes: completeness and the variant that keeps every error node were "
        f"measured for the circuit of {at['nodes']} nodes only."])]
    result = Circuit(**{k: header[k] for k in FIXED}, faithful=faithful, nodes=graph, edges=edges, notes=notes,
                     adjacency=adjacency)
    result.faithfulness = prefixes.report(size, faithful=faithful, without_circuit=at["without_circuit"] if here
                                          else None, errors_kept=(at["errors_kept"][0], at["errors_kept"][1] if here
                                                                  else None))
    return result


def save_adjacency(adjacency: Adjacency, path: str | Path) -> Path:
    """`adjacency` written as one safetensors file (the module docstring), atomically; -> the file."""
    arrays = {"ranked": adjacency.ranked, "counts": adjacency.counts, "m": adjacency.m}
    for s, (host, maps, effect_maps) in enumerate(zip(adjacency.host, adjacency.maps, adjacency.effect_maps)):
        arrays |= {f"site{s}.effects": host.effects, f"site{s}.activations": host.activations,
                   f"site{s}.error": np.array([host.error_effect, host.error_activation]),
                   f"site{s}.error_map": host.error_map, f"site{s}.maps": maps, f"site{s}.effect_maps": effect_maps}
    for i, (sources, edges) in enumerate(zip(adjacency.sources, adjacency.edges)):
        arrays |= {f"pair{i}.sources": sources, f"pair{i}.edges": edges}
    tensors = {name: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64 if a.dtype.kind in "iu" else np.float64))
               for name, a in arrays.items()}
    header = {**adjacency.header, "names": [None if named is None else {str(c): name for c, name in named.items()}
                                            for named in adjacency.header["names"]]}
    meta = {"format": FORMAT, "version": VERSION, "sha256": checksum(tensors), "held": adjacency.held,
            "spread": adjacency.spread, "floor": adjacency.floor, "places": [
                [p.block, list(p.grid), p.class_token] for p in adjacency.places], "circuit": header}
    path = Path(path)
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(meta)}))
    return path


def load_adjacency(path: str | Path) -> Adjacency:
    """The adjacency in a file `save_adjacency` wrote, checked whole: a file that is not one, damaged, from a newer
    vitviz, or whose parts do not fit together is refused in words (`ConceptsError`)."""
    path = Path(path)
    tensors, meta = read_checked(path, key=HEADER_KEY, format=FORMAT, version=VERSION, what="circuit adjacency",
                                 again="write it again (`vitviz circuits PHOTO --out DIR`)")
    if meta["version"] < VERSION:
        raise ConceptsError(f"{path} was written by an older vitviz (format version {meta['version']}, without each "
                            f"concept's effect per cell): write it again (`vitviz circuits PHOTO --out DIR`).")
    try:
        return _checked(tensors, meta)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ConceptsError(f"{path} is not a sound circuit adjacency: {e}.") from None


def _checked(tensors: dict[str, Tensor], meta: dict) -> Adjacency:
    """The Adjacency of a file's tensors and header, each part checked against the others (ValueError, KeyError
    or TypeError naming what does not fit)."""
    header = dict(meta["circuit"])
    header["names"] = [None if named is None else {int(c): name for c, name in named.items()}
                       for named in header["names"]]
    places = [Place(int(block), (int(grid[0]), int(grid[1])), bool(token)) for block, grid, token in meta["places"]]
    sites = len(places)
    if sites < 1 or len(header["sites"]) != sites or len(header["names"]) != sites:
        raise ValueError(f"it describes {len(header['sites'])} sites and places {sites}")

    def array(name: str, dims: int, kind: str) -> np.ndarray:
        if name not in tensors:
            raise KeyError(f"it has no {name}")
        value = tensors[name].numpy()
        if value.ndim != dims or value.dtype.kind != kind or (kind == "f" and not np.isfinite(value).all()):
            raise ValueError(f"its {name} is not a finite {dims}-d array of {'floats' if kind == 'f' else 'integers'}")
        return value

    host, maps, effect_maps = [], [], []
    for s, site in enumerate(header["sites"]):
        effects, activations = array(f"site{s}.effects", 1, "f"), array(f"site{s}.activations", 1, "f")
        error, error_map = array(f"site{s}.error", 1, "f"), array(f"site{s}.error_map", 1, "f")
        maps.append(array(f"site{s}.maps", 2, "f"))
        effect_maps.append(array(f"site{s}.effect_maps", 2, "f"))
        if len(effects) != site["concepts"] or len(activations) != len(effects) or len(error) != 2 or \
                len(error_map) != site["rows"] or len(maps[-1]) != site["rows"] or \
                effect_maps[-1].shape != maps[-1].shape:
            raise ValueError(f"site {s}'s arrays do not fit its {site['concepts']} concepts and {site['rows']} rows")
        host.append(OnHost(effects=effects, estimates=effects, activations=activations, error_effect=float(error[0]),
                           error_map=error_map, error_activation=float(error[1])))
    ranked, counts, m = array("ranked", 2, "i"), array("counts", 1, "i"), array("m", 1, "f")
    n = len(ranked)
    if ranked.shape[1] != 2 or any(not 0 <= s < sites or not -1 <= c < len(host[s].effects)
                                   for s, c in ranked.tolist()):
        raise ValueError("its ranking names a site or a concept the file does not have")
    strength = [abs(host[s].error_effect if c < 0 else host[s].effects[c]) for s, c in ranked.tolist()]
    if len(set(map(tuple, ranked.tolist()))) != n or np.any(np.diff(strength) > 0) or \
            (n and min(strength) <= meta["floor"]):
        raise ValueError("its ranking is not each node above the floor once, strongest first")
    if len(m) != len(counts) or not len(counts) or counts[0] != 0 or counts[-1] != n or np.any(np.diff(counts) <= 0):
        raise ValueError(f"its prefix sizes do not rise from 0 to its {n} ranked nodes with one m each")
    adjacency = Adjacency(header=header, places=places, host=host, ranked=ranked, held=int(meta["held"]), maps=maps,
                          effect_maps=effect_maps,
                          sources=[array(f"pair{i}.sources", 1, "i") for i in range(sites - 1)],
                          edges=[array(f"pair{i}.edges", 2, "f") for i in range(sites - 1)], counts=counts, m=m,
                          spread=float(meta["spread"]), floor=float(meta["floor"]))
    if not 0 <= adjacency.held <= n:
        raise ValueError(f"it holds edges for {adjacency.held} of {n} ranked nodes")
    for s in range(sites):
        held = len(adjacency.held_concepts(s))
        if maps[s].shape[1] != held:
            raise ValueError(f"site {s} has maps of {maps[s].shape[1]} concepts for its {held} held ones")
        if s and adjacency.edges[s - 1].shape != (held + 2, len(adjacency.sources[s - 1]) + 1):
            raise ValueError(f"the edges into site {s} do not fit its {held} held concepts and their sources")
        if s and np.any((adjacency.sources[s - 1] < 0) | (adjacency.sources[s - 1] >= len(host[s - 1].effects))):
            raise ValueError(f"the edges into site {s} come from concepts site {s - 1} does not have")
    return adjacency

