"""One photo's circuit through one model: node effects, pruning, edges, and whether the circuit means anything.

Faithfulness (Marks et al. 2024). With m(M) the model's metric on the photo, m(∅) the metric with every concept
of every site at its baseline, and m(C) the metric with every concept outside the circuit C at its baseline (the
sites patched in depth order, each reading what the patched blocks before it made; the error nodes kept, or all
at their baseline: `errors`),

    F(C) = (m(C) - m(∅)) / (m(M) - m(∅))

so F(every node) = 1 and F(no node) = 0 by construction (the tests check both), measured as a curve over the
circuit's size (the pruning share from 0 to 1) in one batched forward. Completeness is the same ratio with C
removed and everything else kept: a circuit that holds the mechanism leaves little behind (near 0).

Attribution against patching. Attribution patching is a linear estimate; for the strongest nodes the real
effect, m(x) - m(x with that one node at its baseline), is measured too (one batched forward), and both are
reported with their rank correlation.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..concepts.kinds.dictionary import ConceptsError, block_words
from .effects import (
    IG_STEPS,
    METHODS,
    Metric,
    SiteState,
    ablated,
    attribution,
    check_metric,
    edges_between,
    integrated_gradients,
)
from .graph import EDGE_SHARE, INPUT, LOGIT, MOST, SHARE, Circuit, Edge, Node, kept_concepts, node_id
from .sites import Site

ERRORS = ("kept", "removed")
CURVE = 11    # points of the faithfulness curve: shares 0, 0.1, ..., 1
CHECKED = 8   # strongest nodes whose attribution is checked against activation patching
NOTHING = 1e-6   # of |m| (at least 1): an effect this small is rounding, not a concept's


def circuit(loaded, pixels: Tensor, sites: Sequence[Site], metric: Metric, *, baseline: str = "zero",
            method: str = "atp", steps: int = IG_STEPS, frozen: bool = False, share: float = SHARE,
            edge_share: float = EDGE_SHARE, most: int = MOST, errors: str = "kept",
            names: Sequence[dict[int, str] | None] | None = None) -> Circuit:
    """The circuit of `metric` on the photo `pixels` (1 3 H W, preprocessed for `loaded`) through `sites` (from
    `sites_of`, in depth order). `names`: per site, concept -> name for the nodes (default: their numbers)."""
    if method not in METHODS:
        raise ConceptsError(f"The method must be one of {', '.join(METHODS)}, not {method!r}.")
    if errors not in ERRORS:
        raise ConceptsError(f"Error nodes are {' or '.join(ERRORS)} when faithfulness is measured, not {errors!r}.")
    if not sites:
        raise ConceptsError("A circuit needs at least one dictionary.")
    if not 0 <= share <= 1 or not 0 <= edge_share <= 1:
        raise ConceptsError(f"The shares are from 0 to 1, not {share} and {edge_share}.")
    labels = loaded.labels
    check_metric(metric, labels)
    value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, frozen=frozen)
    estimates = [state.effects.clone() for state in states]   # attribution patching's, before any refinement
    if method == "ig":
        integrated_gradients(loaded, pixels, sites, states, metric, steps=steps, frozen=frozen)
    floor = NOTHING * max(1.0, abs(value))
    host = _read(states, estimates)
    kept = [kept_concepts(site.effects, share=share, most=most, floor=floor) for site in host]
    maps, edges = _maps_and_edges(loaded, pixels, sites, states, host, kept, edge_share=edge_share, frozen=frozen)
    nodes = [Node(id=INPUT, kind="input", name="the photo")]
    for s, site in enumerate(sites):
        named = (names[s] if names else None) or {}
        nodes += [_concept_node(site, host[s], c, maps[s][:, i], named.get(c)) for i, c in enumerate(kept[s])]
        nodes.append(_error_node(site, host[s]))
    nodes.append(Node(id=LOGIT, kind="logit", name=metric.describe(labels), effect=value))
    result = Circuit(
        model=loaded.name, metric=metric.describe(labels), target=metric.target, target_label=labels[metric.target],
        contrast=metric.contrast, contrast_label=None if metric.contrast is None else labels[metric.contrast],
        value=value, baseline=baseline,
        method="attribution patching" if method == "atp" else f"integrated gradients ({steps} steps)",
        attention="held fixed (attention patterns and norm scales are this photo's constants)" if frozen else
        "the model's own (gradients through the attention patterns)",
        errors=errors, share=share, edge_share=edge_share,
        sites=[_site_record(site, state, on_host) for site, state, on_host in zip(sites, states, host)],
        nodes=nodes, edges=edges, candidates=sum(site.dictionary.n_concepts for site in sites))
    result.notes = [f"Nothing at {block_words(site.block)} moves the answer: what {site.source} reads there is "
                    f"not read on the way to the classifier (a ViT's or a CvT's classifier reads the last block's "
                    f"class token alone; a dictionary of its grid cannot change the answer)."
                    for site, on_host in zip(sites, host)
                    if np.abs(on_host.effects).sum() + abs(on_host.error_effect) <= floor]
    # faithfulness and the check against patching: one batched forward for both
    faithful, nodes = _faithfulness_masks(host, share=share, most=most, floor=floor, device=pixels.device)
    patched, strongest = _patching_masks(host, top=CHECKED, device=pixels.device)
    split = faithful[0].shape[0]
    errors_kept = torch.ones(split + patched[0].shape[0], len(sites), dtype=torch.bool, device=pixels.device)
    errors_kept[:split] = errors == "kept"
    m = metric(ablated(loaded, pixels, sites, [torch.cat(pair) for pair in zip(faithful, patched)],
                       baseline=baseline, keep_errors=errors_kept)).double().cpu()
    result.faithfulness = _faithfulness_report(m[:split], nodes, value=value, errors=errors, floor=floor)
    result.patching = _patching_report(m[split:], strongest, sites, host, value=value)
    return result


@dataclass(frozen=True)
class OnHost:
    """A site's numbers the graph is built from, read from the device at once with every other site's: the graph
    is built node by node, and each number read alone would make the host wait for the device again."""
    effects: np.ndarray        # n: each concept node's effect
    estimates: np.ndarray      # n: attribution patching's (integrated gradients refine `effects`, not these)
    activations: np.ndarray    # n: each concept's codes summed over the site's rows
    error_effect: float
    error_map: np.ndarray      # rows: the error's effect at each row
    error_activation: float    # the error's norm summed over the rows


def to_host(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """`tensors` as float64 arrays of their shapes, in one transfer (one wait for the device)."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors]).cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return [part.reshape(t.shape) for part, t in zip(np.split(flat, ends[:-1]), tensors)]


