"""One photo's circuit through one model: node effects, the faithful circuit, edges, and what it means.

Faithfulness (Marks et al. 2024): F(C) = (m(C) - m(∅)) / (m(M) - m(∅)) with m(∅) every concept *and* error node
at its baseline; the circuit is the smallest prefix of every node ranked by |effect| across all sites whose F
reaches `faithful` (default 0.6), found by `prefixes.prefix_faithfulness` (exact, about as many rows as the circuit
has nodes); where the nodes together do not move the answer, F is None and a sentence says why. The variant that
keeps every error node, in m(∅) and in m(C), is reported beside it, named (`errors_kept`): where the errors carry
the answer its denominator vanishes, which is why it is not the default. Completeness is the same ratio with C
removed and everything else kept: a circuit that holds the mechanism leaves little behind.

What is drawn. Each site's circuit concepts, the strongest `most` one by one and the rest grouped into one node
("N more concepts", its members listed), and the site's error node (marked when it is not in the circuit): what is
drawn is the circuit F describes. It is pruned on the host from what the circuit measured around it (`adjacency.py`:
every size up to twice its own, the edges of every node up to there), kept with it to prune any of those sizes again
without the model.

Attribution against patching. Attribution patching is a linear estimate; for the strongest nodes the real
effect, m(x) - m(x with that one node at its baseline), is measured too (one batched forward), and both are
reported with their rank correlation.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..concepts.kinds.dictionary import ConceptsError, block_words
from .adjacency import device_parts, held_of, kept, resized
from .effects import (
    IG_STEPS,
    METHODS,
    Metric,
    SiteState,
    attribution,
    check_metric,
    integrated_gradients,
)
from .graph import EDGE_SHARE, FAITHFUL, MOST, Circuit, Place, node_id
from .host import OnHost, read_states, to_host
from .prefixes import ablated_rows, prefix_faithfulness, prefix_rows
from .sites import Site, image_sites

CURVE = 11    # points of the curve over a data set: 0, 10 %, ..., 100 % of each image's ranked nodes
CHECKED = 8   # strongest nodes whose attribution is checked against activation patching
NOTHING = 1e-6   # of |m| (at least 1): an effect this small is rounding, not a concept's


def circuit(loaded, pixels: Tensor, sites: Sequence[Site], metric: Metric, *, baseline: str = "zero",
            method: str = "atp", steps: int = IG_STEPS, frozen: bool = False, faithful: float = FAITHFUL,
            edge_share: float = EDGE_SHARE, most: int = MOST, nodes: int | None = None, every: bool = False,
            names: Sequence[dict[int, str] | None] | None = None) -> Circuit:
    """The circuit of `metric` on the photo `pixels` (1 3 H W, preprocessed for `loaded`) through `sites` (from
    `sites_of`, in depth order): the smallest prefix of the nodes ranked by |effect| whose F reaches `faithful` (or
    the first `nodes` of them), drawn with at most `most` concepts a site one by one. `names`: per site, concept ->
    name for the nodes. It keeps what it was pruned from (`Circuit.adjacency`: every size up to `prefixes.RESIZE`
    times its own measured, with `every` every size), to be pruned again on the host (`adjacency.resized`)."""
    check_settings(sites, method=method, faithful=faithful, edge_share=edge_share, nodes=nodes)
    check_metric(metric, loaded.labels)
    value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, frozen=frozen)
    estimates = [state.effects.clone() for state in states]   # attribution patching's, before any refinement
    if method == "ig":
        integrated_gradients(loaded, pixels, sites, states, metric, steps=steps, frozen=frozen)
    floor = NOTHING * max(1.0, abs(value))
    host = read_states(states, estimates)
    prefixes = prefix_faithfulness(loaded, pixels, sites, host, metric, value=value, baseline=baseline, floor=floor,
                                   faithful=faithful, nodes=nodes)
    size, _ = prefixes.chosen(faithful, nodes)
    held = prefixes.held(size, every=every)   # every size up to it measured, and its nodes' edges: to prune again
    more = np.setdiff1d(np.arange(1, held + 1), prefixes.counts)
    parts = [metric(prefix_rows(loaded, pixels, sites, prefixes.positions, more, baseline=baseline)) if more.size
             else torch.zeros(0, device=pixels.device),
             *device_parts(loaded, pixels, sites, states, prefixes.positions, held, frozen=frozen)]
    # completeness, the errors-kept variant and the check against patching: one batched forward, read with the edges
    circuit_kept = [where.concepts < size for where in prefixes.positions]
    concept_rows = [np.stack([~kept, np.zeros_like(kept), kept]) for kept in circuit_kept]
    error_rows = np.stack([[where.error >= size for where in prefixes.positions], [True] * len(sites),
                           [True] * len(sites)])
    patched, strongest = _patching_masks(host, top=CHECKED)
    keep = [np.concatenate([rows, more]) for rows, more in zip(concept_rows, patched)]
    errors = np.concatenate([error_rows, np.ones((len(strongest), len(sites)), dtype=bool)])
    at_more, *parts, m = to_host([*parts, metric(ablated_rows(loaded, pixels, sites, keep, errors, baseline=baseline))])
    prefixes = prefixes.with_sizes(more, at_more)
    held_names = [None if named is None else {int(c): named[c] for c in held_of(where, held) if c in named}
                  for named, where in zip(names or [None] * len(sites), prefixes.positions)]
    header = {
        **fixed_header(loaded, sites, states, host, metric, value=value, baseline=baseline, method=method,
                       steps=steps, frozen=frozen, edge_share=edge_share),
        "patching": _patching_report(m[3:], strongest, sites, host, value=value),
        "notes": notes_of(sites, states, host, floor=floor, frozen=frozen, method=method, baseline=baseline),
        "most": most, "faithful": faithful, "names": held_names,
        "measured": {"nodes": size, "without_circuit": float(m[0]), "errors_kept": [float(m[1]), float(m[2])]}}
    places = [Place(site.block, site.grid, site.class_token) for site in sites]
    return resized(kept(header, places, host, prefixes, held, parts), nodes=nodes, faithful=faithful)


def check_settings(sites: Sequence[Site], *, method: str, faithful: float, edge_share: float,
                   nodes: int | None) -> None:
    """A circuit's settings, refused in words where they mean nothing."""
    if method not in METHODS:
        raise ConceptsError(f"The method must be one of {', '.join(METHODS)}, not {method!r}.")
    if not sites:
        raise ConceptsError("A circuit needs at least one dictionary.")
    if not 0 < faithful <= 1 or not 0 <= edge_share <= 1:
        raise ConceptsError(f"The faithfulness a circuit must reach is above 0 and at most 1, and the edge share "
                            f"from 0 to 1, not {faithful} and {edge_share}.")
    if nodes is not None and nodes < 0:
        raise ConceptsError(f"A circuit holds at least 0 nodes, not {nodes}.")


