"""A class's circuit over a data set: which concepts build a model's logit for a class across the class's images
(Marks et al.'s setting for classifiers), with how faithful it is and how sure that is.

Over the images x_1 .. x_N of the class (their labels, not the model's predictions), with the metric m the class's
logit minus the mean logit:

- a node's effect is its attribution-patching effect averaged over the images (so is an edge, a map, an
  activation): the graph is one model's average mechanism for the class;
- the nodes are ranked by |mean effect| across all sites, and F is measured at `SIZES` prefix sizes of that
  ranking (geometric, 0 and every node included) on every image;
- F over the data set is Marks et al.'s ratio of means,

      F(C) = (mean_i m_i(C) - mean_i m_i(∅)) / (mean_i m_i(M) - mean_i m_i(∅)),

  m_i(∅) with every concept and error node at its baseline; the circuit is the smallest measured size whose F
  reaches the target, and its 95 % interval comes from resampling the images (a percentile bootstrap,
  `BOOTSTRAP` draws with a fixed seed).

Three passes over the images, nothing read per image: the effects and maps summed on the device (one read), every
image's m at every size (one read), the edges of the drawn nodes summed (one read). Under torchrun the images are
dealt to the ranks and every sum is all-reduced, so 1 or N processes give the same file up to the floats' order.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .. import catalog
from ..concepts.kinds.dictionary import ConceptsError
from ..files import safe_name
from .circuit import NOTHING
from .effects import Metric, SiteState, attribution, check_metric, edges_between
from .graph import EDGE_SHARE, FAITHFUL, MOST, Circuit, Place, graph_edges, graph_nodes
from .host import OnHost, to_host
from .prefixes import SPREAD, prefix_rows, ranking
from .sites import Site, image_sites

SIZES = 24          # prefix sizes of the ranking measured on every image (geometric, with 0 and all)
BOOTSTRAP = 1000    # resamples of the images for F's interval
LEVEL = 0.95


def class_circuit(loaded, data, sites_for: Callable, *, target: int, indices: Sequence[int], baseline: str = "zero",
                  faithful: float = FAITHFUL, most: int = MOST, edge_share: float = EDGE_SHARE,
                  names: Sequence[dict[int, str] | None] | None = None, progress: bool = True, ranks=None) -> Circuit:
    """The circuit of class `target` (an index of the model's labels) over the images `indices` of `data` (the
    class's own: the caller picks them), each image's sites from `sites_for(trace, image)`. `ranks`
    (`vitviz.distributed.Ranks`): this process's share of the images under torchrun."""
    from tqdm import tqdm

    if not indices:
        raise ConceptsError("A class circuit needs at least one image of the class.")
    check_metric(Metric(target), loaded.labels)
    metric = Metric(target, centred=True)
    mine = list(indices) if ranks is None else ranks.mine(list(indices))
    shown = progress and (ranks is None or ranks.leader)
    images = []
    sums: list[Tensor] | None = None
    for i in tqdm(mine, desc=f"{loaded.name}: {loaded.labels[target]}'s images", unit="image", disable=not shown):
        pixels, trace, sites = image_sites(loaded, data.image(i), sites_for)
        value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, on_host=False)
        images.append((pixels, sites, states, value))
        parts = [value.double(), trace.logits[0].double().std()] + [
            t.double() for state in states for t in (state.effects, state.codes[0], state.error_effects,
                                                     state.error[0].norm(dim=-1).sum())]
        sums = parts if sums is None else [a + b for a, b in zip(sums, parts)]
    if sums is None:   # a rank without images still takes part in every sum
        raise ConceptsError("This process has no image of the class: use fewer processes than images.")
    n = len(indices)
    means = [t / n for t in _all_reduced(sums)]
    values = to_host(means)
    value, spread = float(values[0]), float(values[1])
    sites: list[Site] = images[0][1]   # the images are CIFAR-10's: one size, so one grid a site
    host = [OnHost(effects=effects, estimates=effects, activations=codes.sum(0), error_effect=float(error_map.sum()),
                   error_map=error_map, error_activation=float(norm))
            for effects, codes, error_map, norm in zip(*[iter(values[2:])] * 4)]
    floor = NOTHING * max(1.0, abs(value))
    positions, ranked = ranking(host, floor)
    sizes = np.unique(np.concatenate([[0, len(ranked)], np.round(np.geomspace(1, max(len(ranked), 1), SIZES))]))
    sizes = sizes.astype(np.int64)
    measured = torch.zeros(n, len(sizes) + 1, dtype=torch.float64, device=loaded.device)
    order = {index: row for row, index in enumerate(indices)}
    for i, (pixels, its_sites, _, value_on_device) in zip(mine, tqdm(  # m at every size, then m(M)
            images, desc=f"{loaded.name}: F at {len(sizes)} sizes", unit="image", disable=not shown)):
        m = metric(prefix_rows(loaded, pixels, its_sites, positions, sizes, baseline=baseline)).double()
        measured[order[i]] = torch.cat([m, value_on_device.double()[None]])
    measured = to_host(_all_reduced([measured]))[0]
    at_sizes, full = measured[:, :-1], measured[:, -1]
    curve = _ratio(at_sizes.mean(0), at_sizes[:, 0].mean(), full.mean())
    defined = abs(full.mean() - at_sizes[:, 0].mean()) >= max(SPREAD * spread, floor)
    reached = np.flatnonzero(curve >= faithful - 1e-9) if defined else np.zeros(0, dtype=np.int64)
    chosen = int(reached[0]) if reached.size else len(sizes) - 1
    size = int(sizes[chosen])
    members = [[int(c) for c in np.argsort(where.concepts) if where.concepts[c] < size] for where in positions]
    drawn, grouped = [m[:most] for m in members], [m[most:] for m in members]
    tables = None
    for pixels, its_sites, states, _ in tqdm(images, desc=f"{loaded.name}: edges", unit="image",
                                               disable=not shown):   # the drawn nodes' edges and maps, summed
        part = edge_tables(loaded, pixels, its_sites, states, drawn, grouped, frozen=False)
        tables = part if tables is None else [a + b for a, b in zip(tables, part)]
    tables = to_host([t / n for t in _all_reduced(tables)])
    places = [Place(site.block, site.grid, site.class_token) for site in sites]
    edges, unread = graph_edges(places, host, tables, drawn, grouped, edge_share=edge_share)
    label = loaded.labels[target]
    nodes = graph_nodes(places, host, tables[:len(sites)], drawn, grouped,
                        [bool(where.error < size) for where in positions], unread,
                        metric_name=metric.describe(loaded.labels), value=value, names=names)
    low, high = _interval(at_sizes[:, chosen], at_sizes[:, 0], full) if defined else (None, None)
    result = Circuit(
        model=loaded.name, metric=metric.describe(loaded.labels), metric_kind=metric.kind, target=target,
        target_label=label, contrast=None, contrast_label=None, value=value, baseline=baseline,
        method="attribution patching", attention="the model's own (gradients through the attention patterns)",
        faithful=faithful, edge_share=edge_share,
        sites=[{"block": site.block, "dictionary": site.source, "across": site.across,
                "concepts": site.dictionary.n_concepts, "grid": list(site.grid), "class_token": site.class_token,
                "error_effect": h.error_effect, "concept_effect": float(h.effects.sum())}
               for site, h in zip(sites, host)],
        nodes=nodes, edges=edges, candidates=sum(site.dictionary.n_concepts for site in sites))
    concepts = sum(len(m) for m in members)
    result.faithfulness = {
        "value": float(curve[chosen]) if defined else None, "interval": [low, high], "level": LEVEL,
        "target": faithful, "images": n, "full": float(full.mean()), "empty": float(at_sizes[:, 0].mean()),
        "circuit": float(at_sizes[:, chosen].mean()), "nodes": size, "concept_nodes": concepts,
        "error_nodes": size - concepts, "ranked_nodes": len(ranked),
        "active_concepts": sum(int((np.abs(h.effects) > floor).sum()) for h in host), "logit_spread": spread,
        "ablation": "m(∅): every concept and every error node at its baseline (Marks et al.); F the ratio of the "
                    "means over the images",
        "curve": [{"nodes": int(k), "faithfulness": float(f) if defined else None} for k, f in zip(sizes, curve)]}
    result.notes = [f"Averaged over {n} images labelled {label}: each node's and edge's effect is its mean over them, "
                    f"F the ratio of the means, its {LEVEL:.0%} interval by resampling the images."]
    if not defined:
        result.notes.append(f"F is undefined: with every node at its baseline the metric moves on average only from "
                            f"{float(full.mean()):.3g} to {float(at_sizes[:, 0].mean()):.3g}, less than "
                            f"{SPREAD:.0%} of the spread of the logits ({spread:.3g}).")
    elif not reached.size:
        result.notes.append(f"No measured size reaches F = {faithful:.2f}; every ranked node drawn (F "
                            f"{float(curve[-1]):.2f}).")
    return result


