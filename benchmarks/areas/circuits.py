"""Circuits (issue 49): one photo's circuit for the bundled pair with their bundled dictionaries at four depths,
against its floor, the forwards and backwards it must run; and what the exact option (integrated gradients)
costs on top.

The floor, per model, as plain traced passes of the same batches (no dictionary, no edit): the photo's forward
and backward (attribution patching), for each pair of consecutive sites a forward and backward of one copy per
downstream target (the edges), and the forwards of the faithfulness's copies (one for every prefix size measured,
in batches of `PREFIXES`) and of the completeness and patching check's.
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

SECONDS = 3.0   # at most: the bundled pair's two circuits with the faithful-size search, CPU (issue 55)
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

    def exact():
        for job in jobs:
            circuit(*job, method="ig")

    def floor():
        for (loaded, pixels, sites, metric), graph in zip(jobs, graphs):
            plain = loaded.model.trace(pixels, grad=True, attention=False)
            torch.autograd.grad(metric(plain.logits).sum(), plain.pixels)
            for up, down in zip(sites, sites[1:]):
                copies = sum(1 for n in graph.nodes if n.block == down.block)
                between(loaded, pixels, up.block, down.block, copies)
            with torch.inference_mode():   # the prefixes measured and the photo, then completeness and patching
                rows = len(graph.faithfulness["curve"]) + 1
                for start in range(0, rows, PREFIXES):
                    loaded.model.trace(pixels, attention=False,
                                       edit=copied(sites[0].block, min(PREFIXES, rows - start)))
                loaded.model.trace(pixels, attention=False, edit=copied(sites[0].block, 3 + CHECKED))
    t = bench.time({"circuits": ours, "floor": floor, "exact": exact})
    seconds, ratio = t["circuits"].median, t["circuits"].median / t["floor"].median
    sizes = ", ".join(f"{g.model} {g.faithfulness['nodes']} of {g.faithfulness['ranked_nodes']} ranked nodes, "
                      f"{g.size['edges']} edges, F {g.faithfulness['value']:.2f}" for g in graphs)
    report(f"circuits, bundled pair, one photo, four dictionaries each ({sizes}): {t['circuits']} (target <= "
           f"{SECONDS} s) {'OK' if seconds <= SECONDS else 'MISSED'}; its floor {t['floor']}, ratio {ratio:.2f} "
           f"(target <= {RATIO}) {'OK' if ratio <= RATIO else 'MISSED'}; integrated gradients (10 steps) "
           f"{t['exact']}, {t['exact'].median / seconds:.1f}x attribution patching")


class _Reached(Exception):
    pass


def copied(block: int, copies: int):
    """An edit that turns the photo into `copies` copies at `block`, as the circuit's passes do."""
    return lambda index, tokens: tokens.expand(copies, *tokens.shape[1:]) if index == block else tokens


def between(loaded, pixels: torch.Tensor, first: int, last: int, copies: int) -> None:
    """The photo to block `first`, `copies` copies of its output from there to block `last` with the graph kept
    (where the pass stops), and their backward: what one pair of sites' edges must run."""
    start = {}

    def edit(index, tokens):
        if index == first:
            start["tokens"] = tokens.detach().expand(copies, *tokens.shape[1:]).clone().requires_grad_(True)
            return start["tokens"]
        if index == last:
            raise _Reached(tokens)
        return tokens
    try:
        loaded.model.trace(pixels, grad=True, attention=False, edit=edit)
    except _Reached as reached:
        torch.autograd.grad(reached.args[0].sum(), start["tokens"])


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
