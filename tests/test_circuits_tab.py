"""The app's Circuits tab: both models' circuits for one class, equal to the library's (`circuits.photo_circuit` on the
locally loaded models); one model pass per set of choices; a node's card (its effect, how often it fires by its
exemplar index, what removing it does by `splice.concept_effects`, its edges) and a click on its tile; the drawing
(edges as wide as their weights, coloured by sign; shared and picked nodes framed); the refusals in words; and the
launched app from a real client and a real browser, at a desktop's and a phone's width."""
import json
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

import vitviz
from tests.app_server import SCREENSHOTS, explained_page
from vitviz.circuits import pair, photo_circuit
from vitviz.concepts import load
from vitviz.concepts.analysis.exemplars import index_in
from vitviz.concepts.analysis.splice import concept_effects
from vitviz.render import circuits as drawing
from vitviz.render.concepts import CARD_WIDTH
from vitviz.session import ModelRun
from vitviz.ui import circuit_cells, circuits, gpu, page, shared
from vitviz.ui.concept_words import change, percent

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
# two of the ViT's depths and the CvT's last block, each with an exemplar index: quick, and every card has names
SOURCES = {"vit-cifar10": ["vit-cifar10-middle", "vit-cifar10-last"], "cvt-cifar10": ["cvt-cifar10-last"]}
DEFAULT_SOURCES = pair.sources_for   # what the launched app reads, whatever `few_dictionaries` puts in its place here
QUIET = dict(progress=lambda *a, **k: None)


@pytest.fixture(scope="module")
def few_dictionaries():
    """The tab's circuits through `SOURCES` instead of the bundled depths (what `gpu.read_circuits` asks for)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pair, "sources_for", lambda loaded, sources=None: [SOURCES[m.name] for m in loaded])
        yield


@pytest.fixture(scope="module")
def shown_pair(few_dictionaries) -> tuple[str, circuits.Shown]:
    """One Explain of the photo and the tab's circuits of it, by default but holding every ranked node (on this photo
    one concept already reaches F 0.6; the cards' tests need nodes at every site): (its key, what the tab shows)."""
    from vitviz.circuits.prefixes import Prefixes

    key = explained()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Prefixes, "size", lambda self, faithful: (self.ranked, None))
        return key, drawn(key)


@pytest.fixture
def calls(monkeypatch) -> list:
    """Each `gpu.read_circuits` call's arguments (the call still runs)."""
    made, read = [], gpu.read_circuits
    monkeypatch.setattr(gpu, "read_circuits", lambda *a, **k: made.append((a, k)) or read(*a, **k))
    return made


def explained() -> str:
    return page.explain({"path": str(PHOTO)}, *PAIR, **QUIET).key


def drawn(key, **choices) -> circuits.Shown:
    return circuits.render_circuits(key, **choices, **QUIET)


@pytest.mark.slow
def test_both_circuits_are_the_librarys_for_the_left_models_top_class_and_kept_per_choice(few_dictionaries, calls):
    key = explained()
    shown = drawn(key)
    runs = shared.runs(key)
    top = runs[0].top(1)[0].label
    assert shown.asked == (top, None, "zero", "atp", False, 0.6, None) and len(calls) == 1
    found = circuits.readings(key, shown.asked)
    for run, reading in zip(runs, found):
        loaded = vitviz.load(run.name)
        reference = photo_circuit(loaded, shared.session(key).picture, dictionaries=SOURCES[run.name],
                                  target=loaded.labels.index(top))
        assert reading.circuit.to_json() == reference.to_json()
        assert f"**{run.name}**: the logit of {top} minus the mean logit = {reference.value:.2f}" in shown.note
        assert f"F = {reference.faithfulness['value']:.2f}**" in shown.note and reference.attention in shown.note
    for picture, reading in zip((shown.graph_a, shown.graph_b), found):
        assert picture.shape == (*drawing.graph_layout(reading.circuit.to_json()).size, 3)
    nodes = [n for reading in found for n in reading.circuit.nodes if n.kind in ("concept", "error")]
    assert len(shown.picker.choices) == len(nodes) and shown.curves is not None
    drawn(key)                    # the same choices: kept
    assert len(calls) == 1
    again = drawn(key, faithful=0.5, contrast="dog")
    assert len(calls) == 2 and again.asked == (top, "dog", "zero", "atp", False, 0.5, None)
    assert "minus that of dog" in again.note


