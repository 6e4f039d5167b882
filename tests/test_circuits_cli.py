"""`vitviz circuits`: each model's circuit of one photo as the graph's JSON and its picture, the settings passed on
to `circuits.photo_circuit` (the library's own graph, computed here, is the reference), the dictionaries each model
reads, and every bad input refused in words with nothing written."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitviz
from vitviz import catalog, cli
from vitviz.circuits import load_adjacency, photo_circuit, resized
from vitviz.circuits.neuronpedia import neuronpedia_graph
from vitviz.circuits.pair import default_sources, sources_for
from vitviz.concepts import ConceptsError
from vitviz.render.circuits import graph_layout
from vitviz.session import ModelRun

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
# two depths of the ViT (given last-first: the command orders them), the CvT's last block: small enough to be quick
DICTIONARIES = ("vit-cifar10-last", "vit-cifar10-middle", "cvt-cifar10-last")


def run(*args: str) -> int:
    return cli.main(["circuits", *args])


@pytest.mark.slow
def test_the_command_writes_each_models_graph_and_picture_for_the_class_asked(tmp_path, capsys):
    out = tmp_path / "circuits"
    assert run(str(PHOTO), "--models", *PAIR, "--dictionaries", *DICTIONARIES, "--class", "dog", "--faithfulness",
               "0.7", "--format", "neuronpedia", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"circuit-{m}.{ext}" for m in PAIR
                             for ext in ("json", "png", "neuronpedia.json", "adjacency.safetensors"))
    image = Image.open(PHOTO).convert("RGB")
    for name, sources in zip(PAIR, (["vit-cifar10-middle", "vit-cifar10-last"], ["cvt-cifar10-last"])):
        graph = json.loads((out / f"circuit-{name}.json").read_text())
        loaded = vitviz.load(name)
        reference = photo_circuit(loaded, image, dictionaries=sources, target=loaded.labels.index("dog"), faithful=0.7)
        assert graph == json.loads(json.dumps(reference.to_json()))   # the JSON round trip: tuples become lists
        adjacency = load_adjacency(out / f"circuit-{name}.adjacency.safetensors")   # pruned again: the same graph
        assert json.loads(json.dumps(resized(adjacency).to_json())) == graph
        held = adjacency.held
        assert held == min(max(64, 2 * graph["faithfulness"]["nodes"]), graph["faithfulness"]["ranked_nodes"])
        assert f"every size up to {held} nodes" in printed
        assert graph["target_label"] == "dog" and [s["dictionary"] for s in graph["sites"]] == sources
        viewer = json.loads((out / f"circuit-{name}.neuronpedia.json").read_text())
        explained = ModelRun(loaded, image)
        assert viewer == json.loads(json.dumps(neuronpedia_graph(
            graph, depth=len(explained.trace.blocks), prompt=PHOTO.name, dictionaries=sources,
            probability=float(explained.trace.logits[0].softmax(-1)[graph["target"]]))))
        picture = np.asarray(Image.open(out / f"circuit-{name}.png"))
        assert picture.shape == (*graph_layout(graph).size, 3) and picture.std() > 10
        f = graph["faithfulness"]
        assert f"{name}: the logit of dog" in printed and f"F = {f['value']:.3f}" in printed
        strongest = max((n for n in graph["nodes"] if n["kind"] == "concept"), key=lambda n: abs(n["effect"]))
        assert strongest["name"] in printed


def test_every_size_keeps_the_whole_ranking_in_the_file_beside_the_graph(tmp_path, capsys):
    out = tmp_path / "circuits"
    assert run(str(PHOTO), "--models", "vit-cifar10", "--dictionaries", "vit-cifar10-middle", "vit-cifar10-last",
               "--every-size", "--out", str(out)) == 0
    graph = json.loads((out / "circuit-vit-cifar10.json").read_text())
    adjacency = load_adjacency(out / "circuit-vit-cifar10.adjacency.safetensors")
    ranked = graph["faithfulness"]["ranked_nodes"]
    assert adjacency.held == adjacency.prefixes.exact == ranked and len(graph["faithfulness"]["curve"]) == ranked + 1
    assert f"every size up to {ranked} nodes" in capsys.readouterr().out
    assert [e.shape[0] for e in adjacency.edges] == [len(adjacency.held_concepts(1)) + 2]


def test_positions_write_the_graph_per_position_and_the_viewers_file_puts_each_cell_in_ctx_idx(tmp_path, capsys):
    out = tmp_path / "circuits"
    sources = ["vit-cifar10-middle", "vit-cifar10-last"]
    assert run(str(PHOTO), "--models", "vit-cifar10", "--dictionaries", *sources, "--positions", "--format",
               "neuronpedia", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["circuit-vit-cifar10.json", "circuit-vit-cifar10.neuronpedia.json"]
    graph = json.loads((out / "circuit-vit-cifar10.json").read_text())
    loaded, image = vitviz.load("vit-cifar10"), Image.open(PHOTO).convert("RGB")
    assert graph == json.loads(json.dumps(photo_circuit(loaded, image, dictionaries=sources, positions=True).to_json()))
    cells = [n for n in graph["nodes"] if n["kind"] in ("concept", "error")]
    assert len(cells) == graph["faithfulness"]["nodes"] and all(" @ " in n["name"] for n in cells)
    strongest = max((n for n in cells if n["kind"] == "concept"), key=lambda n: abs(n["effect"]))
    assert strongest["name"] in printed and "kept to prune again" not in printed
    viewer = json.loads((out / "circuit-vit-cifar10.neuronpedia.json").read_text())
    tokens = viewer["metadata"]["prompt_tokens"]
    assert tokens[:2] == ["<cls>", "(0, 0)"] and len(tokens) == 1 + 8 * 8   # the ViT's class token and 8 x 8 grid
    by_id = {n["node_id"]: n for n in viewer["nodes"]}
    for node in cells:
        entry = by_id[f"{node['block']}_{node.get('concept', -1)}_{node['position']}"]
        assert entry["ctx_idx"] == node["position"] and tokens[entry["ctx_idx"]] in node["name"] + "<cls>"
    assert len(by_id) == len(viewer["nodes"])   # one viewer node a cell


def test_by_default_a_dictionary_across_exactly_the_models_asked_for_takes_the_place_of_each_ones_own():
    models = [vitviz.load(name) for name in catalog.CIRCUIT_DICTIONARIES]   # the four bundled models
    assert "across-cifar10" in default_sources([m.name for m in models])
    for model, sources in zip(models, sources_for(models)):
        own = [s for s in catalog.CIRCUIT_DICTIONARIES[model.name] if s in default_sources([model.name])]
        assert sources == [*own[:-1], "across-cifar10"], model.name   # in place of the last block's own
    assert "across-cifar10" not in default_sources(list(PAIR))       # it is across four models, not this pair
    with pytest.raises(ConceptsError, match=r"both read block 7 \(index 6\) of vit-cifar10"):
        sources_for(models[:2], ["across-cifar10", "vit-cifar10-last", "cvt-cifar10-last"])
    with pytest.raises(ConceptsError, match="vitviz has no default dictionaries for vit-base: name them"):
        default_sources(["vit-cifar10", "vit-base"])
    with pytest.raises(ConceptsError, match="cvt-cifar10@391: a checkpoint along its training, whose blocks compute"):
        default_sources(["vit-cifar10", "cvt-cifar10@391"])


@pytest.mark.parametrize("args, words", [
    (["--models", "vit-cifar10", "--dictionaries", "cvt-cifar10-last"],
     "cvt-cifar10-last was trained on cvt-cifar10, which is none of the models asked for (vit-cifar10)"),
    (["--dictionaries", *DICTIONARIES, "--class", "zebra"], "--class 'zebra' is not a class of vit-cifar10"),
    (["--dictionaries", *DICTIONARIES, "--contrast", "cat", "--class", "cat"], "--contrast 'cat' is the class itself"),
    (["--dictionaries", *DICTIONARIES, "--faithfulness", "1.5"], "--faithfulness is from 0"),
    (["--dictionaries", *DICTIONARIES, "--positions", "--every-size"], "--positions draws the photo's circuit per "
                                                                        "position at its own size"),
], ids=["a dictionary of another model", "a class outside the labels", "the contrast is the class",
       "a faithfulness above 1", "every size of a circuit per position"])
def test_a_bad_input_is_refused_in_words_and_nothing_is_written(tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert run(str(PHOTO), *args, "--out", str(out)) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_a_missing_photo_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(vitviz.hub, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "out"
    assert run(str(tmp_path / "no-such.jpg"), "--out", str(out)) == 2
    assert "no-such.jpg does not exist" in capsys.readouterr().err and not out.exists()



@pytest.mark.slow
def test_the_faithfulness_curve_over_a_data_set_is_written_beside_the_graphs(tmp_path, capsys, cifar10_path):
    """`--data`: each model's mean curve over the images asked (the library's `data_faithfulness`), in
    faithfulness-<model>.json, printed; a bad --limit refused first."""
    from vitviz.circuits import data_faithfulness
    from vitviz.data import open_data, spread

    out = tmp_path / "out"
    assert run(str(PHOTO), "--models", "vit-cifar10", "--dictionaries", "vit-cifar10-middle", "vit-cifar10-last",
               "--data", str(cifar10_path), "--limit", "2", "--out", str(out)) == 0
    curve = json.loads((out / "faithfulness-vit-cifar10.json").read_text())
    data = open_data(cifar10_path, split="test")
    expected = data_faithfulness(vitviz.load("vit-cifar10"), data, indices=spread(len(data), 2),
                                 dictionaries=["vit-cifar10-middle", "vit-cifar10-last"], progress=False)
    assert curve == json.loads(json.dumps(expected))
    assert "vit-cifar10 over 2 images" in capsys.readouterr().out
    assert run(str(PHOTO), "--models", "vit-cifar10", "--data", str(cifar10_path), "--limit", "0",
               "--out", str(tmp_path / "none")) == 2
    assert not (tmp_path / "none").exists()


# ---- a class over a data set ----------------------------------------------------------------------------------

def class_run(args: list[str], *, torchrun: bool = False) -> subprocess.CompletedProcess:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
                if torchrun else [sys.executable])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([*launcher, "-m", "vitviz", *args], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_class_circuit_is_the_same_from_one_process_or_two_torchrun_ranks(tmp_path, cifar10_path):
    """`vitviz circuits --data --class` without a photo: the class's images split over two gloo ranks, every sum
    all-reduced, give the one-process graph (the floats' order apart: 1e-4) and the same words."""
    args = ["circuits", "--models", "vit-cifar10", "--dictionaries", "vit-cifar10-middle", "vit-cifar10-last",
            "--data", str(cifar10_path), "--class", "cat", "--limit", "6"]
    one = class_run([*args, "--out", str(tmp_path / "one")])
    class_run([*args, "--out", str(tmp_path / "two")], torchrun=True)
    graphs = [json.loads((tmp_path / run / "class-circuit-vit-cifar10-cat.json").read_text()) for run in ("one", "two")]
    assert [n["id"] for n in graphs[0]["nodes"]] == [n["id"] for n in graphs[1]["nodes"]]
    for a, b in zip(*(g["nodes"] for g in graphs)):
        assert (a.get("effect") or 0) == pytest.approx(b.get("effect") or 0, abs=1e-4)
    f = graphs[0]["faithfulness"]
    assert f["images"] == 6 and f["value"] == pytest.approx(graphs[1]["faithfulness"]["value"], abs=1e-4)
    assert "over 6 images" in one.stdout and "95% interval" in one.stdout