def edge_tables(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                drawn: Sequence[list[int]], grouped: Sequence[list[int]], *, frozen: bool) -> list[Tensor]:
    """On the device: each site's drawn concepts' codes at its rows (rows x drawn, then the group's summed codes
    where there is a group), then per consecutive pair of sites its edge table, one row a downstream target (the
    drawn concepts, the group, the error, what the site does not read) and one column a drawn upstream source (the
    concepts, the group, the error), then each row's total over every upstream node and its absolute inflow. A
    group is one node: its edges are its members' summed. Every pair's pass is queued, none read."""
    def codes_of(state: SiteState, s: int) -> Tensor:
        codes = state.codes[0]
        return torch.cat([codes[:, drawn[s]], codes[:, grouped[s]].sum(1, keepdim=True)], 1) if grouped[s] \
            else codes[:, drawn[s]]

    tables = [codes_of(state, s) for s, state in enumerate(states)]
    for i in range(len(sites) - 1):
        targets = [*drawn[i + 1], *([tuple(grouped[i + 1])] if grouped[i + 1] else []), None]
        concept_edges, error_edges = edges_between(loaded, pixels, (sites[i], states[i]), (sites[i + 1], states[i + 1]),
                                                   targets, unread=True, frozen=frozen)
        inflow = concept_edges.abs().sum(1) + error_edges.abs()   # from every upstream node, drawn or not
        total = concept_edges.sum(1) + error_edges
        sources = [concept_edges[:, drawn[i]]]
        if grouped[i]:
            sources.append(concept_edges[:, grouped[i]].sum(1, keepdim=True))
        tables.append(torch.cat([*sources, error_edges[:, None], total[:, None], inflow[:, None]], 1))
    return tables