def fixed_header(loaded, sites: Sequence[Site], states: Sequence[SiteState], host: Sequence[OnHost], metric: Metric,
                 *, value: float, baseline: str, method: str, steps: int, frozen: bool, edge_share: float) -> dict:
    """The circuit's fields no size changes but the patching check (`adjacency.FIXED`); `host` per concept node."""
    labels = loaded.labels
    return {
        "model": loaded.name, "metric": metric.describe(labels), "metric_kind": metric.kind, "target": metric.target,
        "target_label": labels[metric.target], "contrast": metric.contrast,
        "contrast_label": None if metric.contrast is None else labels[metric.contrast], "value": value,
        "baseline": baseline,
        "method": "attribution patching" if method == "atp" else f"integrated gradients ({steps} steps)",
        "attention": "held fixed (attention patterns and norm scales are this photo's constants)" if frozen else
        "the model's own (gradients through the attention patterns)", "edge_share": edge_share,
        "sites": [_site_record(site, state, on_host) for site, state, on_host in zip(sites, states, host)],
        "candidates": sum(site.dictionary.n_concepts for site in sites)}


def notes_of(sites: Sequence[Site], states: Sequence[SiteState], host: Sequence[OnHost], *, floor: float,
             frozen: bool, method: str, baseline: str) -> list[str]:
    """What a reader must know to read the circuit, in words; `host` per concept node."""
    notes = [f"Nothing at {block_words(site.block)} moves the answer: what {site.source} reads there is not read on "
             f"the way to the classifier (a ViT's or a CvT's classifier reads the last block's class token alone; a "
             f"dictionary of its grid cannot change the answer)."
             for site, on_host in zip(sites, host)
             if np.abs(on_host.effects).sum() + abs(on_host.error_effect) <= floor]
    if frozen:
        notes.append("Attention is held fixed: the effects and edges are those of the model whose attention patterns "
                     "and norm scales are this photo's constants, while F and its ablations run the real model, so a "
                     "node's effect need not match what taking it out does.")
    if method == "ig":
        notes.append("The node effects and the edges are integrated gradients': an edge is averaged along its "
                     "source's path, each step with the downstream gradients of that step, so a node's edges add up "
                     "to its effect.")
    if baseline == "mean":
        notes += [f"The mean baseline at {block_words(site.block)} was taken over square photos and is resampled to "
                  f"this photo's {site.grid[0]} x {site.grid[1]} grid." for site, state in zip(sites, states)
                  if site.means.codes.shape[0] != state.rows.shape[1]]
    return notes


