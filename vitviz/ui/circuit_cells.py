"""The Circuits tab's circuit of one place: a click on the photo draws, for each model, the circuit of what happens at
the clicked cell (`circuits.position_circuit` with `place`). At each block the cell of its grid under the click is the
place; a node is a concept, or a dictionary's error, at that cell, ranked by its effect there on the metric of the
circuits drawn above (the same class, contrast, baseline, method and dictionaries). Every node elsewhere stays as the
photo made it, in m(∅) too, so F is the share of what happens at that cell that the circuit carries. One GPU call a
place (`gpu.read_cell_circuits`), kept in the session."""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import gradio as gr
import numpy as np

from ..circuits.graph import Place, at_cell
from ..session import ModelRun

# the tab this is part of (it imports this module: its names are read when called)
from . import circuits as tab, gpu
from .circuit_words import model_words
from .shared import run_point, runs, session

WORDS = ("**The circuit of one place.** After drawing the circuits, click the photo: each model's circuit of what "
         "happens at that cell. At each block the place is the cell of its grid under the click; a node is a concept "
         "(or a dictionary's error) at that cell, ranked by its effect there on the metric above. Every node elsewhere "
         "on the photo stays as the photo made it, in m(∅) too: F = (m(C) - m(∅)) / (m(M) - m(∅)) with m(∅) every "
         "node at that cell at its baseline, the share of what the cell does to the answer that the circuit carries. "
         "One cell seldom moves the answer much: where it moves it by less than a tenth of the spread of the logits, "
         "F is undefined and the words say so.")
WAITING = "Draw the circuits first (**Draw the circuits**), then click the photo."


class Drawn(NamedTuple):
    words: str
    graph_a: np.ndarray | None
    graph_b: np.ndarray | None


def rows_at(run: ModelRun, graph: dict, point) -> tuple[int | None, ...]:
    """Per site of `graph` the row of its grid under the click (after the class token where the site reads one); None
    where the click lies outside the part of the photo the site's grid covers."""
    x, y = run_point(run, point)
    h, w = run.canvas.size
    regions = tab.sites_on_photo(run, graph)
    rows = []
    for site in graph["sites"]:
        (y0, x0, y1, x1), (gh, gw) = regions[site["block"]][1], site["grid"]
        inside = y0 <= y / h < y1 and x0 <= x / w < x1
        rows.append(int(site["class_token"]) + int((y / h - y0) / (y1 - y0) * gh) * gw
                    + int((x / w - x0) / (x1 - x0) * gw) if inside else None)
    return tuple(rows)


def where_words(graph: dict, rows: tuple[int | None, ...]) -> str:
    """Which cell the place is at each block, in words."""
    return ", ".join(f"block {site['block'] + 1} "
                     f"{at_cell(Place(site['block'], tuple(site['grid']), site['class_token']), row)}"
                     for site, row in zip(graph["sites"], rows) if row is not None)


def cell_circuits(key, point, asked, is_open: bool = True) -> Drawn:
    """A click on the photo, with the tab open: each model's circuit of the clicked place for the circuits drawn last
    (`asked`), a GPU call the first time for that place, kept afterwards."""
    if not is_open or point is None:
        return Drawn(*(gr.skip(),) * 3)
    if key is None or asked is None:
        return Drawn(WAITING, None, None)
    runs_, found = runs(key), tab.readings(key, tuple(asked))
    target, contrast, baseline, method, frozen, faithful = asked[:6]
    graphs = [None if isinstance(reading, str) else reading.circuit.to_json() for reading in found]
    places = tuple(None if graph is None else rows_at(run, graph, point) for run, graph in zip(runs_, graphs))
    places = tuple(None if place is None or all(row is None for row in place) else place for place in places)
    if all(place is None for place in places):
        return Drawn("Neither model saw that point (it is outside their crops).", None, None)
    circuits = session(key).reading(("circuit cell", *asked[:6], places), lambda: gpu.read_cell_circuits(
        session(key).names, session(key).picture, [None if g is None else g["target"] for g in graphs],
        [None if g is None else g["contrast"] for g in graphs], [None if p is None else list(p) for p in places],
        sources=[None if isinstance(r, str) else r.sources for r in found], baseline=baseline, method=method,
        frozen=frozen, faithful=faithful))
    lines, pictures = [], []
    for run, reading, graph, place, drawn in zip(runs_, found, graphs, places, circuits):
        if drawn is None or isinstance(drawn, str):
            lines.append(f"**{run.name}**: " + (drawn or "it never saw that point, or has no circuit."))
            pictures.append(None)
            continue
        lines.append(f"At {where_words(graph, place)}: " + model_words(run, replace(reading, circuit=drawn)))
        pictures.append(tab.graph_picture(run, drawn.to_json(), set()))
    return Drawn("\n\n".join(lines), *pictures)


def layout() -> tuple[gr.Markdown, gr.Image, gr.Image]:
    """The words and both graphs of the place clicked, inside the Circuits tab."""
    gr.Markdown(WORDS)
    words = gr.Markdown(WAITING, elem_id="circuits-cell-words")
    with gr.Row(equal_height=False):
        graph_a = gr.Image(label="left: the circuit of the clicked place", interactive=False, min_width=300,
                           elem_id="circuits-cell-graph-a")
        graph_b = gr.Image(label="right: the circuit of the clicked place", interactive=False, min_width=300,
                           elem_id="circuits-cell-graph-b")
    return words, graph_a, graph_b
