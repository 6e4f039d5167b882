"""Circuits: which concepts, at which blocks and where on the photo, build each model's answer; the pair side by
side. Each model's concept dictionaries at several depths are spliced into it (`vitviz.circuits`); a node is a
concept (where it fires on the photo) or a block's error (what its dictionary misses), its effect what it adds to
the class's logit, an edge how much one node moves the next. The class (by default the left model's top one), a
contrast class, the baseline, the method and whether attention is held fixed are the page's; the circuit is the
smallest set of nodes whose faithfulness F reaches the page's target (`circuits.circuit`). A click on a node, or the
list, opens its card: its map and effect cell by cell, its top images, how often it fires, its strongest inputs and
outputs, what removing it does, and what it looks like (`pictures.py`). A click on the photo draws the circuit of
that place (`circuit_cells.py`).

One GPU call reads both circuits for one set of choices (`gpu.read_circuits`, kept in the session); the pictures,
cards and clicks are drawn from it. The size slider prunes both again on the host (`circuits.resized`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import gradio as gr
import numpy as np

from ..circuits import FAITHFUL, resized
from ..circuits.effects import FROZEN_IG
from ..render.circuits import ERROR_CMAP, circuit_faithfulness, circuit_graph, graph_layout, node_at
from ..render.concepts import cell_overlay, concept_card, exemplar_layout, photo_side
from ..session import ModelRun
from . import circuit_cells, gpu, pictures
from .circuit_words import OWN, SIDES, card_words, class_words, disagreement, model_words, shared_words, size_words
from .concepts import exemplar_tiles
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, Page, as_files, runs, session

TITLE = "Circuits"
WORDS = ("**Which concepts build each answer, block by block.** Each model's concept dictionaries at several depths "
         "are spliced into it. A node is a concept and where it fires on the photo, or a block's *error* (dashed: "
         "what its dictionary misses); the number under it is what it adds to the class's logit (red for, blue "
         "against). An edge is how much one node moves the next, its width its size. Click a node, or pick it "
         "from the list, for its card (a graph's corner button shows it full size). *Faithfulness* F: how much of "
         "the answer the circuit alone gives (1 all of it, 0 no more than every concept and error node at its "
         "baseline); each circuit is the smallest set of nodes, strongest first across all blocks, reaching the "
         "F asked for, and a block's circuit concepts beyond the 12 drawn one by one are one node, \"N more "
         "concepts\". The metric is the class's logit minus the mean logit, or minus the contrast class's.")
WAITING = "Press **Explain** first: this panel reads both models on the image."
TOP, NONE = "", ""   # the class box's value for the left model's top class; the contrast box's for none
BASELINES = [("zero", "zero"), ("the data set's mean", "mean")]
METHODS = [("attribution patching (one backward pass)", "atp"), ("integrated gradients (10 steps)", "ig")]
FAITHFUL_RANGE = (0.1, 1.0)
PHOTO_SCOPE, CLASS_SCOPE = "photo", "class"
SCOPES = [("this photo", PHOTO_SCOPE), ("the class over the test set", CLASS_SCOPE)]


class Shown(NamedTuple):
    note: str
    graph_a: np.ndarray | None
    graph_b: np.ndarray | None
    curves: np.ndarray | None
    picker: object
    card: np.ndarray | None
    card_words: str
    asked: tuple | None


class Card(NamedTuple):
    card: np.ndarray | None
    words: str
    graph_a: object
    graph_b: object
    draw: object       # the "Draw this concept" button: shown for a concept node without pictures
    variants: object   # the "Draw variants" button: shown for a concept node whose variants are not drawn


def class_box(key) -> tuple[gr.Dropdown, gr.Dropdown]:
    """The class and contrast boxes for a new Explain: the left model's classes (the first classifier's)."""
    labels = next((list(run.loaded.labels) for run in runs(key) if run.has_classifier), [])
    return (gr.Dropdown(choices=[("the left model's top class", TOP), ("each model's own top class", OWN), *labels],
                        value=TOP),
            gr.Dropdown(choices=[("none", NONE), *labels], value=NONE))


def asked_for(runs_: list[ModelRun], target, contrast, baseline, method, frozen, faithful) -> tuple:
    """The choices, checked, as the key of the session's reading: (target class or `OWN`, contrast class or None,
    baseline, method, frozen, the F to reach); the target by default the left model's top class (the first
    classifier's)."""
    if baseline not in dict((v, k) for k, v in BASELINES):
        raise gr.Error(f"The baseline is zero or mean, not {baseline!r}.")
    if method not in dict((v, k) for k, v in METHODS):
        raise gr.Error(f"The method is atp (attribution patching) or ig (integrated gradients), not {method!r}.")
    if method == "ig" and frozen:
        raise gr.Error(FROZEN_IG)
    if faithful is None or not FAITHFUL_RANGE[0] <= float(faithful) <= FAITHFUL_RANGE[1]:
        raise gr.Error(f"The faithfulness a circuit must reach is from {FAITHFUL_RANGE[0]} to {FAITHFUL_RANGE[1]}, "
                       f"not {faithful}.")
    classifiers = [run for run in runs_ if run.has_classifier]
    if not classifiers:
        raise gr.Error("Neither model has a classifier (self-supervised): a circuit builds a class's logit.")
    labels = set(label for run in classifiers for label in run.loaded.labels)
    target = (target or "").strip() or classifiers[0].top(1)[0].label
    contrast = (contrast or "").strip() or None
    if target == OWN and contrast is not None:
        raise gr.Error("A contrast class goes with one class for both models: pick a class, or no contrast.")
    for name, value in (("class", None if target == OWN else target), ("contrast class", contrast)):
        if value is not None and value not in labels:
            raise gr.Error(f"Neither model has the {name} {value!r}: pick one of {', '.join(sorted(labels)[:12])}"
                           f"{', ...' if len(labels) > 12 else ''}.")
    if contrast == target:
        raise gr.Error("The contrast class is the class itself: pick another one, or none.")
    return target, contrast, baseline, method, bool(frozen), round(float(faithful), 2)


