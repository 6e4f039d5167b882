"""Circuits per position (`vitviz.circuits.positions`): a node is a concept (or an error) at one cell. Its effect is
the derivative along that cell's code alone (central differences through a hook on the plain model), a concept's
effects per cell add up to its whole effect, F and completeness are Marks et al.'s with m(∅) and m(C) recomputed by
a forward that edits each cell itself, and the edges per position add up to the whole concepts' edges."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_circuits import TwoLinearBlocks, identity_site, standard
from tiny_models import tiny, tiny_sites
from vitviz.circuits import Metric, circuit
from vitviz.circuits.effects import attribution, edges_between, integrated_gradients
from vitviz.circuits.graph import position_id
from vitviz.circuits.host import read_states
from vitviz.circuits.positions import cell_hosts, concept_host, position_circuit

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def swin():
    """A tiny Swin with dictionaries at its first and last blocks (both grids feed its pooled classifier)."""
    loaded, pixels, sites = tiny_sites(tiny("swin"), blocks=[0, -1])
    return loaded, pixels, sites, Metric(2)


def edited_metric(loaded, pixels, metric, sites, keep) -> float:
    """m with, at each site, row t's concept c kept where keep[s][t, c] (c = n: the row's error), every other at zero:
    the rows rebuilt here from each dictionary (not by `effects.ablated`)."""
    at = {site.block: s for s, site in enumerate(sites)}

    def edit(index, tokens):
        if index not in at:
            return tokens
        site, mask = sites[at[index]], torch.as_tensor(keep[at[index]])
        rows = site.rows(tokens)
        codes = site.dictionary.encode(rows)
        error = rows - site.dictionary.decode(codes, rows)
        rebuilt = site.dictionary.decode(torch.where(mask[:, :-1], codes, 0), rows) + \
            torch.where(mask[:, -1:], error, 0)
        return tokens + site.write @ (rebuilt - rows)

    with torch.inference_mode():
        return float(metric(loaded.model.trace(pixels, attention=False, edit=edit).logits)[0])


def test_a_nodes_effect_is_the_derivative_along_its_cells_code_alone(swin):
    """IE(z_{t,c}) = d/dh m(z_{t,c} moved by h (z - z₀)_{t,c}) at h = 0, by central differences through a hook on
    the plain model that edits that one cell's code."""
    loaded, pixels, sites, metric = swin
    _, states = attribution(loaded, pixels, sites, metric)
    h = 1e-2
    for site, state in zip(sites, states):
        for flat in torch.argsort(state.concept_effects.abs().flatten(), descending=True)[:3].tolist():
            row, concept = divmod(flat, state.codes.shape[-1])

            def moved(step, site=site, state=state, row=row, concept=concept):
                def edit(index, tokens):
                    if index != site.block:
                        return tokens
                    rows = site.rows(tokens)
                    codes = site.dictionary.encode(rows)
                    changed = codes.clone()
                    changed[0, row, concept] += step * codes[0, row, concept]   # the zero baseline: z - z₀ = z
                    return tokens + site.write @ (site.dictionary.decode(changed, rows) -
                                                  site.dictionary.decode(codes, rows))
                with torch.inference_mode():
                    return float(metric(loaded.model.trace(pixels, attention=False, edit=edit).logits)[0])
            expected = (moved(h) - moved(-h)) / (2 * h)
            assert float(state.concept_effects[row, concept]) == pytest.approx(expected, rel=2e-2, abs=1e-5)


@pytest.mark.parametrize("method", ["atp", "ig"])
def test_a_concepts_effects_per_cell_add_up_to_its_whole_effect(swin, method):
    loaded, pixels, sites, metric = swin
    _, states = attribution(loaded, pixels, sites, metric)
    if method == "ig":
        integrated_gradients(loaded, pixels, sites, states, metric, steps=8)
    per_cell, codes = cell_hosts(states)
    whole = read_states(states, [state.effects for state in states])
    for h, c, w, site in zip(per_cell, codes, whole, sites):
        summed = concept_host(h, c, site.dictionary.n_concepts)
        np.testing.assert_allclose(summed.effects, w.effects, rtol=1e-6, atol=1e-9)
        assert summed.error_effect == pytest.approx(w.error_effect, rel=1e-6, abs=1e-9)
        np.testing.assert_allclose(summed.error_map, w.error_map, rtol=1e-6, atol=1e-9)