def _site_record(site: Site, state: SiteState, host: OnHost) -> dict:
    return {"block": site.block, "dictionary": site.source, "across": site.across,
            "concepts": site.dictionary.n_concepts, "rows": int(state.rows.shape[1]), "grid": list(site.grid),
            "class_token": site.class_token, "error_effect": host.error_effect,
            "concept_effect": float(host.effects.sum())}


def patching_check(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                   estimates: Sequence[Tensor], metric: Metric, *, value: float, baseline: str,
                   top: int = CHECKED) -> dict:
    """Attribution patching's estimate against the real effect of taking each of the `top` strongest concept nodes
    (by the estimate) alone to its baseline, everything else kept: one batched forward."""
    host = read_states(states, estimates)
    keep, strongest = _patching_masks(host, top=top)
    if not strongest:
        return _patching_report(None, strongest, sites, host, value=value)
    errors = np.ones((len(strongest), len(sites)), dtype=bool)
    m = to_host([metric(ablated_rows(loaded, pixels, sites, keep, errors, baseline=baseline))])[0]
    return _patching_report(m, strongest, sites, host, value=value)


def _patching_masks(host: Sequence[OnHost], *, top: int) -> tuple[list[np.ndarray], list[tuple[float, int, int]]]:
    """Per site the concepts kept (top x n): every one but the row's node; the nodes, strongest estimate first."""
    strongest = sorted(((abs(float(site.estimates[c])), s, int(c)) for s, site in enumerate(host)
                        for c in np.flatnonzero(site.estimates)), reverse=True)[:top]
    keep = [np.ones((len(strongest), site.estimates.size), dtype=bool) for site in host]
    for row, (_, s, c) in enumerate(strongest):
        keep[s][row, c] = False
    return keep, strongest


def _patching_report(m: np.ndarray | None, strongest: list, sites: Sequence[Site], host: Sequence[OnHost], *,
                     value: float) -> dict:
    if not strongest:
        return {"nodes": [], "attribution": [], "patched": [], "rank_correlation": None}
    patched = (value - np.asarray(m, dtype=np.float64)).tolist()
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
                      method: str = "atp", steps: int = IG_STEPS, frozen: bool = False, faithful: float = FAITHFUL,
                      progress: bool = True) -> dict:
    """The faithfulness curve over a data set: each image's ranking of its nodes for its model's top class (logit
    minus the mean logit), F at 0, 10 %, ..., 100 % of it, and per point the mean over the images whose F is defined
    (and how many); how many nodes each image's circuit needs to reach `faithful`. `sites_for(trace, image)` gives
    an image's sites."""
    from tqdm import tqdm

    curves, sizes = [], []
    for i in tqdm(indices, desc=f"circuits of {loaded.name}", unit="image", disable=not progress):
        pixels, trace, sites = image_sites(loaded, data.image(i), sites_for)
        metric = Metric(int(trace.logits[0].argmax()), centred=True)
        value, states = attribution(loaded, pixels, sites, metric, baseline=baseline, frozen=frozen)
        if method == "ig":
            integrated_gradients(loaded, pixels, sites, states, metric, steps=steps, frozen=frozen)
        host = read_states(states, [state.effects for state in states])
        fractions = np.linspace(0, 1, CURVE)
        prefixes = prefix_faithfulness(loaded, pixels, sites, host, metric, value=value, baseline=baseline,
                                       floor=NOTHING * max(1.0, abs(value)), faithful=faithful, fractions=fractions)
        points = np.round(fractions * prefixes.ranked).astype(np.int64).tolist()
        curves.append([(prefixes.faithfulness(prefixes.at(k)), k) for k in points])
        if prefixes.defined:
            sizes.append(prefixes.size(faithful)[0])
    points = []
    for k, fraction in enumerate(np.linspace(0, 1, CURVE).tolist()):
        values = [curve[k][0] for curve in curves if curve[k][0] is not None]
        points.append({"fraction": round(fraction, 2), "faithfulness": float(np.mean(values)) if values else None,
                       "nodes": float(np.mean([curve[k][1] for curve in curves])), "images": len(values)})
    return {"model": loaded.name, "images": len(curves), "baseline": baseline, "curve": points,
            "metric": "the top class's logit minus the mean logit", "target": faithful,
            "nodes_to_reach_target": float(np.median(sizes)) if sizes else None}