def readings(key, asked: tuple, progress=None) -> list[gpu.CircuitReading | str]:
    """Both models' circuits for `asked` (`asked_for`'s choices, then the size in nodes; None: the faithful one): one
    `gpu.read_circuits` call the first time for the choices, kept in the session; a size, both pruned again on the
    host from what it kept (at most its largest kept size: `size_words` says so), no model pass."""
    kept = session(key)
    *choices, nodes = asked
    target, contrast, baseline, method, frozen, faithful = choices

    def compute():
        return gpu.read_circuits(kept.names, kept.picture, None if target == OWN else target, contrast,
                                 baseline=baseline, method=method, frozen=frozen, faithful=faithful,
                                 progress=progress)
    found = kept.reading(("circuits", *choices), compute)
    if nodes is None:
        return found
    return kept.reading(("circuits", *asked), lambda: [
        reading if isinstance(reading, str) else replace(reading, circuit=resized(
            reading.circuit.adjacency, nodes=min(nodes, reading.circuit.adjacency.held))) for reading in found])


def graphs_of(found: list[gpu.CircuitReading | str]) -> list[dict | None]:
    return [None if isinstance(reading, str) else reading.circuit.to_json() for reading in found]


def shared_of(graphs: list[dict | None]) -> list[set[str]]:
    """Per model, its nodes the other model's circuit holds too (none where a model has no circuit)."""
    from ..circuits.pair import shared_nodes

    if any(graph is None for graph in graphs):
        return [set() for _ in graphs]
    return shared_nodes(graphs)


def sites_on_photo(run: ModelRun, graph: dict) -> dict:
    """Each site's block -> (its stage, where its grid lies on the photo): `circuits.pair.places` on this run."""
    from ..circuits.pair import places

    return places(run.trace, run.loaded.transform, (run.image.height, run.image.width), graph)


def graph_picture(run: ModelRun, graph: dict | None, shared: set[str], picked: str | None = None) -> np.ndarray | None:
    """A model's graph drawn, `picked` framed; None where it has none."""
    return None if graph is None else circuit_graph(graph, run.canvas, sites_on_photo(run, graph), shared=shared,
                                                    picked=picked)


def picker_choices(runs_: list[ModelRun], graphs: list[dict | None]) -> list[tuple[str, str]]:
    """Every node but the photo and the answer, as the node box lists them: (words, 'side:node id')."""
    choices = []
    for side, (run, graph) in enumerate(zip(runs_, graphs)):
        for node in graph["nodes"] if graph else ():
            if node["kind"] in ("concept", "error"):
                choices.append((f"{SIDES[side]}, {run.name}, block {node['block'] + 1}: {node['name']} "
                                f"({node['effect']:+.2f})", f"{side}:{node['id']}"))
    return choices