def test_faithfulness_per_position_is_the_papers_with_each_cell_edited(swin):
    """m(∅) is the whole circuit's (every code and error of every cell at zero); m(C) keeps exactly the graph's
    nodes, each a concept or an error at one cell; completeness keeps everything else; the circuit is the smallest
    prefix reaching the target."""
    loaded, pixels, sites, metric = swin
    graph = position_circuit(loaded, pixels, sites, metric, faithful=0.6)
    whole = circuit(loaded, pixels, sites, metric)
    f = graph.faithfulness
    assert f["empty"] == pytest.approx(whole.faithfulness["empty"], abs=1e-6)
    shapes = [(site.read.shape[0], site.dictionary.n_concepts + 1) for site in sites]
    nothing = [np.zeros(shape, dtype=bool) for shape in shapes]
    assert f["empty"] == pytest.approx(edited_metric(loaded, pixels, metric, sites, nothing), abs=1e-5)
    kept = [np.zeros(shape, dtype=bool) for shape in shapes]
    at = {site.block: s for s, site in enumerate(sites)}
    drawn = [n for n in graph.nodes if n.kind in ("concept", "error")]
    for node in drawn:
        n = shapes[at[node.block]][1] - 1
        kept[at[node.block]][node.position, n if node.concept is None else node.concept] = True
    assert len(drawn) == f["nodes"] and f["concept_nodes"] == sum(n.kind == "concept" for n in drawn)
    assert f["circuit"] == pytest.approx(edited_metric(loaded, pixels, metric, sites, kept), abs=1e-5)
    assert f["without_circuit"] == pytest.approx(edited_metric(loaded, pixels, metric, sites, [~k for k in kept]),
                                                 abs=1e-5)
    assert f["value"] >= 0.6 and f["curve"][f["nodes"] - 1]["faithfulness"] < 0.6
    assert f["curve"][-1]["faithfulness"] == pytest.approx(1, abs=1e-4)


