"""A photo's circuit kept whole (`vitviz.circuits.adjacency`): pruned again on the host at any size or faithfulness it
is the circuit `circuit` computes for that size directly, with a model pass; F at every size is the model with that
prefix of the ranking kept, recomputed here by a forward that edits the sites itself; the file reads back the same
and refuses, in words, one that is not one, damaged, newer or unsound."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_tensors

from test_circuits import kept_metric, toy  # noqa: F401  (a fixture)
from tiny_models import tiny, tiny_sites
from vitviz.circuits import Metric, circuit
from vitviz.circuits.adjacency import HEADER_KEY, load_adjacency, resized, save_adjacency
from vitviz.concepts import ConceptsError
from vitviz.concepts.files.own import checksum

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MEASURED_HERE = ("completeness", "without_circuit", "errors_kept")   # measured at the circuit's own size only


@pytest.fixture(scope="module")
def vit():
    """The tiny ViT with three sites, its circuit of class 2 kept with every size."""
    loaded, pixels, sites = tiny_sites(tiny("vit"), blocks=[0, 1, -1])
    graph = circuit(loaded, pixels, sites, Metric(2), faithful=0.5, most=2, every=True)
    return loaded, pixels, sites, graph


def close(a, b, path="") -> None:
    """Two graphs' plain data equal: the same keys, strings and sizes, floats to 1e-6 (the passes batch the prefixes
    and targets differently)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), path
    else:
        assert a == b, path


def comparable(graph) -> dict:
    """A graph's data without what is measured at the size it was computed for alone."""
    data = graph.to_json()
    data["faithfulness"] = {k: v for k, v in data["faithfulness"].items() if k not in MEASURED_HERE}
    data["faithfulness"]["errors_kept"] = {k: v for k, v in graph.to_json()["faithfulness"]["errors_kept"].items()
                                           if k in ("empty", "ablation")}
    data["notes"] = [note for note in data["notes"] if not note.startswith("Pruned again on the host")]
    return data