def render_circuits(key, target=TOP, contrast=NONE, baseline="zero", method="atp", frozen=False, faithful=FAITHFUL,
                    scope=PHOTO_SCOPE, progress=gr.Progress()) -> Shown:
    """Both models' circuits for one class (a GPU call the first time for these choices; kept afterwards): the
    words, the two graphs, the faithfulness curves and the node box (nothing picked); with the class `scope`, the
    class circuits vitviz ships (`class_circuits`)."""
    if key is None:
        return Shown(WAITING, None, None, None, gr.Dropdown(choices=[], value=None), None, "", None)
    runs_ = runs(key)
    if scope not in dict((v, k) for k, v in SCOPES):
        raise gr.Error(f"The circuits explain this photo ({PHOTO_SCOPE!r}) or the class over the test set "
                       f"({CLASS_SCOPE!r}), not {scope!r}.")
    asked = asked_for(runs_, target, contrast, baseline, method, frozen, faithful)
    if scope == CLASS_SCOPE:
        return class_circuits(runs_, asked[0])
    return shown(key, (*asked, None), progress)


def shown(key, asked: tuple, progress=None) -> Shown:
    """Both circuits for `asked` (`readings`'), drawn: the words, the graphs, the curves, the node box."""
    runs_ = runs(key)
    found = readings(key, asked, progress=progress)
    graphs = graphs_of(found)
    shared = shared_of(graphs)
    pictures = [graph_picture(run, graph, mine) for run, graph, mine in zip(runs_, graphs, shared)]
    curves = {run.name: graph["faithfulness"] for run, graph in zip(runs_, graphs) if graph}
    lines = [disagreement(runs_, asked[0]), size_words(runs_, found, asked[-1]),
             *(model_words(run, reading) for run, reading in zip(runs_, found)), shared_words(found, shared)]
    return Shown("\n\n".join(line for line in lines if line), *pictures,
                 circuit_faithfulness(curves) if curves else None,
                 gr.Dropdown(choices=picker_choices(runs_, graphs), value=None), None, "", asked)


def resize_circuits(key, asked, nodes) -> Shown:
    """The size slider: the circuits drawn last pruned again on the host to `nodes` nodes, no model pass."""
    if key is None or asked is None or nodes is None:
        return Shown(*(gr.skip(),) * len(Shown._fields))
    return shown(key, (*asked[:-1], int(nodes)))


def size_slider(key, asked) -> gr.Slider:
    """The circuit size slider after a drawing: from 1 to the most nodes either circuit kept every size of, on the
    left one's size; locked where nothing was kept (the class over a data set, no circuit)."""
    found = [r for r in ([] if key is None or asked is None else readings(key, asked)) if not isinstance(r, str)]
    if not found:
        return gr.Slider(interactive=False)
    held = max(reading.circuit.adjacency.held for reading in found)
    return gr.Slider(minimum=1, maximum=max(held, 2), value=found[0].circuit.faithfulness["nodes"], step=1,
                     interactive=held > 1)


def class_circuits(runs_: list[ModelRun], target: str) -> Shown:
    """Each model's shipped circuit of the class over the test set (`circuits.classes.shipped`: the bundled
    pair's), drawn on a grey photo of the model's input size (its maps are averages over the class's images, not
    this photo's), with its F and interval; or why there is none. No model runs; the node cards are a photo's."""
    from ..circuits.classes import shipped

    graphs, lines = [], []
    for run in runs_:
        label = run.top(1)[0].label if target == OWN and run.has_classifier else target
        graph = shipped(run.name, label) if run.has_classifier else None
        graphs.append(graph)
        lines.append(class_words(run.name, label, graph))
    shared = shared_of(graphs)
    pictures = [None if graph is None else class_picture(run, graph, mine)
                for run, graph, mine in zip(runs_, graphs, shared)]
    curves = {run.name: graph["faithfulness"] for run, graph in zip(runs_, graphs) if graph}
    lines.append("A node's card is a photo's: choose *this photo* to open one.")
    return Shown("\n\n".join(lines), *pictures, circuit_faithfulness(curves) if curves else None,
                 gr.Dropdown(choices=[], value=None), None, "", None)