def test_edges_per_position_add_up_to_the_whole_concepts_edges_and_stay_on_their_cell_without_mixing():
    """Summed over every source cell and every target cell, the edges per position are the whole concepts' edges;
    in a network that mixes no tokens an edge from one cell to another is 0."""
    model = TwoLinearBlocks()
    loaded = SimpleNamespace(model=model, name="toy", labels=["a", "b", "c"], device=torch.device("cpu"))
    sites = [identity_site(0, standard(6, 10, 1)), identity_site(1, standard(6, 10, 2))]
    pixels = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    _, states = attribution(loaded, pixels, sites, Metric(1))
    n = 10
    cells_c, cells_e = edges_between(loaded, pixels, (sites[0], states[0]), (sites[1], states[1]),
                                     list(range(16 * (n + 1))), cells=True)
    whole_c, whole_e = edges_between(loaded, pixels, (sites[0], states[0]), (sites[1], states[1]),
                                     [*range(n), None])
    by_target_c = cells_c.reshape(16, n + 1, 16, n).sum((0, 2))   # target cell, target node, source cell, source
    by_target_e = cells_e.reshape(16, n + 1, 16).sum((0, 2))
    torch.testing.assert_close(by_target_c, whole_c, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(by_target_e, whole_e, rtol=1e-5, atol=1e-7)
    across = cells_c.reshape(16, n + 1, 16, n).abs().sum((1, 3))   # target cell x source cell
    assert float(across.diagonal().sum()) > 0
    assert float((across - torch.diag(across.diagonal())).abs().max()) < 1e-7


def test_nodes_say_their_cell_and_the_graph_is_plain_data():
    loaded, pixels, sites = tiny_sites(tiny("vit"), blocks=[1, -1])   # the class token read at both sites
    graph = position_circuit(loaded, pixels, sites, Metric(2), nodes=6)
    data = graph.to_json()
    cells = [n for n in data["nodes"] if n["kind"] in ("concept", "error")]
    assert len(cells) == 6 and all("position" in n and " @ " in n["name"] for n in cells)
    place = SimpleNamespace(block=3, grid=(4, 4), class_token=True)
    assert position_id(place, 613, 1 + 2 * 4 + 3) == "b3/c613@2,3" and position_id(place, None, 0) == "b3/error@cls"
    ids = {n["id"] for n in data["nodes"]}
    assert all(e["source"] in ids and e["target"] in ids for e in data["edges"])
    assert any("Nodes per position" in note for note in data["notes"])


def test_a_photo_circuits_concept_node_carries_its_effect_at_each_cell_kept_in_its_adjacency_file(tmp_path):
    """A node's effect per cell is its attribution term at each row, the class token's share apart; they sum to
    its effect, and the adjacency file keeps them (pruned again, the nodes have the same maps)."""
    from vitviz.circuits import load_adjacency, resized, save_adjacency

    loaded, pixels, sites = tiny_sites(tiny("vit"), blocks=[1, -1])   # the class token read at both sites
    graph = circuit(loaded, pixels, sites, Metric(2), nodes=8, most=2)
    _, states = attribution(loaded, pixels, sites, Metric(2))
    at = {site.block: s for s, site in enumerate(sites)}
    concepts = [n for n in graph.nodes if n.kind == "concept"]
    assert concepts
    for node in concepts:
        expected = states[at[node.block]].concept_effects[:, node.concept]
        np.testing.assert_allclose(node.effect_map, expected[1:].numpy(), rtol=1e-5, atol=1e-7)
        assert sum(node.effect_map) + float(expected[0]) == pytest.approx(node.effect, rel=1e-5, abs=1e-7)
    for node in (n for n in graph.nodes if n.kind == "group"):
        assert len(node.effect_map) == node.grid[0] * node.grid[1]
    again = resized(load_adjacency(save_adjacency(graph.adjacency, tmp_path / "a.safetensors")), nodes=8)
    for a, b in zip(again.nodes, graph.nodes, strict=True):
        assert a.id == b.id and (a.effect_map is None) == (b.effect_map is None)
        if a.effect_map is not None:
            np.testing.assert_allclose(a.effect_map, b.effect_map, rtol=1e-9)


def test_the_circuit_of_one_place_takes_out_only_the_nodes_there_and_keeps_everything_elsewhere(swin):
    """`place`: at each site the row under one point. Only nodes there are ranked; m(∅) sets them (and nothing
    else) to zero, m(C) keeps the circuit's and everything elsewhere, both recomputed cell by cell."""
    loaded, pixels, sites, metric = swin
    place = [1 + 2 * site.grid[1] + 3 if site.class_token else (2 * site.grid[0] // 8) * site.grid[1]
             + 3 * site.grid[1] // 8 for site in sites]   # near the same place on each grid
    graph = position_circuit(loaded, pixels, sites, metric, place=place, faithful=0.6)
    f = graph.faithfulness
    drawn = [n for n in graph.nodes if n.kind in ("concept", "error")]
    at = {site.block: s for s, site in enumerate(sites)}
    assert drawn and all(n.position == place[at[n.block]] for n in drawn)
    shapes = [(site.read.shape[0], site.dictionary.n_concepts + 1) for site in sites]
    elsewhere = []
    for (rows, width), row in zip(shapes, place):
        keep = np.ones((rows, width), dtype=bool)
        keep[row] = False
        elsewhere.append(keep)
    assert f["empty"] == pytest.approx(edited_metric(loaded, pixels, metric, sites, elsewhere), abs=1e-5)
    kept = [k.copy() for k in elsewhere]
    for node in drawn:
        kept[at[node.block]][node.position, shapes[at[node.block]][1] - 1 if node.concept is None
                             else node.concept] = True
    assert f["circuit"] == pytest.approx(edited_metric(loaded, pixels, metric, sites, kept), abs=1e-5)
    if f["value"] is None:   # one cell of a random model may not move the answer against the logits' spread
        assert any("F is undefined here" in note for note in graph.notes)
    else:
        assert f["curve"][-1]["faithfulness"] == pytest.approx(1, abs=1e-4)
    assert any("The circuit of one place" in note for note in graph.notes)
