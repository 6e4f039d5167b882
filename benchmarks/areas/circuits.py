"""Circuits (issues 49 and 55): one photo's circuit for the bundled pair with their bundled dictionaries at four depths,
kept to be pruned again on the host (every size up to twice the circuit's measured, every ranked node's edges up to
there), against its floor, the forwards and backwards it must run; what measuring every size of the ranking costs
instead (`--every-size`); and what the exact option (integrated gradients) costs on top.

The floor, per model, as plain traced passes of the same batches (no dictionary, no edit): the photo's forward
and backward (attribution patching), for each pair of consecutive sites the photo's forward from the first to the
second and a backward batched over the edges' downstream targets (the adjacency's rows), and the forwards of the
faithfulness's copies (one for every prefix size measured, in batches of `PREFIXES`) and of the completeness and
patching check's.
"""
from __future__ import annotations

import torch
from PIL import Image

import vitviz
from timing import report
from vitviz import catalog
from vitviz.circuits import Metric, circuit, load_dictionaries, sites_of
from vitviz.circuits.circuit import CHECKED
from vitviz.circuits.prefixes import PREFIXES
from workbench import PHOTO, Bench

SECONDS = 3.0   # at most: the bundled pair's two circuits, their faithful size and adjacency, CPU (issue 55)
RATIO = 2.0     # at most: the circuits' time / their floor's


def measure(bench: Bench, items: set[str]) -> None:
    names = catalog.BUNDLED_PAIR
    if bench.quick or not all(catalog.BUNDLED_DICTIONARIES[d].path.is_dir()
                              for name in names for d in catalog.CIRCUIT_DICTIONARIES[name]):
        report("circuits: skipped (needs the bundled pair and their dictionaries at four depths; not with --quick)")
        return
    photo = Image.open(PHOTO).convert("RGB")
    jobs = [setup(vitviz.load(name, device=bench.device), photo) for name in names]
    graphs = [circuit(*job) for job in jobs]   # the batch sizes the floor runs

    def ours():
        for job in jobs:
            circuit(*job)

    def every():
        for job in jobs:
            circuit(*job, every=True)

    def exact():
        for job in jobs:
            circuit(*job, method="ig")

    def floor():
        for (loaded, pixels, sites, metric), graph in zip(jobs, graphs):
            plain = loaded.model.trace(pixels, grad=True, attention=False)
            torch.autograd.grad(metric(plain.logits).sum(), plain.pixels)
            for up, down, edges in zip(sites, sites[1:], graph.adjacency.edges):
                between(loaded, pixels, up.block, down.block, len(edges))
            with torch.inference_mode():   # the prefixes measured and the photo, then completeness and patching
                rows = len(graph.faithfulness["curve"]) + 1
                for start in range(0, rows, PREFIXES):
                    loaded.model.trace(pixels, attention=False,
                                       edit=copied(sites[0].block, min(PREFIXES, rows - start)))
                loaded.model.trace(pixels, attention=False, edit=copied(sites[0].block, 3 + CHECKED))
    t = bench.time({"circuits": ours, "floor": floor, "every": every, "exact": exact})
    seconds, ratio = t["circuits"].median, t["circuits"].median / t["floor"].median
    sizes = ", ".join(f"{g.model} {g.faithfulness['nodes']} of {g.faithfulness['ranked_nodes']} ranked nodes (every "
                      f"size to {g.adjacency.held} kept), {g.size['edges']} edges, F {g.faithfulness['value']:.2f}"
                      for g in graphs)
    report(f"circuits, bundled pair, one photo, four dictionaries each ({sizes}): {t['circuits']} (target <= "
           f"{SECONDS} s) {'OK' if seconds <= SECONDS else 'MISSED'}; its floor {t['floor']}, ratio {ratio:.2f} "
           f"(target <= {RATIO}) {'OK' if ratio <= RATIO else 'MISSED'}; every size of the ranking kept "
           f"{t['every']} ({t['every'].median / seconds:.1f}x); integrated gradients (10 steps) {t['exact']}, "
           f"{t['exact'].median / seconds:.1f}x attribution patching")


class _Reached(Exception):
    pass


def copied(block: int, copies: int):
    """An edit that turns the photo into `copies` copies at `block`, as the circuit's passes do."""
    return lambda index, tokens: tokens.expand(copies, *tokens.shape[1:]) if index == block else tokens


def between(loaded, pixels: torch.Tensor, first: int, last: int, targets: int) -> None:
    """The photo from block `first` to block `last` with the graph kept (where the pass stops), and one backward
    batched over `targets` downstream scores: what one pair of sites' edges must run."""
    start = {}

    def edit(index, tokens):
        if index == first:
            start["tokens"] = tokens.detach().requires_grad_(True)
            return start["tokens"]
        if index == last:
            raise _Reached(tokens)
        return tokens
    try:
        loaded.model.trace(pixels, grad=True, attention=False, edit=edit)
    except _Reached as reached:
        out = reached.args[0]
        torch.autograd.grad(out, start["tokens"], torch.ones(targets, *out.shape), is_grads_batched=True)


def setup(loaded, photo: Image.Image) -> tuple:
    """(loaded, pixels, sites, metric) of the photo's circuit through a model with its bundled dictionaries: what
    the app keeps between clicks (dictionaries loaded once a process)."""
    pixels = loaded.preprocess(photo).to(loaded.device)
    with torch.inference_mode():
        trace = loaded.model.trace(pixels, attention=False)
    found = load_dictionaries(catalog.CIRCUIT_DICTIONARIES[loaded.name])
    sites = sites_of(loaded, trace, [(source, dictionary) for source, dictionary, _ in found],
                     image_size=(photo.height, photo.width), folders=[folder for _, _, folder in found])
    return loaded, pixels, sites, Metric(int(trace.logits[0].argmax()), centred=True)