def class_picture(run: ModelRun, graph: dict, shared: set[str]) -> np.ndarray:
    """A class circuit drawn on a grey photo of the model's input size: its geometry (the token grids) is the
    model's whatever the photo, its maps the class's averages."""
    from PIL import Image

    from ..circuits.pair import places
    from ..render import Canvas

    h, w = run.loaded.transform.crop
    grey = Image.new("RGB", (w, h), (128, 128, 128))
    canvas = Canvas(grey, run.loaded.transform, run.trace.embeddings)
    return circuit_graph(graph, canvas, places(run.trace, run.loaded.transform, (h, w), graph), shared=shared)


def card_picture(run: ModelRun, found: gpu.CircuitReading, node, shown: list | None = None) -> np.ndarray:
    """The card: the node's map over the photo (shaded where the model never saw it), its pictures (`shown`:
    `pictures.card_pictures`' pairs; None: an error node's, none) and its top images under it."""
    thumbnail = run.canvas.thumbnail(photo_side(run.canvas.size))
    base = thumbnail.shaded(thumbnail.fields[run.trace.blocks[node.block].stage])
    region = sites_on_photo(run, {"sites": found.circuit.sites})[node.block][1]
    values = np.abs(np.asarray(node.map, np.float32)).reshape(node.grid)
    photo = cell_overlay(base, values, region, vmax=float(values.max()),
                         **({"cmap": ERROR_CMAP} if node.kind == "error" else {}))
    images = tuple(found.exemplars.get(node.id, ()))
    tiles = exemplar_tiles(images, exemplar_layout(len(images))[1]) if images else ()
    return concept_card(photo, tiles, title=f"{run.name}: {node.name}", pictures=shown)


def node_asked(key, found: list[gpu.CircuitReading | str], side: int, node) -> pictures.Asked:
    """What a concept node's pictures are of: its dictionary's concept, on its model, or on every model whose circuit
    reads the same dictionary across models."""
    site = next(site for site in found[side].circuit.sites if site["block"] == node.block)
    names = session(key).names
    models = tuple(name for name, reading in zip(names, found) if not isinstance(reading, str)
                   and any(s["dictionary"] == site["dictionary"] for s in reading.circuit.sites))
    return pictures.Asked(site["dictionary"], int(node.concept), models if site["across"] else (names[side],))


def node_card(key, asked, picked) -> Card:
    """The card of the node picked ('side:node id'), and both graphs with it framed."""
    if key is None or asked is None or not picked:
        return Card(None, "", gr.skip(), gr.skip(), gr.Button(visible=False), gr.Button(visible=False))
    side, node_id = picked.split(":", 1)
    runs_, found = runs(key), readings(key, tuple(asked))
    side = int(side)
    reading = found[side]
    if isinstance(reading, str) or node_id not in {n.id for n in reading.circuit.nodes}:
        raise gr.Error(f"The {SIDES[side]} circuit has no node {node_id}: draw the circuits again.")
    node = reading.circuit.node(node_id)
    graphs = graphs_of(found)
    shared = shared_of(graphs)
    partner = ""
    if node_id in shared[side]:
        other = found[1 - side].circuit
        twin = next(n for n in other.nodes if n.id in shared[1 - side] and n.concept == node.concept)
        partner = (f"**In both models**: {runs_[1 - side].name}'s circuit holds the same concept at block "
                   f"{twin.block + 1}, with effect {twin.effect:+.3f}.")
    graph_pictures = [graph_picture(run, graph, mine, node_id if k == side else None)
                      for k, (run, graph, mine) in enumerate(zip(runs_, graphs, shared))]
    words = card_words(runs_[side], reading, node, partner)
    if node.kind != "concept":
        return Card(card_picture(runs_[side], reading, node), words, *graph_pictures, gr.Button(visible=False),
                    gr.Button(visible=False))
    asked = node_asked(key, found, side, node)
    shown = pictures.card_pictures(key, asked)
    words += "\n\n" + pictures.words(key, asked, f"**What it looks like** ({node.name})")
    return Card(card_picture(runs_[side], reading, node, shown), words, *graph_pictures,
                *pictures.buttons(key, asked))


