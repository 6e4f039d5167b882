"""The Circuits tab's words: each model's line (its circuit's size, F and the values it divides), the line saying the
two models disagree, the line on circuits pruned again to the size slider's, the concepts both circuits hold, and a
node card's words (its effect, where on the photo it acts, edges, removal)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..session import ModelRun
from . import gpu
from .concept_words import change, percent

OWN = "each model's own"   # the class box's value for each model's own top class
SIDES = ("left", "right")


def model_words(run: ModelRun, found: gpu.CircuitReading | str) -> str:
    """A model's line: its metric, its dictionaries, the circuit's size, faithfulness and completeness, how well
    attribution patching ranked the strongest nodes, and how attention was treated."""
    if isinstance(found, str):
        return f"**{run.name}**: {found}"
    c = found.circuit
    f, size = c.faithfulness, c.size
    blocks = ", ".join(str(site["block"] + 1) for site in c.sites)
    words = [f"**{run.name}**: {c.metric} = {c.value:.2f}, through {len(c.sites)} dictionar"
             f"{'y' if len(c.sites) == 1 else 'ies'} (block{'s' * (len(c.sites) > 1)} {blocks}: "
             f"{', '.join(found.sources)}); the circuit holds {f['concept_nodes']} of the {f['active_concepts']} "
             f"active concepts and {f['error_nodes']} error node{'s' * (f['error_nodes'] != 1)} "
             f"({size['edges']} edges drawn)"]
    if f.get("value") is not None:
        completeness = "" if f["completeness"] is None else (
            f", completeness {f['completeness']:.2f} (the model with the circuit removed: near 0 is good)")
        words.append(f"faithfulness **F = {f['value']:.2f}** = (m(C) {f['circuit']:.2f} - m(∅) {f['empty']:.2f}) / "
                     f"(m(M) {f['full']:.2f} - m(∅)), every node outside it at its baseline, error nodes too"
                     f"{completeness}")
    rho = (c.patching or {}).get("rank_correlation")
    if rho is not None:
        words.append(f"attribution patching ranks its {len(c.patching['nodes'])} strongest nodes as patching each "
                     f"alone does with a rank correlation of {rho:.2f}")
    words.append(f"{c.method}, {c.baseline} baseline; attention: {c.attention}")
    return " ".join(["; ".join(words) + ".", *c.notes])


def disagreement(runs_: list[ModelRun], target: str) -> str:
    """Where the models' top classes differ and both circuits build one class: a line saying so, and how to see each
    model's own."""
    classifiers = [run for run in runs_ if run.has_classifier]
    tops = [run.top(1)[0] for run in classifiers]
    if len(tops) < 2 or len({top.label for top in tops}) == 1 or target == OWN:
        return ""
    said = ", ".join(f"{SIDES[runs_.index(run)]} ({run.name}) says {top.label} ({top.prob:.0%})"
                     for run, top in zip(classifiers, tops))
    return (f"**The models disagree**: {said}; both circuits build {target}, so one of them explains a class it does "
            f"not pick. Choose *each model's own top class* in the class box to see each one's own answer.")


def size_words(runs_: list[ModelRun], found: list[gpu.CircuitReading | str], nodes: int | None) -> str:
    """Where the size slider pruned both circuits again: the line saying so, and which model kept fewer sizes (drawn
    at its largest)."""
    if nodes is None:
        return ""
    short = [f"{run.name} kept every size up to {reading.circuit.adjacency.held} nodes and is drawn at that"
             for run, reading in zip(runs_, found)
             if not isinstance(reading, str) and reading.circuit.adjacency.held < nodes]
    return (f"**Circuits of {nodes} nodes**, strongest first: pruned again here from what the drawing measured, with "
            f"no model pass; F at each size was measured, not guessed" + "".join(f"; {line}" for line in short) + ".")


def shared_words(found: list[gpu.CircuitReading | str], shared: list[set[str]]) -> str:
    """The line on the nodes both circuits hold: the same concept of one dictionary across both models."""
    if any(isinstance(reading, str) for reading in found):
        return ""
    across = [{site["dictionary"] for site in reading.circuit.sites if site["across"]} for reading in found]
    common = sorted(across[0] & across[1])
    if not common:
        return ""
    named = sorted({found[0].circuit.node(node).name for node in shared[0]})
    if not named:
        return (f"Both read {', '.join(common)} (one dictionary across both models), but no concept of it is in both "
                f"circuits.")
    return (f"Both read {', '.join(common)} (one dictionary across both models); {len(named)} of its concepts are in "
            f"both circuits (framed green): {', '.join(named)}.")


def name_of(circuit, node: str) -> str:
    """A node as the card's lists name it: 'the photo', 'the logit of cat', or its block and name."""
    found = circuit.node(node)
    return found.name if found.block is None else f"block {found.block + 1} {found.name}"


def edge_words(circuit, edges) -> str:
    return ", ".join(f"{name_of(circuit, node)} ({edge.weight:+.3f})" for node, edge in edges) or "none kept"


