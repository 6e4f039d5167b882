"""Every concept's table of how each model's picture excites it in every model (`looks.alike.tables`), against the
table of one concept at a time (`looks.alike`, which reads a concept through `targets.Readout`), and kept in the
pictures file beside the dictionary."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from vitviz import hub
from vitviz.cli import main
from vitviz.looks import Concept, LooksError, alike, pictures_of
from vitviz.looks.alike import SHARED, every_concept, tables
from vitviz.looks.pictures import Pictures, jpegs, save_pictures
from vitviz.looks.targets import Readout

ACROSS = "across-vit-cvt-cifar10"
MODELS = ("vit-cifar10", "cvt-cifar10")


def test_every_concept_is_each_concepts_readout():
    """The whole encoder on the mean normalised token gives, for every concept, what `Readout` reads of it alone."""
    pixels = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for model in MODELS:
        loaded = hub.load(model, device="cpu")
        every = every_concept(loaded, {}, ACROSS, pixels)
        concepts = [0, 5, 767]
        readout = Readout(loaded, [Concept(ACROSS, c) for c in concepts for _ in range(len(pixels))])
        with torch.no_grad():
            trace = loaded.model.trace(loaded.transform.normalize(pixels.repeat(len(concepts), 1, 1, 1)),
                                       attention=False)
            one_at_a_time = readout(trace, 1)[:, 0].reshape(len(concepts), len(pixels)).T
        assert every.shape == (3, 768)
        assert torch.allclose(every[:, concepts], one_at_a_time, rtol=1e-4, atol=1e-4)


def small_pictures(photos) -> Pictures:
    """Pictures of the dictionary's first 4 concepts: CIFAR-10 photos standing in for the drawn ones, a set each."""
    sets = {}
    for s, name in enumerate((SHARED, *MODELS)):
        images = np.stack([np.asarray(photos.image(10 * s + c), dtype=np.float32) / 255 for c in range(4)])
        encoded = jpegs(images, np.ones(images.shape[:3]))
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum([len(j) for j in encoded])]).astype(np.int64))
        sets[name] = (torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8), offsets, torch.zeros(4, 2))
    return Pictures(sets=sets, n_concepts=4, settings={}, dictionary_sha256="-", seconds=0.0)


def test_tables_are_the_table_of_each_concept(cifar10_test, tmp_path):
    """Each concept's row of the tables equals `alike` of that concept on the same pictures and photos, the shared
    picture's row too (the shared picture given as every model's own); the file keeps the tables."""
    pictures = small_pictures(cifar10_test)
    found = tables(ACROSS, pictures, data=cifar10_test, images=100)
    assert found.sets == (SHARED, *MODELS) and found.values.shape == (4, 3, 2)
    for concept in range(4):
        row = found.of(ACROSS, concept)
        one = alike(ACROSS, concept, data=cifar10_test, images=100,
                    pictures={m: pictures.picture(concept, m)[0] for m in MODELS})
        assert np.allclose(row.percentiles, one.percentiles, rtol=1e-4)
        assert np.allclose(row.values, one.values, rtol=1e-3, atol=1e-4, equal_nan=True)
        shared = alike(ACROSS, concept, data=cifar10_test, images=100,
                       pictures={m: pictures.picture(concept, SHARED)[0] for m in MODELS})
        assert np.allclose(row.shared, np.diag(shared.values), rtol=1e-3, atol=1e-4, equal_nan=True)
        assert "the shared picture: vit-cifar10" in row.words()

    folder = tmp_path / "pictures"
    folder.mkdir()
    save_pictures(replace(pictures, tables=found), folder)
    kept = pictures_of(folder)
    assert kept.tables.data == found.data and np.allclose(kept.alike(2).values, found.of(ACROSS, 2).values,
                                                         equal_nan=True)
    assert pictures_of(folder).alike(0) is not None and replace(pictures).alike(0) is None


def test_the_command_refuses_what_it_cannot_measure_in_words(cifar10_test, tmp_path, capsys):
    """`vitviz looks --concepts DIR --alike` refuses a dictionary without pictures; the tables, a dictionary of one
    model."""
    import shutil

    from vitviz.concepts.files import folder_of

    folder = tmp_path / "across"
    shutil.copytree(folder_of(ACROSS), folder, ignore=shutil.ignore_patterns("looks.safetensors", "exemplars-*"))
    assert main(["looks", "--concepts", str(folder), "--alike"]) == 2
    assert "has no pictures yet: draw them first" in capsys.readouterr().err
    with pytest.raises(LooksError, match="a dictionary of one model"):
        tables("vit-cifar10-last", small_pictures(cifar10_test), data=cifar10_test, images=100)