def draw_node(key, asked, picked, progress=gr.Progress(), *, drawing=pictures.draw,
              button: str = "Draw this concept") -> Card:
    """"Draw this concept" (or, with `drawing` `pictures.draw_variants`, "Draw variants"): the picked concept node's
    pictures (a GPU call the first time; kept in the session), and its card drawn again with them."""
    if key is None or asked is None or not picked:
        raise gr.Error(f"Draw the circuits and pick a concept node first, then press {button}.")
    side, node_id = picked.split(":", 1)
    found = readings(key, tuple(asked))
    reading = found[int(side)]
    if isinstance(reading, str) or node_id not in {n.id for n in reading.circuit.nodes if n.kind == "concept"}:
        raise gr.Error("Only a concept node has pictures: pick one in the graphs or the list.")
    drawing(key, node_asked(key, found, int(side), reading.circuit.node(node_id)), progress)
    return node_card(key, asked, picked)


def draw_node_variants(key, asked, picked, progress=gr.Progress()) -> Card:
    """"Draw variants": the picked concept node's variants and negative (`pictures.draw_variants`), on its card."""
    return draw_node(key, asked, picked, progress, drawing=pictures.draw_variants, button="Draw variants")


def picked_at(side: int) -> Callable:
    """The handler of a click on one side's graph: the node under it, as the node box's value (unchanged where the
    click hit no node)."""
    def pick(key, asked, evt: gr.SelectData):
        if key is None or asked is None:
            return gr.skip()
        reading = readings(key, tuple(asked))[side]
        if isinstance(reading, str):
            return gr.skip()
        node = node_at(graph_layout(reading.circuit.to_json()), tuple(evt.index))
        kind = None if node is None else reading.circuit.node(node).kind
        return f"{side}:{node}" if kind in ("concept", "error") else gr.skip()
    return pick


def circuits_open(evt: gr.SelectData) -> bool:
    """Whether the top-level tab just selected is this one (an Explain then draws the circuits at once)."""
    return evt.value == TITLE


def after_explain(key) -> tuple:
    """A new Explain: the class boxes for the left model, nothing drawn of the last photo."""
    return (*class_box(key), *Shown("", None, None, None, gr.Dropdown(choices=[], value=None), None, "", None))


def circuits_if_open(key, target, contrast, baseline, method, frozen, faithful, scope, is_open: bool,
                     progress=gr.Progress()) -> Shown:
    if not is_open:
        return Shown(*(gr.skip(),) * len(Shown._fields))
    return render_circuits(key, target, contrast, baseline, method, frozen, faithful, scope, progress=progress)


@dataclass
class CircuitsTab:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None
    on_point: tuple       # (handler, inputs, outputs) for a click on the photo: the circuit of that place