def removal_words(found: gpu.CircuitReading, node) -> str:
    """What removing a concept from its block does to the target's probability, or why it cannot be removed."""
    removal = found.removal.get(node.block)
    if removal is None:
        return ""
    if isinstance(removal, str):
        return f"**Remove this concept**: not here. {removal}"
    if node.concept not in removal.without:   # a circuit pruned again: measured for the drawing's own nodes
        return (f"**Remove this concept**: measured for the concepts of the circuit of "
                f"{found.circuit.adjacency.header['measured']['nodes']} nodes drawn first; draw the circuits with "
                f"another faithfulness to measure it.")
    probability, top = removal.without[node.concept]
    moved = f"{removal.target} {change(removal.probability, probability)}"
    return (f"**Remove this concept** from block {node.block + 1} (the rest of the model run on): {moved}"
            + (f", {top} on top." if top != removal.target else f", {removal.target} still on top."))


def card_words(run: ModelRun, found: gpu.CircuitReading, node, partner: str) -> str:
    """The card's words: what the node is, its effect, how often it fires, its strongest inputs and outputs, what
    removing it does, and its twin in the other model."""
    c = found.circuit
    site = next(site for site in c.sites if site["block"] == node.block)
    at_class = "" if node.class_token is None else f" (at the class token {node.class_token:.2f})"
    if node.kind == "error":
        what = (f"**The error at block {node.block + 1}** of {run.name} ({site['dictionary']}): what the dictionary "
                f"misses of the block's tokens, kept so the model stays exact. Its effect on {c.metric}: "
                f"**{node.effect:+.3f}**{at_class}; its norm summed over the cells is {node.activation:.2f}.")
    else:
        what = (f"**{node.name}**, block {node.block + 1} of {run.name} ({site['dictionary']}"
                f"{', across both models' if site['across'] else ''}): its effect on {c.metric} is "
                f"**{node.effect:+.3f}** ({c.method}, {c.baseline} baseline); its codes sum to {node.activation:.2f} "
                f"over the photo{at_class}.")
        if node.id in found.frequency:
            what += f" It fires on {percent(found.frequency[node.id])} of {Path(found.data[node.block]).name}'s tokens."
        elif node.block in found.index_words:
            what += f" No top images: {found.index_words[node.block]}"
    lines = [what, cell_words(node),
             "**Strongest inputs**: " + edge_words(c, [(e.source, e) for e in c.inputs(node.id)[:4]]),
             "**Strongest outputs**: " + edge_words(c, [(e.target, e) for e in c.outputs(node.id)[:4]])]
    if node.kind == "concept":
        lines.append(removal_words(found, node))
    lines.append(partner)
    return "\n\n".join(line for line in lines if line)


GRID_SHOWN = 16   # a grid up to this many cells a side is shown whole on a card, number by number


def cell_words(node) -> str:
    """Where a concept (a group, an error) node acts: its effect at each cell of its grid, the strongest named, the
    class token's share apart, and the grid number by number (top row first) where it is small enough to read."""
    effects = node.map if node.kind == "error" else node.effect_map
    if effects is None:
        return ""
    values = np.asarray(effects, dtype=np.float64).reshape(node.grid)
    token = node.class_token if node.kind == "error" else (None if node.class_token is None
                                                            else node.effect - float(values.sum()))
    if token is not None and not np.abs(values).max() >= 5e-4:   # a block whose class token alone reaches the answer
        return (f"**Its effect cell by cell**: none at the grid's cells (under 0.0005 each); at the class token "
                f"{token:+.3f}.")
    strongest = np.argsort(-np.abs(values), axis=None)[:3]
    named = ", ".join(f"({r}, {c}) {values[r, c]:+.3f}" for r, c in zip(*np.unravel_index(strongest, node.grid)))
    words = f"**Its effect cell by cell** (row, column from the top left): strongest at {named}"
    words += "." if token is None else f"; at the class token {token:+.3f}."
    if max(node.grid) > GRID_SHOWN:
        return words
    rows = "\n".join(" ".join(f"{v:+.3f}" for v in row) for row in values)
    return f"{words}\n\n```\n{rows}\n```"


def class_words(model: str, label: str, graph: dict | None) -> str:
    """A model's line over its shipped circuit of a class over the test set: F with its interval, or how to make
    one where none ships."""
    if graph is None:
        return (f"**{model}**: no circuit of {label} over a data set ships for it (the bundled pair's do); `vitviz "
                f"circuits --models {model} --data cifar10 --class {label} --out DIR` makes one.")
    f = graph["faithfulness"]
    value = "undefined" if f["value"] is None else (
        f"**F = {f['value']:.2f}** ({f['level']:.0%} interval {f['interval'][0]:.2f} to {f['interval'][1]:.2f})")
    return (f"**{model}**: {graph['metric']} over {f['images']} test images labelled {label}: {value} with "
            f"{f['concept_nodes']} concepts and {f['error_nodes']} error nodes, each node's effect its mean over the "
            f"images; the tiles show where each concept fires on average, on a grey photo.")
