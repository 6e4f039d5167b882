"""A photo's concepts (`concepts.photo`), the export of them (`explain --concepts`) and the concept commands that
read a trained dictionary: `concepts exemplars`, `evaluate` and `match`."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vitviz import concepts, hub
from vitviz.cli import main
from vitviz.concepts import ConceptsError
from vitviz.concepts.analysis.photo import ACROSS_REMOVAL, readers, shared_concepts
from vitviz.concepts.analysis.splice import concept_effects
from vitviz.concepts.files.across import save_across
from vitviz.concepts.train.across import train_across
from vitviz.session import ModelRun

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def photos(n: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


def tokens_of(loaded, images, block: int, kind: str) -> torch.Tensor:
    from vitviz.concepts.activations.cache import block_tokens

    with torch.inference_mode():
        trace = loaded.model.trace(torch.cat([loaded.preprocess(i) for i in images]), attention=False)
    return block_tokens(trace, block, kind)


@pytest.fixture(scope="module")
def models():
    return hub.load("vit-cifar10"), hub.load("cvt-cifar10")


@pytest.fixture(scope="module")
def folders(models, tmp_path_factory):
    """Small dictionaries trained here: the ViT's last block with its class token, the CvT's last block's patches,
    and one across both on their shared 4 x 4 cells."""
    vit, cvt = models
    root = tmp_path_factory.mktemp("dictionaries")
    images = photos(24, seed=1)
    settings = dict(kind="topk", k=4, expansion=2, batch_size=256, warmup=2, progress=False)
    vit_dictionary = concepts.train(tokens_of(vit, images, 6, "patch+cls"), model="vit-cifar10", block=6,
                                    tokens="patch+cls", **settings)
    cvt_dictionary = concepts.train(tokens_of(cvt, images, 8, "patch"), model="cvt-cifar10", block=8,
                                    tokens="patch", **settings)
    concepts.save(vit_dictionary, root / "vit")
    concepts.save(cvt_dictionary, root / "cvt")
    vit_cells = F.avg_pool2d(tokens_of(vit, images, 6, "patch").reshape(-1, 8, 8, 192).permute(0, 3, 1, 2), 2)
    cvt_cells = tokens_of(cvt, images, 8, "patch").reshape(-1, 192)
    across = train_across([vit_cells.permute(0, 2, 3, 1).reshape(-1, 192), cvt_cells],
                          models=["vit-cifar10", "cvt-cifar10"], blocks=[6, 8], tokens=["patch", "patch"], **settings)
    across.training_record = {**across.training_record, "cells": [4, 4]}
    save_across(across, root / "across")
    return root


def test_a_photos_codes_are_the_dictionarys_codes_of_its_tokens(models, folders):
    vit, cvt = models
    photo = photos(1, seed=5)[0]
    runs = [ModelRun(m, photo) for m in models]
    bound = readers(models, [str(folders / "vit"), str(folders / "cvt")])
    readings = [reader.read(run, remove=False) for reader, run in zip(bound, runs)]
    for reading, run, reader in zip(readings, runs, bound):
        grid = run.trace.blocks[reader.block].tokens[0, 1:]   # a patch+cls dictionary's map is over its grid
        expected = reader.dictionary.encode(grid).detach().numpy()
        np.testing.assert_allclose(reading.codes, expected, atol=1e-6)
        means = expected.mean(0)
        assert reading.top.tolist() == [c for c in np.argsort(-means, kind="stable") if means[c] > 0][:8]
        np.testing.assert_allclose(reading.activation, means[reading.top], rtol=1e-6)
        np.testing.assert_array_equal(reading.concept_map(int(reading.top[0])),
                                      expected[:, reading.top[0]].reshape(reading.grid))
        cell = int(np.argmax(expected[:, reading.top[0]]))
        assert reading.at(cell)[0][1] == pytest.approx(float(expected[cell].max()))
    assert readings[0].grid == (8, 8) and readings[1].grid == (4, 4)


def test_removing_a_concept_moves_the_prediction_as_splice_says(models, folders):
    vit, _ = models
    run = ModelRun(vit, photos(1, seed=6)[0])
    (reader,) = readers([vit], [str(folders / "vit")])
    reading = reader.read(run)
    assert reading.no_removal is None and len(reading.top)
    class_codes = reader.dictionary.encode(run.trace.blocks[6].tokens[0, 0]).detach().numpy()
    np.testing.assert_allclose(reading.class_codes, class_codes, atol=1e-6)
    assert reading.class_top[0] == int(np.argmax(class_codes))
    assert reading.removed.tolist() == list(dict.fromkeys([*reading.top.tolist(), *reading.class_top.tolist()]))
    effects = concept_effects(vit, run.trace, reader.dictionary, concepts=reading.removed.tolist(), block=6,
                              tokens="patch+cls")
    np.testing.assert_allclose(reading.without, effects.probabilities.numpy())
    assert reading.target == int(run.probs.argmax()) and reading.probability == pytest.approx(float(run.probs.max()))
    moved = reading.without != reading.probability
    assert moved[np.isin(reading.removed, reading.class_top)].all()   # what the class token holds decides
    assert not moved[~np.isin(reading.removed, reading.class_top)].any()   # the grid alone: the head never reads it


def test_one_dictionary_across_both_reads_the_shared_cells_and_says_why_nothing_is_removed(models, folders):
    vit, cvt = models
    photo = photos(1, seed=7)[0]
    runs = [ModelRun(m, photo) for m in models]
    bound = readers(models, [str(folders / "across")])
    assert [b.cells for b in bound] == [(4, 4), (4, 4)]
    a, b = (reader.read(run) for reader, run in zip(bound, runs))
    grid = runs[0].trace.blocks[6].tokens[0, 1:].reshape(8, 8, 192).permute(2, 0, 1)[None]
    cells = F.avg_pool2d(grid, 2)[0].permute(1, 2, 0).reshape(16, 192)
    np.testing.assert_allclose(a.codes, bound[0].dictionary.encode(cells).detach().numpy(), atol=1e-5)
    assert a.no_removal == ACROSS_REMOVAL and a.without is None
    both, only_a, only_b = shared_concepts(a, b)
    fires_a, fires_b = (a.codes > 0).any(0), (b.codes > 0).any(0)
    assert all(fires_a[c] and fires_b[c] for c in both)
    assert all(fires_a[c] and not fires_b[c] for c in only_a) and all(fires_b[c] and not fires_a[c] for c in only_b)
    assert set(both) | set(only_a) | set(only_b) == set(a.top.tolist()) | set(b.top.tolist())


def test_a_dictionary_for_none_of_the_models_is_refused_in_words(models, folders):
    vit, _ = models
    with pytest.raises(ConceptsError, match="trained on cvt-cifar10, which is none of the models asked for"):
        readers([vit], [str(folders / "cvt")])
    assert readers(list(models), [str(folders / "cvt")])[0] is None


def test_explain_writes_each_photos_codes_and_top_concepts(models, folders, tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    photo = photos(1, seed=8)[0]
    photo.save(folder / "noise.png")
    out = tmp_path / "out"
    assert main(["explain", str(folder), "--models", "vit-cifar10", "cvt-cifar10", "--formats", "npy",
                 "--faithfulness-steps", "0", "--concepts", str(folders / "vit"), str(folders / "cvt"),
                 "--out", str(out)]) == 0
    entry = json.loads((out / "manifest.json").read_text())["images"][0]["models"][1]
    codes = np.load(out / "noise" / "cvt-cifar10" / "concepts.npy")
    (reader,) = readers([models[1]], [str(folders / "cvt")])
    expected = reader.read(ModelRun(models[1], Image.open(folder / "noise.png").convert("RGB")), remove=False)
    np.testing.assert_allclose(codes, expected.codes, atol=1e-6)
    assert entry["concepts"]["grid"] == [4, 4] and entry["concepts"]["file"] == "concepts.npy"
    assert [t["concept"] for t in entry["concepts"]["top"]] == expected.top.tolist()
    assert main(["explain", str(folder), "--models", "vit-cifar10", "--concepts", str(folders / "cvt"),
                 "--out", str(tmp_path / "refused")]) == 2
    # --resume: a photo is complete only if it holds the codes of the dictionaries asked for now
    plain = ["explain", str(folder), "--models", "cvt-cifar10", "--formats", "npy", "--faithfulness-steps", "0",
             "--out", str(tmp_path / "later"), "--resume"]
    assert main(plain) == 0
    capsys.readouterr()
    assert main([*plain, "--concepts", str(folders / "cvt")]) == 0
    assert "0 image(s) already complete, 1 to do" in capsys.readouterr().err
    assert (tmp_path / "later" / "noise" / "cvt-cifar10" / "concepts.npy").is_file()
    assert main([*plain, "--concepts", str(folders / "cvt")]) == 0
    assert "1 image(s) already complete, 0 to do" in capsys.readouterr().err


def test_the_concept_commands_index_evaluate_and_match(models, folders, tmp_path, capsys):
    images = photos(12, seed=9)
    data_folder = tmp_path / "photos"
    data_folder.mkdir()
    for i, image in enumerate(images):
        image.save(data_folder / f"{i:02d}.png")
    cache = str(tmp_path / "cache")
    assert main(["concepts", "exemplars", str(folders / "across"), "--data", str(data_folder), "--top", "3",
                 "--cache", cache]) == 0
    assert sorted(p.name for p in (folders / "across").glob("exemplars-*")) == \
        ["exemplars-0-vit-cifar10.safetensors", "exemplars-1-cvt-cifar10.safetensors"]

    assert main(["concepts", "evaluate", str(folders / "vit"), "--data", str(data_folder), "--cache", cache,
                 "--out", str(tmp_path / "vit.json")]) == 0
    report = json.loads((tmp_path / "vit.json").read_text())
    tokens = tokens_of(models[0], [Image.open(data_folder / f"{i:02d}.png").convert("RGB") for i in range(12)], 6,
                       "patch+cls")
    expected = concepts.metrics(concepts.load(folders / "vit"), tokens)
    assert report["fvu"] == pytest.approx(expected.fvu, rel=1e-5) and report["tokens"] == 12 * 65
    assert report["spliced"]["images"] == 12 and 0 <= report["spliced"]["agreement"] <= 1
    assert main(["concepts", "evaluate", str(folders / "cvt"), "--data", str(data_folder), "--cache", cache,
                 "--out", str(tmp_path / "cvt.json")]) == 0
    assert "class token" in json.loads((tmp_path / "cvt.json").read_text())["spliced"]["not_spliced"]
    assert main(["concepts", "evaluate", str(folders / "across"), "--data", str(data_folder), "--cache", cache,
                 "--out", str(tmp_path / "across.json")]) == 0
    across = json.loads((tmp_path / "across.json").read_text())
    assert across["cells"] == [4, 4] and np.asarray(across["r2"]).shape == (2, 2)

    assert main(["concepts", "match", str(folders / "vit"), str(folders / "cvt"), "--data", str(data_folder),
                 "--out", str(tmp_path / "matched"), "--matrix"]) == 0
    assert {p.name for p in (tmp_path / "matched").iterdir()} == {"matches.json", "correlations.safetensors"}
    assert "pairs over" in capsys.readouterr().out


def test_a_dictionary_across_models_loads_from_the_hub(hub, own_caches, folders):
    from hub_server import files_of

    hub.publish("test/across-pair", {**files_of(folders / "across"), ".gitattributes": b""})   # as every Hub repo
    fetched = concepts.load("test/across-pair")
    local = concepts.load(folders / "across")
    assert fetched.models == local.models == ("vit-cifar10", "cvt-cifar10")
    for model in local.models:
        for name, value in local.dictionary(model).state_dict().items():
            assert torch.equal(fetched.dictionary(model).state_dict()[name], value)