def _read(states: Sequence[SiteState], estimates: Sequence[Tensor]) -> list[OnHost]:
    parts = [(state.effects, estimate, state.codes[0].sum(0), state.error_effects, state.error_effect,
              state.error[0].norm(dim=-1).sum()) for state, estimate in zip(states, estimates)]
    values = to_host([tensor for site in parts for tensor in site])
    return [OnHost(effects=effects, estimates=estimated, activations=activations, error_effect=float(error_effect),
                   error_map=error_map, error_activation=float(error_activation))
            for effects, estimated, activations, error_map, error_effect, error_activation
            in zip(*[iter(values)] * 6)]


def _site_record(site: Site, state: SiteState, host: OnHost) -> dict:
    return {"block": site.block, "dictionary": site.source, "across": site.across,
            "concepts": site.dictionary.n_concepts, "rows": int(state.rows.shape[1]), "grid": list(site.grid),
            "class_token": site.class_token, "error_effect": host.error_effect,
            "concept_effect": float(host.effects.sum())}


def _grid_values(site: Site, values: np.ndarray) -> tuple[list[float], float | None]:
    """A rows-long vector -> (its grid cells row-major, its class token's value or None)."""
    if site.class_token:
        return values[1:].tolist(), float(values[0])
    return values.tolist(), None


def _concept_node(site: Site, host: OnHost, concept: int, codes: np.ndarray, name: str | None) -> Node:
    where, class_token = _grid_values(site, codes)
    return Node(id=node_id(site.block, concept), kind="concept", name=name or f"concept {concept}",
                effect=float(host.effects[concept]), block=site.block, concept=concept,
                activation=float(host.activations[concept]), grid=site.grid, map=where, class_token=class_token)


def _error_node(site: Site, host: OnHost) -> Node:
    where, class_token = _grid_values(site, host.error_map)
    return Node(id=node_id(site.block, None), kind="error", name="error",
                effect=host.error_effect, block=site.block, activation=host.error_activation, grid=site.grid,
                map=where, class_token=class_token)