def test_pruned_again_on_the_host_a_circuit_is_the_one_circuit_computes_for_that_size_or_faithfulness(vit):
    loaded, pixels, sites, graph = vit
    adjacency = graph.adjacency
    assert resized(adjacency).to_json() == graph.to_json()   # its own size: everything, completeness included
    n = graph.faithfulness["ranked_nodes"]
    own = graph.faithfulness["nodes"]
    assert adjacency.held == n == adjacency.prefixes.exact and n > 12
    for k in sorted({0, 1, 3, own - 1, own + 2, n // 2, n}):
        direct = circuit(loaded, pixels, sites, Metric(2), faithful=0.5, most=2, every=True, nodes=k)
        again = resized(adjacency, nodes=k)
        close(comparable(again), comparable(direct), f"{k} nodes")
        assert again.faithfulness["nodes"] == k and again.faithfulness["completeness"] is None
        per_site = np.bincount([s for s, c in adjacency.ranked[:k].tolist() if c >= 0], minlength=len(sites))
        assert any(node.kind == "group" for node in again.nodes) == bool((per_site > 2).any())   # 2 drawn a site
    for faithful in (0.3, 0.8, 1.0):
        direct = circuit(loaded, pixels, sites, Metric(2), faithful=faithful, most=2, every=True)
        close(comparable(resized(adjacency, faithful=faithful)), comparable(direct), f"F {faithful}")


def prefix_kept(loaded, pixels, metric, sites, first: list) -> float:
    """m with the ranked nodes `first` ((site, concept or -1 for the error) each) kept, every other at zero."""
    concepts, errors = [set() for _ in sites], [False] * len(sites)
    for s, c in first:
        if c < 0:
            errors[s] = True
        else:
            concepts[s].add(c)
    return kept_metric(loaded, pixels, metric, sites, concepts, errors)


def test_f_at_every_size_is_the_model_with_that_prefix_of_the_ranking_kept(toy, vit):  # noqa: F811
    """m(k) recomputed by a forward that rebuilds each site's rows from its dictionary with the first k ranked nodes
    kept (`kept_metric`, not `effects.ablated`), m(∅) with none, m(M) with all: F(k) at every k from 0 to every node."""
    loaded_toy, sites_toy, pixels_toy = toy
    cases = [(loaded_toy, pixels_toy, sites_toy, Metric(1)), (*vit[:3], Metric(2))]
    for loaded, pixels, sites, metric in cases:
        graph = circuit(loaded, pixels, sites, metric, faithful=0.5, every=True)
        adjacency = graph.adjacency
        ranked = adjacency.ranked.tolist()

        def m(k: int, case=(loaded, pixels, metric, sites), ranked=ranked) -> float:
            return prefix_kept(*case, ranked[:k])
        empty, full = m(0), m(len(ranked))
        assert full == pytest.approx(graph.value, abs=1e-5)
        curve = graph.faithfulness["curve"]
        assert [point["nodes"] for point in curve] == list(range(len(ranked) + 1))
        for k, point in enumerate(curve):
            assert point["faithfulness"] == pytest.approx((m(k) - empty) / (full - empty), abs=1e-4), k
            again = resized(adjacency, nodes=k).faithfulness
            assert (again["empty"], again["full"]) == pytest.approx((empty, full), abs=1e-5)
            assert again["circuit"] == pytest.approx(m(k), abs=1e-5)


def test_a_circuit_keeps_every_size_up_to_twice_its_own_and_refuses_beyond_in_words(vit):
    loaded, pixels, sites, _ = vit
    graph = circuit(loaded, pixels, sites, Metric(2), faithful=0.5, most=2, nodes=3)
    adjacency = graph.adjacency
    n = graph.faithfulness["ranked_nodes"]
    assert adjacency.held == adjacency.prefixes.exact == min(n, 64)   # at least 64 nodes, twice 3 being fewer
    counts = [point["nodes"] for point in graph.faithfulness["curve"]]
    assert counts[:adjacency.held + 1] == list(range(adjacency.held + 1))
    rows = [len(edges) for edges in adjacency.edges]   # the held concepts of each downstream site, its error, unread
    assert rows == [len(adjacency.held_concepts(s)) + 2 for s in (1, 2)]
    if adjacency.held < n:
        with pytest.raises(ConceptsError, match=f"every size up to {adjacency.held} nodes"):
            resized(adjacency, nodes=adjacency.held + 1)
    with pytest.raises(ConceptsError, match=f"A circuit of {n + 1} nodes cannot be drawn"):
        resized(adjacency, nodes=n + 1)


def test_the_adjacency_file_reads_back_the_same_circuit_at_every_size(vit, tmp_path):
    graph = vit[3]
    path = save_adjacency(graph.adjacency, tmp_path / "circuit.adjacency.safetensors")
    read = load_adjacency(path)
    assert read.held == graph.adjacency.held and np.array_equal(read.ranked, graph.adjacency.ranked)
    for k in range(0, graph.faithfulness["ranked_nodes"] + 1, 5):
        assert resized(read, nodes=k).to_json() == resized(graph.adjacency, nodes=k).to_json()
    assert resized(read).to_json() == graph.to_json()
    assert b"pickle" not in path.read_bytes()[:200] and path.read_bytes()[8:9] == b"{"   # a safetensors header


def rewritten(path, tmp_path, change) -> object:
    """The file with its tensors and header changed by `change(tensors, meta)`, its checksum made to fit."""
    from safetensors.torch import load

    raw = path.read_bytes()
    tensors = load(raw)
    meta = json.loads(json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])["__metadata__"][HEADER_KEY])
    change(tensors, meta)
    meta["sha256"] = checksum(tensors)
    out = tmp_path / f"{change.__name__}.safetensors"
    out.write_bytes(save_tensors(tensors, {HEADER_KEY: json.dumps(meta)}))
    return out


def test_a_wrong_or_damaged_adjacency_file_is_refused_in_words(vit, tmp_path):
    path = save_adjacency(vit[3].adjacency, tmp_path / "circuit.adjacency.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    other = tmp_path / "other.safetensors"
    other.write_bytes(save_tensors({"weights": torch.zeros(3)}))
    damaged = tmp_path / "damaged.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF   # a flipped byte in the last tensor's data
    damaged.write_bytes(bytes(raw))

    def newer(tensors, meta):
        meta["version"] = 99

    def edges_cut(tensors, meta):
        tensors["pair0.edges"] = tensors["pair0.edges"][:-1].contiguous()

    def unranked(tensors, meta):
        tensors["ranked"] = tensors["ranked"].flip(0).contiguous()

    def missing(tensors, meta):
        del tensors["site1.maps"]

    cases = [(junk, "cannot be read as a vitviz circuit adjacency"), (other, "not a vitviz circuit adjacency"),
             (damaged, "is damaged: its tensors are not the ones it was written with"),
             (rewritten(path, tmp_path, newer), "written by a newer vitviz"),
             (tmp_path / "absent.safetensors", "cannot be read as a vitviz circuit adjacency")]
    for change, words in ((edges_cut, "the edges into site 1 do not fit"),
                          (unranked, "its ranking is not each node above the floor once, strongest first"),
                          (missing, "it has no site1.maps")):
        cases.append((rewritten(path, tmp_path, change), words))
    for bad, words in cases:
        with pytest.raises(ConceptsError, match=words):
            load_adjacency(bad)