def file_name(model: str, label: str) -> str:
    """A class circuit's JSON, for one model and class: what `vitviz circuits --data --class` writes and vitviz
    ships."""
    return f"class-circuit-{safe_name(model)}-{safe_name(label)}.json"


def shipped(model: str, label: str) -> dict | None:
    """The class circuit vitviz ships for a bundled model and class (`catalog.CLASS_CIRCUITS`), or None."""
    path = catalog.CLASS_CIRCUITS / file_name(model, label)
    return json.loads(path.read_text()) if path.is_file() else None


def _all_reduced(tensors: list[Tensor]) -> list[Tensor]:
    """Each tensor summed over torchrun's processes (itself with one process)."""
    if dist.is_available() and dist.is_initialized():
        for tensor in tensors:
            dist.all_reduce(tensor)
    return tensors


def _ratio(circuit: np.ndarray, empty: float, full: float) -> np.ndarray:
    return (circuit - empty) / (full - empty)


def _interval(circuit: np.ndarray, empty: np.ndarray, full: np.ndarray) -> tuple[float, float]:
    """F's percentile-bootstrap interval: the images resampled with replacement, F the ratio of their means."""
    draws = np.random.default_rng(0).integers(0, len(full), size=(BOOTSTRAP, len(full)))
    ratios = _ratio(circuit[draws].mean(1), empty[draws].mean(1), full[draws].mean(1))
    low, high = np.percentile(ratios, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return float(low), float(high)