def _maps_and_edges(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                    host: Sequence[OnHost], kept: Sequence[list[int]], *, edge_share: float, frozen: bool
                    ) -> tuple[list[np.ndarray], list[Edge]]:
    """Each site's kept concepts' codes at its rows (rows x kept), and the edges: the input's into the first site,
    each consecutive pair's (pruned by each target's inflow), the last site's into the metric. Every pair's pass
    is queued before one read of them all."""
    pending = [state.codes[0][:, concepts] for state, concepts in zip(states, kept)]
    for i in range(len(sites) - 1):
        concept_edges, error_edges = edges_between(loaded, pixels, (sites[i], states[i]), (sites[i + 1], states[i + 1]),
                                                   [*kept[i + 1], None], frozen=frozen)
        inflow = concept_edges.abs().sum(1) + error_edges.abs()   # from every upstream node, kept or not
        pending.append(torch.cat([concept_edges[:, kept[i]], error_edges[:, None], inflow[:, None]], 1))
    values = to_host(pending)
    maps, between = values[:len(sites)], values[len(sites):]
    first, last = sites[0], sites[-1]
    edges = [Edge(INPUT, node_id(first.block, c), float(host[0].effects[c])) for c in kept[0]]
    edges.append(Edge(INPUT, node_id(first.block, None), host[0].error_effect))
    for i, weights in enumerate(between):   # targets x (kept sources, the error, the inflow)
        sources = [node_id(sites[i].block, c) for c in [*kept[i], None]]
        for target, (*row, inflow) in zip([*kept[i + 1], None], weights.tolist()):
            edges += [Edge(source, node_id(sites[i + 1].block, target), weight) for source, weight in zip(sources, row)
                      if inflow > 0 and abs(weight) >= edge_share * inflow]
    edges += [Edge(node_id(last.block, c), LOGIT, float(host[-1].effects[c])) for c in kept[-1]]
    edges.append(Edge(node_id(last.block, None), LOGIT, host[-1].error_effect))
    return maps, edges


def faithfulness(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState], metric: Metric, *,
                 value: float, baseline: str, share: float = SHARE, most: int = MOST, errors: str = "kept",
                 floor: float = 0.0) -> dict:
    """F and completeness of the circuit at `share`, and F over the shares 0, 0.1, ..., 1 (with each point's
    number of concept nodes): one batched forward."""
    keep, nodes = _faithfulness_masks(_read(states, [state.effects for state in states]), share=share, most=most,
                                      floor=floor, device=pixels.device)
    m = metric(ablated(loaded, pixels, sites, keep, baseline=baseline, keep_errors=errors == "kept"))
    return _faithfulness_report(m.double().cpu(), nodes, value=value, errors=errors, floor=floor)


def _faithfulness_masks(host: Sequence[OnHost], *, share: float, most: int, floor: float, device: torch.device
                        ) -> tuple[list[Tensor], list[int]]:
    """Per site the concepts kept (points x n): the curve's CURVE shares (every concept each asks for), the circuit
    drawn, the circuit removed, none; and each curve point's number of concept nodes."""
    circuits = [[kept_concepts(site.effects, share=s, most=site.effects.size, floor=floor) for site in host]
                for s in np.linspace(0, 1, CURVE).tolist()]
    circuits.append([kept_concepts(site.effects, share=share, most=most, floor=floor) for site in host])
    masks = [[_mask(site.effects.size, concepts) for site, concepts in zip(host, chosen)] for chosen in circuits]
    masks.append([~mask for mask in masks[-1]])   # the circuit removed, everything else kept
    masks.append([np.zeros_like(mask) for mask in masks[-1]])   # every concept at its baseline
    keep = [torch.from_numpy(np.stack([point[s] for point in masks])).to(device) for s in range(len(host))]
    return keep, [sum(len(c) for c in chosen) for chosen in circuits[:CURVE]]


def _faithfulness_report(m: Tensor, nodes: list[int], *, value: float, errors: str, floor: float) -> dict:
    """The report from the metric of `_faithfulness_masks`' rows."""
    m = m.tolist()
    empty = m[-1]
    span = value - empty

    def ratio(x: float) -> float | None:
        return None if abs(span) <= max(floor, 1e-9) else (x - empty) / span   # nothing to hold

    return {"value": ratio(m[CURVE]), "completeness": ratio(m[CURVE + 1]), "full": value,
            "empty": empty, "circuit": m[CURVE], "without_circuit": m[CURVE + 1],
            "curve": [{"share": round(s, 2), "concept_nodes": n, "faithfulness": ratio(x)}
                      for s, n, x in zip(np.linspace(0, 1, CURVE).tolist(), nodes, m[:CURVE])],
            "errors": errors}