def test_a_nodes_card_says_its_effect_frequency_edges_and_what_removing_it_does(shown_pair, calls):
    key, shown = shown_pair
    reading = circuits.readings(key, shown.asked)[0]
    c = reading.circuit
    node = max((n for n in c.nodes if n.kind == "concept" and n.block == 6 and c.inputs(n.id)),
               key=lambda n: abs(n.effect))
    card = circuits.node_card(key, shown.asked, f"0:{node.id}")
    assert card.card.shape[1] == CARD_WIDTH and card.card.shape[0] > CARD_WIDTH // 2   # the map, its top images
    assert f"**{node.name}**, block 7 of vit-cifar10" in card.words and f"**{node.effect:+.3f}**" in card.words
    dictionary = load("vit-cifar10-last")
    index = index_in("vit-cifar10-last", dictionary=dictionary)
    assert f"fires on {percent(float(index.frequency[node.concept]))} of {Path(index.data).name}'s tokens" in card.words
    loaded = vitviz.load("vit-cifar10")
    run = ModelRun(loaded, shared.session(key).picture)
    effects = concept_effects(loaded, run.trace, dictionary, concepts=[node.concept], target=c.target, block=6)
    assert f"{c.target_label} {change(effects.probability, float(effects.probabilities[0]))}" in card.words
    strongest = c.inputs(node.id)[0]
    assert f"block {c.node(strongest.source).block + 1} {c.node(strongest.source).name} ({strongest.weight:+.3f})" \
        in card.words
    box = drawing.graph_layout(c.to_json()).boxes[node.id]
    assert tuple(card.graph_a[box[1] - 2, (box[0] + box[2]) // 2]) == drawing.PICKED   # framed where it is drawn
    values = np.asarray(node.effect_map).reshape(node.grid)   # where it acts, cell by cell, as numbers
    if np.abs(values).max() < 5e-4:   # at the last block the answer is read from the class token alone
        assert (f"**Its effect cell by cell**: none at the grid's cells (under 0.0005 each); at the class token "
                f"{node.effect - values.sum():+.3f}.") in card.words
    else:
        r, col = np.unravel_index(np.abs(values).argmax(), node.grid)
        assert f"**Its effect cell by cell** (row, column from the top left): strongest at ({r}, {col}) " \
               f"{values[r, col]:+.3f}" in card.words
        assert " ".join(f"{v:+.3f}" for v in values[0]) in card.words
    error = circuits.node_card(key, shown.asked, "1:b8/error")
    assert "**The error at block 9** of cvt-cifar10" in error.words and "Remove this concept" not in error.words
    assert "**Its effect cell by cell**" in error.words
    assert not calls   # cards are drawn from the kept circuits


def test_a_click_on_the_photo_draws_each_models_circuit_of_that_place_as_the_library_does(shown_pair, monkeypatch):
    """The place is, at each block, the cell of its grid under the click; the circuit is the library's
    (`position_circuit` with that place: the drawn circuits' class and dictionaries), one GPU call a place."""
    key, shown = shown_pair
    made, read = [], gpu.read_cell_circuits
    monkeypatch.setattr(gpu, "read_cell_circuits", lambda *a, **k: made.append(a) or read(*a, **k))
    kept = shared.session(key)
    w, h = kept.runs[0].image.info.get("full_size", kept.runs[0].image.size)
    point = (0.55 * w, 0.4 * h)   # (x, y) in the shown photo's pixels
    answer = circuit_cells.cell_circuits(key, point, shown.asked)
    assert circuit_cells.cell_circuits(key, point, shown.asked).words == answer.words
    assert len(made) == 1   # the second click on the place reads what the first kept
    found = circuits.readings(key, shown.asked)
    for run, reading, picture in zip(kept.runs, found, answer[1:]):
        graph = reading.circuit.to_json()
        rows = circuit_cells.rows_at(run, graph, point)
        assert all(row is not None for row in rows) and isinstance(picture, np.ndarray)
        for site, row in zip(graph["sites"], rows):   # the cell under (0.4, 0.55) of the photo
            (y0, x0, y1, x1), (gh, gw) = circuits.sites_on_photo(run, graph)[site["block"]][1], site["grid"]
            cell = int((0.4 - y0) / (y1 - y0) * gh) * gw + int((0.55 - x0) / (x1 - x0) * gw)
            assert row == site["class_token"] + cell
        expected = photo_circuit(vitviz.load(run.name), kept.picture, dictionaries=SOURCES[run.name],
                                 target=graph["target"],
                                 positions=True, place=list(rows))
        assert f"F = {expected.faithfulness['value']:.2f}" in answer.words if expected.faithfulness["value"] \
            is not None else "F is undefined here" in answer.words
        assert f"the circuit holds {expected.faithfulness['concept_nodes']} of the" in answer.words
    assert "The circuit of one place" in answer.words
    assert circuit_cells.cell_circuits(key, point, None).words == circuit_cells.WAITING
    assert circuit_cells.cell_circuits(key, point, shown.asked, False) == circuit_cells.Drawn(*(gr.skip(),) * 3)


def test_the_size_slider_prunes_both_circuits_again_on_the_host_to_what_the_library_draws_at_that_size(shown_pair,
                                                                                                      calls):
    """The slider's range is what the drawing kept; moving it redraws both graphs, the curves' stars and the words
    with F at that size, equal to the library's circuit of that many nodes (computed here, every size kept as the
    drawing did), with no GPU call; a node new at that size opens its card; beyond what a model kept, it says so."""
    from test_circuits_adjacency import close, comparable

    key, shown = shown_pair
    found = circuits.readings(key, shown.asked)
    held = [reading.circuit.adjacency.held for reading in found]
    slider = circuits.size_slider(key, shown.asked)
    assert (slider.minimum, slider.maximum, slider.value) == (1, max(held), found[0].circuit.faithfulness["nodes"])
    runs, picture = shared.runs(key), shared.session(key).picture
    top = shown.asked[0]
    resized = circuits.resize_circuits(key, shown.asked, 5)
    assert resized.asked == (*shown.asked[:-1], 5) and "**Circuits of 5 nodes**" in resized.note
    for run, reading, graph in zip(runs, circuits.readings(key, resized.asked), (resized.graph_a, resized.graph_b)):
        loaded = vitviz.load(run.name)
        reference = photo_circuit(loaded, picture, dictionaries=SOURCES[run.name], target=loaded.labels.index(top),
                                  nodes=5, every=True)
        close(comparable(reading.circuit), comparable(reference), run.name)
        assert f"F = {reference.faithfulness['value']:.2f}**" in resized.note
        assert graph.shape == (*drawing.graph_layout(reading.circuit.to_json()).size, 3)
        node = next(n for n in reading.circuit.nodes if n.kind == "concept")
        side = runs.index(run)
        assert f"**{node.name}**" in circuits.node_card(key, resized.asked, f"{side}:{node.id}").words
    assert resized.curves is not None and not np.array_equal(resized.curves, shown.curves)   # the stars moved
    assert not calls   # pruned on the host from what the drawing kept
    short = min(held)
    if short < max(held):
        beyond = circuits.resize_circuits(key, shown.asked, max(held))
        assert f"kept every size up to {short} nodes and is drawn at that" in beyond.note


def test_a_concept_nodes_card_shows_its_pictures_and_draws_them_where_none_ship(shown_pair, monkeypatch):
    from vitviz import looks
    from vitviz.ui import pictures
    key, shown = shown_pair
    settings = looks.Settings(method=looks.Maco(canvas=1.0, box=(0.8, 1.0)), steps=3, copies=1, seed=0)
    monkeypatch.setattr(pictures, "settings", lambda: settings)   # the shipped settings, cut to a few steps
    shipped = pictures.shipped
    monkeypatch.setattr(pictures, "shipped", lambda source: None if source == "vit-cifar10-middle" else shipped(source))
    drawn, card_of = [], circuits.concept_card
    monkeypatch.setattr(circuits, "concept_card", lambda *a, **k: drawn.append(k) or card_of(*a, **k))
    c = circuits.readings(key, shown.asked)[0].circuit
    block = {site["dictionary"]: site["block"] for site in c.sites}
    node = next(n for n in c.nodes if n.kind == "concept" and n.block == block["vit-cifar10-middle"])
    card = circuits.node_card(key, shown.asked, f"0:{node.id}")
    assert card.draw.visible and drawn[-1]["pictures"] == []
    assert "no picture of it ships with vit-cifar10-middle. **Draw this concept** draws one in vit-cifar10 (" \
        in card.words
    made = circuits.draw_node(key, shown.asked, f"0:{node.id}", **QUIET)
    reference = looks.draw("vit-cifar10", looks.Concept("vit-cifar10-middle", node.concept), settings=settings,
                           device="cpu", bar=False)
    (label, picture), = drawn[-1]["pictures"]
    assert label == "its picture" and np.array_equal(picture, reference.images[0])
    assert not made.draw.visible and "its pictures were drawn here" in made.words and made.variants.visible
    made = circuits.draw_node_variants(key, shown.asked, f"0:{node.id}", **QUIET)   # three more and the negative
    assert [label for label, _ in drawn[-1]["pictures"]] == ["its picture", "v1", "v2", "v3", "negative"]
    assert not made.variants.visible and "Its 3 variants (v1 to v3) and its negative were drawn here" in made.words
    with pytest.raises(gr.Error, match="Only a concept node has pictures"):
        circuits.draw_node(key, shown.asked, "1:b8/error", **QUIET)
    last = next(n for n in c.nodes if n.kind == "concept" and n.block == block["vit-cifar10-last"])
    expected = looks.pictures_of("vit-cifar10-last")   # shipped beside the bundled dictionary
    card = circuits.node_card(key, shown.asked, f"0:{last.id}")
    (label, picture), = drawn[-1]["pictures"]
    assert label == "its picture" and np.array_equal(picture, expected.picture(last.concept)[0])
    assert not card.draw.visible and "its picture ships with vit-cifar10-last (MACO, 32 steps, seed 0)" in card.words
    error = circuits.node_card(key, shown.asked, "1:b8/error")
    assert drawn[-1]["pictures"] is None and not error.draw.visible   # an error node has no concept to draw


def test_a_click_on_a_tile_picks_its_node_and_a_click_beside_the_nodes_picks_none(shown_pair):
    key, shown = shown_pair
    c = circuits.readings(key, shown.asked)[1].circuit
    layout = drawing.graph_layout(c.to_json())

    def click(x, y):
        return circuits.picked_at(1)(key, shown.asked, gr.SelectData(None, {"index": [x, y], "value": None}))
    for node in c.nodes:
        x0, y0, x1, y1 = layout.boxes[node.id]
        assert click((x0 + x1) // 2, (y0 + y1) // 2) == (f"1:{node.id}" if node.kind in ("concept", "error")
                                                         else gr.skip())
    assert click(layout.size[1] - 2, layout.size[0] - 2) == gr.skip()


@pytest.mark.parametrize("choices, words", [
    (dict(target="zebra"), "Neither model has the class 'zebra'"),
    (dict(target="cat", contrast="cat"), "The contrast class is the class itself"),
    (dict(faithful=0.05), "from 0.1 to 1.0, not 0.05"),
    (dict(method="lrp"), "The method is atp"),
    (dict(scope="video"), "the class over the test set"),
    (dict(method="ig", frozen=True), "attention held fixed are not offered"),
], ids=["a class neither model has", "the contrast is the class", "a faithfulness below 0.1", "an unknown method",
        "an unknown scope", "integrated gradients with attention held fixed"])
def test_a_bad_choice_is_refused_in_words_before_any_model_runs(shown_pair, monkeypatch, choices, words):
    key, _ = shown_pair
    monkeypatch.setattr(gpu, "read_circuits", lambda *a, **k: pytest.fail("a model ran"))
    with pytest.raises(gr.Error, match=words):
        drawn(key, **choices)
    assert drawn(None).note == circuits.WAITING


def graph(sites, nodes, edges) -> dict:
    """A graph in `Circuit.to_json`'s shape, made by hand."""
    return {"model": "m", "metric": "the logit of cat", "value": 1.0, "target": 0, "target_label": "cat",
            "contrast": None, "sites": sites, "nodes": nodes, "edges": edges, "faithfulness": {},
            "size": {"nodes": len(nodes), "concept_nodes": 2, "edges": len(edges), "concepts_to_choose_from": 8}}


def node(id, kind, effect=None, block=None, concept=None):
    return {"id": id, "kind": kind, "name": f"#{concept} cat 60 %" if kind == "concept" else id, "effect": effect,
            "block": block, "concept": concept, "grid": [2, 2], "map": [0.0, 1.0, 2.0, 3.0]}


def test_each_edge_is_as_wide_as_its_weight_and_coloured_by_its_sign_and_shared_nodes_are_framed():
    site = {"block": 0, "dictionary": "d", "across": True, "grid": [2, 2]}
    nodes = [node("input", "input"), node("b0/c1", "concept", 1.0, 0, 1), node("b0/c2", "concept", -0.5, 0, 2),
             node("b0/error", "error", 0.1, 0), node("logit", "logit", 1.0)]
    edges = [{"source": "input", "target": n["id"], "weight": n["effect"]} for n in nodes[1:4]]
    edges += [{"source": n["id"], "target": "logit", "weight": n["effect"]} for n in nodes[1:4]]
    one = graph([site], nodes, edges)
    other = graph([{**site, "block": 3}], [{**n, "id": n["id"].replace("b0", "b3"), "block": 3} if n["block"] == 0
                                           else n for n in nodes[:2]] + [nodes[-1]], [])
    assert pair.shared_nodes([one, other]) == [{"b0/c1"}, {"b3/c1"}]
    run = ModelRun(vitviz.load("vit-cifar10"), Image.open(PHOTO).convert("RGB"))
    out = drawing.circuit_graph(one, run.canvas, {0: (0, (0.0, 0.0, 1.0, 1.0))}, shared={"b0/c1"})
    layout = drawing.graph_layout(one)
    widths = []
    for n, colour in ((nodes[1], drawing.FOR), (nodes[2], drawing.AGAINST), (nodes[3], drawing.FOR)):
        x0, y0, x1, y1 = layout.boxes[n["id"]]
        x = (x1 + layout.spans[n["id"]][1]) // 2   # the level run from the tile to its column's edge
        blended = 0.85 * np.array(colour) + 0.15 * np.array(drawing.STRIP)   # drawn at 85 % over the ground
        widths.append(int((np.abs(out[y0:y1, x].astype(float) - blended).max(1) < 40).sum()))
    strongest, half, tenth = widths   # |weight| 1, 0.5 (against) and 0.1: OpenCV's widths are odd, anti-aliased
    assert abs(strongest - drawing.WIDEST) <= 2 and strongest > half > tenth >= 1 and tenth <= 3, widths
    x0, y0, x1, _ = layout.boxes["b0/c1"]
    assert tuple(out[y0 - 2, (x0 + x1) // 2]) == drawing.SHARED


@pytest.fixture(scope="module")
def left_graph() -> dict:
    """The left model's circuit as the launched app draws it by default (its top class, the pair's dictionaries),
    computed here: where its nodes lie in its picture."""
    loaded = [vitviz.load(name) for name in PAIR]
    image = Image.open(PHOTO).convert("RGB")
    return photo_circuit(loaded[0], image, dictionaries=DEFAULT_SOURCES(loaded)[0]).to_json()


@pytest.mark.slow
def test_circuit_is_one_documented_endpoint_and_answers_from_a_real_client(bundled_app):
    from gradio_client import Client, handle_file
    client = Client(bundled_app.url, verbose=False, analytics_enabled=False,
                    download_files=str(bundled_app.log.parent / "downloads"))
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/circuit" in api and "/circuits_open" not in api
    assert [p["parameter_name"] for p in api["/circuit"]["parameters"]] == [
        "target", "contrast", "baseline", "method", "frozen", "faithful", "scope"]
    client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    note, graph_a, graph_b, curves, picker, card, words = client.predict(
        "dog", "", "zero", "atp", False, 0.6, "photo", api_name="/circuit")
    assert all(f"**{name}**: the logit of dog" in note for name in PAIR) and "F = " in note
    for picture in (graph_a, graph_b, curves):
        assert Path(picture).is_file() and Image.open(picture).width > 300
    with pytest.raises(Exception, match="Neither model has the class 'zebra'"):
        client.predict("zebra", "", "zero", "atp", False, 0.6, "photo", api_name="/circuit")


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 390], ids=["1400 px wide", "a phone, 390 px wide"])
def test_a_person_opens_the_circuits_tab_sees_both_graphs_and_their_faithfulness_and_clicks_a_node(bundled_app, width,
                                                                                                 left_graph):
    from tests.test_app import open_tab
    with explained_page(bundled_app.url, PHOTO, width=width) as page_:
        open_tab(page_, "Circuits")   # opening it draws both circuits
        page_.locator("#circuits-note").get_by_text("F = ").first.wait_for(timeout=300_000)
        for panel in ("#circuits-graph-a", "#circuits-graph-b", "#circuits-curves"):
            image = page_.locator(f"{panel} img").first
            image.wait_for(state="attached", timeout=60_000)   # below a phone's fold a lazy image has no size yet
            image.scroll_into_view_if_needed()
            image.wait_for(timeout=60_000)
        page_.wait_for_function("() => ['#circuits-graph-a', '#circuits-graph-b', '#circuits-curves'].every(s => {"
                                "const i = document.querySelector(s + ' img'); return i && i.complete && "
                                "i.naturalWidth > 300; })", timeout=30_000)
        note = page_.locator("#circuits-note").inner_text()
        assert all(f"{name}: the logit of" in note for name in PAIR) and "faithfulness F =" in note
        graph = page_.locator("#circuits-graph-a img").first   # a click on the left graph's strongest node
        shown = graph.bounding_box()
        assert shown["width"] <= width   # the graph fits the page, whatever its width
        strongest = max((n for n in left_graph["nodes"] if n["kind"] == "concept"), key=lambda n: abs(n["effect"]))
        layout = drawing.graph_layout(left_graph)
        x0, y0, x1, y1 = layout.boxes[strongest["id"]]
        scale = shown["width"] / layout.size[1]
        graph.scroll_into_view_if_needed()
        graph.click(position={"x": (x0 + x1) / 2 * scale, "y": (y0 + y1) / 2 * scale})
        page_.locator("#circuits-card-words").get_by_text(strongest["name"]).first.wait_for(timeout=60_000)
        page_.locator("#circuits-card img").first.wait_for(timeout=30_000)
        page_.locator("#tabs").screenshot(path=str(SCREENSHOTS / f"10-circuits-{width}.png"))
        before = page_.locator("#circuits-graph-a img").first.get_attribute("src")
        size = page_.locator("#circuits-size input[type=range]")   # both circuits pruned again to 5 nodes
        page_.wait_for_function("() => !document.querySelector('#circuits-size input[type=range]').disabled",
                                timeout=30_000)
        size.scroll_into_view_if_needed()
        size.fill("5")
        size.dispatch_event("pointerup")   # the end of a drag: Gradio's `release`
        page_.locator("#circuits-note").get_by_text("Circuits of 5 nodes").first.wait_for(timeout=60_000)
        page_.wait_for_function("before => document.querySelector('#circuits-graph-a img').src !== before",
                                arg=before, timeout=30_000)
        assert "faithfulness F =" in page_.locator("#circuits-note").inner_text()
    assert bundled_app.process.poll() is None


def test_the_class_over_the_test_set_shows_the_shipped_class_circuits_and_runs_no_model(shown_pair, calls, monkeypatch,
                                                                                         tmp_path, cifar10_test):
    """The scope 'class': each model's class circuit read from the shipped folder (here one made on 3 images), its F
    and interval in the words, drawn on a grey photo; a model without one is told how to make it; no GPU call."""
    from vitviz import catalog
    from vitviz.circuits import data_class_circuit
    from vitviz.circuits.classes import file_name

    key, _ = shown_pair
    loaded = vitviz.load("vit-cifar10")
    made = data_class_circuit(loaded, cifar10_test, dictionaries=SOURCES["vit-cifar10"], target=3, limit=3,
                              progress=False)
    (tmp_path / file_name("vit-cifar10", "cat")).write_text(json.dumps(made.to_json()))
    monkeypatch.setattr(catalog, "CLASS_CIRCUITS", tmp_path)
    shown = drawn(key, target="cat", scope="class")
    f = made.faithfulness
    assert f"**vit-cifar10**: the logit of cat minus the mean logit over 3 test images labelled cat: " \
           f"**F = {f['value']:.2f}** (95% interval {f['interval'][0]:.2f} to {f['interval'][1]:.2f})" in shown.note
    assert "**cvt-cifar10**: no circuit of cat over a data set ships for it" in shown.note
    assert shown.graph_a.shape == (*drawing.graph_layout(made.to_json()).size, 3) and shown.graph_b is None
    assert shown.curves is not None and shown.asked is None and not calls