def layout(page: Page) -> CircuitsTab:
    key = page.key
    with gr.Tab(TITLE, id="circuits") as tab:
        gr.Markdown(WORDS)
        with gr.Row(equal_height=False):
            target = gr.Dropdown([("the left model's top class", TOP)], value=TOP, allow_custom_value=True,
                                 label="class", info="the logit the circuit builds", min_width=180,
                                 elem_id="circuits-class")
            contrast = gr.Dropdown([("none", NONE)], value=NONE, allow_custom_value=True, label="contrast class",
                                   info="optional: the class's logit minus this one's", min_width=180,
                                   elem_id="circuits-contrast")
            faithful = gr.Slider(*FAITHFUL_RANGE, value=FAITHFUL, step=0.05, label="faithfulness to reach",
                                 info="the circuit: the fewest nodes, strongest first, whose F reaches this",
                                 min_width=220, elem_id="circuits-faithfulness")
            scope = gr.Radio(SCOPES, value=PHOTO_SCOPE, label="the circuits explain", min_width=220,
                             elem_id="circuits-scope")
            draw = gr.Button("Draw the circuits", variant="primary", scale=0, min_width=160, elem_id="circuits-draw")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=220):
                baseline = gr.Radio(BASELINES, value="zero", label="a node taken out is set to",
                                    elem_id="circuits-baseline")
            with gr.Column(min_width=260):
                method = gr.Radio(METHODS, value="atp", label="effects by", elem_id="circuits-method")
            with gr.Column(min_width=220):
                frozen = gr.Checkbox(label="hold attention fixed", info="its patterns and norm scales as this photo's "
                                     "constants (circuit-tracer's convention)", elem_id="circuits-frozen")
        note = gr.Markdown(elem_id="circuits-note")
        size = gr.Slider(1, 2, value=1, step=1, label="circuit size (nodes)", interactive=False,
                         info="both circuits pruned again to this many nodes, strongest first: no model runs",
                         elem_id="circuits-size")
        with gr.Row(equal_height=False):
            graph_a = gr.Image(label="left: its circuit (click a node)", interactive=False, min_width=300,
                               elem_id="circuits-graph-a")
            graph_b = gr.Image(label="right: its circuit (click a node)", interactive=False, min_width=300,
                               elem_id="circuits-graph-b")
        curves = gr.Image(label="faithfulness against the circuit's size", interactive=False, height=300,
                          elem_id="circuits-curves")
        picker = gr.Dropdown([], value=None, label="a node's card", info="or click it in a graph",
                             elem_id="circuits-node")
        with gr.Row(equal_height=False):
            card = gr.Image(label="where it fires, its top images", interactive=False, min_width=300,
                            elem_id="circuits-card")
            with gr.Column(min_width=300):
                words = gr.Markdown(elem_id="circuits-card-words")
                draw_concept = gr.Button("Draw this concept", visible=False, elem_id="circuits-draw-concept")
                draw_variants = gr.Button("Draw variants", visible=False, elem_id="circuits-draw-variants")

    with tab:   # not among the top-level Tabs' children, which Gradio's frontend counts as its tabs' indices
        is_open, asked = gr.State(False), gr.State(None)
        cell_outputs = list(circuit_cells.layout())
    choices = [target, contrast, baseline, method, frozen, faithful, scope]
    outputs = [note, graph_a, graph_b, curves, picker, card, words, asked]

    def sized(event) -> None:   # after a drawing: the size slider over what its circuits kept
        event.success(size_slider, inputs=[key, asked], outputs=[size], api_name=None, **INSTANT, **HIDDEN)
    sized(draw.click(as_files(render_circuits), inputs=[key, *choices], outputs=outputs, api_name="circuit",
                     **MODEL_EVENTS))
    sized(tab.select(as_files(render_circuits), inputs=[key, *choices], outputs=outputs, api_name=None,
                     **MODEL_EVENTS, **HIDDEN))
    for control in (target.input, contrast.input, baseline.input, method.input, frozen.input, faithful.release,
                    scope.input):
        sized(control(as_files(render_circuits), inputs=[key, *choices], outputs=outputs, api_name=None,
                      **MODEL_EVENTS, **HIDDEN))
    size.release(as_files(resize_circuits), inputs=[key, asked, size], outputs=outputs, api_name=None, **INSTANT,
                 **HIDDEN)   # on the host: what the drawing kept, pruned again
    card_outputs = [card, words, graph_a, graph_b, draw_concept, draw_variants]
    picker.change(as_files(node_card), inputs=[key, asked, picker], outputs=card_outputs, api_name=None, **INSTANT,
                  **HIDDEN)
    for button, handler in ((draw_concept, draw_node), (draw_variants, draw_node_variants)):
        button.click(as_files(handler), inputs=[key, asked, picker], outputs=card_outputs, api_name=None,
                     **MODEL_EVENTS, **HIDDEN)   # `/looks`'s computation, for the picked node
    for side, graph in enumerate((graph_a, graph_b)):
        graph.select(picked_at(side), inputs=[key, asked], outputs=[picker], api_name=None, **INSTANT, **HIDDEN)
    page.tabs.select(circuits_open, outputs=[is_open], api_name="circuits_open", **INSTANT, **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain: the class boxes for the new models, the last photo's circuits cleared and, with this tab
        open, the new photo's (a model pass)."""
        cleared = event.success(after_explain, inputs=[key], outputs=[target, contrast, *outputs], api_name=None,
                                **INSTANT, **HIDDEN)
        sized(cleared)
        sized(cleared.success(as_files(circuits_if_open), inputs=[key, *choices, is_open], outputs=outputs,
                              api_name=None, **MODEL_EVENTS, **HIDDEN))

    return CircuitsTab(explained=explained, on_point=(as_files(circuit_cells.cell_circuits),
                                                      [key, page.point, asked, is_open], cell_outputs))