def _mask(n: int, concepts: list[int]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[concepts] = True
    return mask


def patching_check(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                   estimates: Sequence[Tensor], metric: Metric, *, value: float, baseline: str,
                   top: int = CHECKED) -> dict:
    """Attribution patching's estimate against the real effect of taking each of the `top` strongest concept nodes
    (by the estimate) alone to its baseline, errors kept: one batched forward."""
    host = _read(states, estimates)
    keep, strongest = _patching_masks(host, top=top, device=pixels.device)
    m = metric(ablated(loaded, pixels, sites, keep, baseline=baseline)) if strongest else None
    return _patching_report(m, strongest, sites, host, value=value)


def _patching_masks(host: Sequence[OnHost], *, top: int, device: torch.device
                    ) -> tuple[list[Tensor], list[tuple[float, int, int]]]:
    """Per site the concepts kept (top x n): every one but the row's node; the nodes, strongest estimate first."""
    strongest = sorted(((abs(float(site.estimates[c])), s, int(c)) for s, site in enumerate(host)
                        for c in np.flatnonzero(site.estimates)), reverse=True)[:top]
    keep = [np.ones((len(strongest), site.estimates.size), dtype=bool) for site in host]
    for row, (_, s, c) in enumerate(strongest):
        keep[s][row, c] = False
    return [torch.from_numpy(mask).to(device) for mask in keep], strongest


def _patching_report(m: Tensor | None, strongest: list, sites: Sequence[Site], host: Sequence[OnHost], *,
                     value: float) -> dict:
    if not strongest:
        return {"nodes": [], "attribution": [], "patched": [], "rank_correlation": None}
    patched = (value - m.double().cpu()).tolist()
    attributed = [float(host[s].estimates[c]) for _, s, c in strongest]
    return {"nodes": [node_id(sites[s].block, c) for _, s, c in strongest], "attribution": attributed,
            "patched": patched, "rank_correlation": rank_correlation(attributed, patched)}


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 2 values or a constant one."""
    if len(a) < 2:
        return None
    ranks = [_ranks(np.asarray(x, dtype=np.float64)) for x in (a, b)]
    if any(r.std() == 0 for r in ranks):
        return None
    return float(np.corrcoef(*ranks)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    for value in np.unique(x):   # ties share their mean rank
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def faithfulness_over(loaded, data, sites_for, *, indices: Sequence[int], baseline: str = "zero",
                      method: str = "atp", steps: int = IG_STEPS, frozen: bool = False, errors: str = "kept",
                      progress: bool = True) -> dict:
    """The faithfulness curve over a data set: each image's circuit of its model's top class (its nodes; no edges
    are needed to ablate), its F at each share, and per share the mean over the images whose F is defined (and how
    many), with the mean completeness at every share. `sites_for(trace, image)` gives an image's sites."""
    from tqdm import tqdm

    curves, completeness = [], []
    for i in tqdm(indices, desc=f"circuits of {loaded.name}", unit="image", disable=not progress):
        image = data.image(i)
        pixels = loaded.preprocess(image).to(loaded.device)
        with torch.inference_mode():
            trace = loaded.model.trace(pixels, attention=False)
        sites = sites_for(trace, image)
        metric = Metric(int(trace.logits[0].argmax()))
        value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, frozen=frozen)
        if method == "ig":
            integrated_gradients(loaded, pixels, sites, states, metric, steps=steps, frozen=frozen)
        result = faithfulness(loaded, pixels, sites, states, metric, value=value, baseline=baseline, errors=errors,
                              floor=NOTHING * max(1.0, abs(value)))
        curves.append([(point["faithfulness"], point["concept_nodes"]) for point in result["curve"]])
        completeness.append(result["completeness"])
    points = []
    for k, share in enumerate(np.linspace(0, 1, CURVE).tolist()):
        values = [curve[k][0] for curve in curves if curve[k][0] is not None]
        points.append({"share": round(share, 2), "faithfulness": float(np.mean(values)) if values else None,
                       "concept_nodes": float(np.mean([curve[k][1] for curve in curves])), "images": len(values)})
    defined = [c for c in completeness if c is not None]
    return {"model": loaded.name, "images": len(curves), "baseline": baseline, "errors": errors, "curve": points,
            "completeness_at_default_share": float(np.mean(defined)) if defined else None}
