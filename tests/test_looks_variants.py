"""Several pictures of a target and its negative (`looks.draw(variants=, negative=)`, issue 56 item 4): the diversity
term is the Gram matrices' cosine similarity as Olah et al. define it, computed here by hand; variants are distinct
and each raises its objective (a tiny model, and a bundled concept above its 99th percentile on CIFAR-10 photos);
without the term variant 0 is the ordinary picture, and the term pushes the variants' styles apart; the negative
lowers the objective below its start and the ordinary picture's; a target read at one grid cell is that cell's
value; the command writes each and refuses bad input in words."""
import json
from itertools import combinations
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from tests.test_looks import loaded_tiny, tiny_dictionary
from vitviz.looks import Channel, Concept, Label, LooksError, Maco, Settings, Unit, draw
from vitviz.looks.draw import DIVERSITY, diversity_term, gram_cosines
from vitviz.looks.targets import Readout

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = Settings(steps=32, copies=2)


def pairwise_r(images: np.ndarray) -> np.ndarray:
    """Pearson's r over the pixel values of every pair of pictures."""
    return np.array([np.corrcoef(images[i].ravel(), images[j].ravel())[0, 1]
                     for i, j in combinations(range(len(images)), 2)])


def test_diversity_term_is_the_gram_cosine_by_hand():
    """Lucid's `diversity`: per target, the mean over its N variants of the summed cosine between the variant's Gram
    matrix (its K copies' grid tokens, Xᵀ X) and each other variant's; the class token left out."""
    targets, variants, copies, n, c = 2, 3, 2, 5, 4
    tokens = torch.randn(targets * variants * copies, 1 + n, c, generator=torch.Generator().manual_seed(0))
    trace = SimpleNamespace(logits=torch.zeros(len(tokens), 3),
                            blocks=[SimpleNamespace(tokens=tokens, prefix=1), SimpleNamespace(tokens=tokens[:, :3],
                                                                                             prefix=0)])
    x = tokens[:, 1:].double().numpy().reshape(targets, variants, copies * n, c)
    grams = np.einsum('bvtc,bvtd->bvcd', x, x).reshape(targets, variants, -1)
    cosine = lambda g, h: g @ h / np.linalg.norm(g) / np.linalg.norm(h)
    hand = np.array([[[cosine(grams[b, i], grams[b, j]) for j in range(variants)] for i in range(variants)]
                     for b in range(targets)])
    assert np.allclose(gram_cosines(tokens[:, 1:], variants=variants, copies=copies).numpy(), hand, atol=1e-5)
    term = [np.mean([sum(hand[b, i, j] for j in range(variants) if j != i) for i in range(variants)])
            for b in range(targets)]
    # each target read at its own block: target 0 at block 0 (grid after the class token), target 1 at block 1
    got = diversity_term(trace, {0: torch.tensor([0]), 1: torch.tensor([1])}, targets=targets, variants=variants,
                         copies=copies)
    assert np.isclose(got[0].item(), term[0], atol=1e-5) and got[1].item() != pytest.approx(term[1])
    both = diversity_term(trace, {0: torch.tensor([0, 1])}, targets=targets, variants=variants, copies=copies)
    assert np.allclose(both.numpy(), term, atol=1e-5)


def test_each_target_reads_its_own_block_and_a_class_has_no_place():
    loaded = loaded_tiny("vit")
    dictionary = tiny_dictionary(loaded, block=0)
    readout = Readout(loaded, [Concept(dictionary, 1), Unit(1, 2), Channel(-1, 3), Label("a")])
    assert readout.blocks == [0, 1, 2, 2]   # the tiny ViT's three blocks; a class: the last
    with pytest.raises(LooksError, match="A class logit has no place on the grid"):
        Readout(loaded, [Label("a", position=2)])


def test_a_target_at_a_cell_is_that_cells_value():
    """A channel at position p is channel c of the block's output token at grid cell p (after the class token)."""
    loaded = loaded_tiny("vit")
    pixels = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trace = loaded.model.trace(loaded.transform.normalize(pixels), attention=False)
        values = Readout(loaded, [Channel(-1, 3, position=p) for p in (0, 5)])(trace, 1)
    block = trace.blocks[-1]
    assert torch.allclose(values[:, 0], block.tokens[[0, 1], [block.prefix, block.prefix + 5], 3])


def test_variants_are_distinct_each_raises_its_objective_and_the_term_pushes_them_apart():
    loaded = loaded_tiny("vit")
    dictionary = tiny_dictionary(loaded)
    targets = [Concept(dictionary, 3), Channel(-1, 2)]
    drawing = draw(loaded, targets, settings=STEPS, variants=3, bar=False)
    assert drawing.images.shape == (6, 64, 64, 3) and drawing.variants == 3 and not drawing.negative
    for b in range(2):
        pictures, curve = drawing.images[3 * b:3 * b + 3], drawing.curve[3 * b:3 * b + 3]
        assert (pairwise_r(pictures) < 0.5).all(), pairwise_r(pictures)
        assert (curve[:, -6:].mean(1) > curve[:, :6].mean(1) + 0.1).all(), curve[:, [0, -1]]
    # without the term the variants are independent pictures: variant 0 is the ordinary one (a batch's sums may
    # round differently), variant 1 another start
    free = draw(loaded, targets, settings=STEPS, variants=3, diversity=0.0, bar=False)
    alone = draw(loaded, targets, settings=STEPS, bar=False)
    assert np.abs(free.images[[0, 3]] - alone.images).max() < 1e-3
    assert np.abs(free.images[1] - alone.images[0]).mean() > 0.05
    # a heavier term: the variants' styles (their Gram matrices at the target's block, each whole picture read
    # once: a canvas of the model's input, crops of most of it) end further apart than without it (measured: 0.73
    # against 0.89 in four variants; 0.87 at the default weight, 0.66 at 16 times it)
    def style_alike(images: np.ndarray) -> float:
        x = torch.nn.functional.interpolate(torch.from_numpy(images).permute(0, 3, 1, 2), size=(32, 32),
                                            mode="bilinear", antialias=True)
        with torch.no_grad():
            block = loaded.model.trace(loaded.transform.normalize(x), attention=False).blocks[-1]
        cosines = gram_cosines(block.tokens[:, block.prefix:], variants=len(images), copies=1)[0]
        return float(cosines[np.triu_indices(len(images), 1)].mean())
    whole = Settings(method=Maco(canvas=1.0, box=(0.8, 1.0)), steps=32, copies=2)
    heavy = draw(loaded, targets[:1], settings=whole, variants=4, diversity=4 * DIVERSITY, bar=False)
    without = draw(loaded, targets[:1], settings=whole, variants=4, diversity=0.0, bar=False)
    assert style_alike(heavy.images) < style_alike(without.images) - 0.05


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_the_negative_lowers_the_objective_below_its_start_and_the_positives(family):
    loaded = loaded_tiny(family)
    targets = [Concept(tiny_dictionary(loaded), 3), Channel(-1, 2), Label("c")]
    negative = draw(loaded, targets, settings=STEPS, negative=True, bar=False)
    positive = draw(loaded, targets, settings=STEPS, bar=False)
    assert negative.negative and np.allclose(negative.curve[:, 0], positive.curve[:, 0])   # one start, both ways
    # the first and last 6 steps averaged, as the objective's rise is checked (tests/test_looks.py)
    assert (negative.curve[:, -6:].mean(1) < negative.curve[:, :6].mean(1)).all(), negative.curve[:, [0, -1]]
    assert (negative.curve[:, -6:].mean(1) < positive.curve[:, -6:].mean(1) - 0.2).all()


def test_bad_variants_are_refused_in_words():
    loaded = loaded_tiny("vit")
    for options, words in [({"variants": 0}, "variants must be a whole number from 1 to 8"),
                           ({"variants": 2.5}, "not 2.5"), ({"diversity": -1.0}, "weight must be a number")]:
        with pytest.raises(LooksError, match=words):
            draw(loaded, Channel(-1, 2), settings=STEPS, bar=False, **options)


def test_a_bundled_concepts_variants_are_distinct_and_each_excites_it(cifar10_test):
    """`vit-cifar10-last`'s concept 17, three variants at the shipped settings (what a card draws): every pair r < 0.5,
    each above the concept's 99th percentile on 500 CIFAR-10 test photos (read whole, as `looks.alike` reads a
    picture). About 10 s on one thread."""
    from vitviz import hub
    from vitviz.looks.alike import read_in
    from vitviz.looks.pictures import SETTINGS

    loaded = hub.load("vit-cifar10", device="cpu")
    drawing = draw(loaded, Concept("vit-cifar10-last", 17), settings=SETTINGS, variants=3, device="cpu", bar=False)
    assert (pairwise_r(drawing.images) < 0.5).all(), pairwise_r(drawing.images)
    q, values = read_in(loaded, {}, "vit-cifar10-last", 17, cifar10_test, 500,
                        torch.from_numpy(drawing.images).permute(0, 3, 1, 2))
    assert q > 0 and (values > q).all(), values / q


def test_command_writes_variants_and_the_negative_and_refuses_in_words(tmp_path, capsys):
    from vitviz.cli import main

    argv = ["looks", "--concepts", "vit-cifar10-last", "--ids", "394", "--steps", "2", "--copies", "1", "--device",
            "cpu", "--out", str(tmp_path)]
    assert main([*argv, "--variants", "3", "--negative", "--position", "9", "--canvas", "32", "--box", "0.8", "1"]) == 0
    stems = [f"concept-0394-cell9-v{v}" for v in range(3)] + ["concept-0394-cell9-negative"]
    pictures = [np.asarray(Image.open(tmp_path / f"{stem}.png")) for stem in stems]
    assert all(p.shape == (32, 32, 3) for p in pictures) and not (tmp_path / "concept-0394-cell9.png").exists()
    records = [json.loads((tmp_path / f"{stem}-curve.json").read_text()) for stem in stems]
    assert [r["variant"] for r in records[:3]] == [0, 1, 2] and records[3]["negative"]
    assert all(r["position"] == 9 and r["box"] == [0.8, 1.0] for r in records) and records[0]["diversity"] == DIVERSITY
    # the cell read is the one asked for: the first step's objective is the library's at that position
    settings = Settings(method=Maco(box=(0.8, 1.0)), steps=1, copies=1, canvas=32)
    expected = draw("vit-cifar10", Concept("vit-cifar10-last", 394, position=9), settings=settings, device="cpu",
                    bar=False).curve[0, 0]
    assert records[3]["objective"][0] == pytest.approx(float(expected), abs=1e-4)
    for extra, words in [
        (["--variants", "0"], "variants must be a whole number from 1 to 8"),
        (["--variants", "9"], "from 1 to 8"),
        (["--position", "64"], "no position 64"),
        (["--diversity", "-1"], "weight must be a number"),
        (["--box", "0.9", "0.5"], "--box takes MACO's crop sides"),
        (["--box", "0.8", "1.0", "--method", "pixels"], "with --method pixels"),
        (["--pictures", "--negative"], "--position, --variants and --negative draw pictures of targets"),
    ]:
        assert main([*argv, *extra]) == 2
        assert words in capsys.readouterr().err
    assert main(["looks", "--model", "vit-cifar10", "--class", "cat", "--position", "3", "--out", str(tmp_path)]) == 2
    assert "a class's logit has no place on the grid" in capsys.readouterr().err


def test_pictures_drawn_on_request_are_kept_on_disk_by_what_made_them(monkeypatch, drawn_pictures):
    """The app's drawings (`ui.drawn`): the same request again reads the kept file (no model pass) and gives the
    same arrays; another setting, seed, position or number is another file; a damaged file is drawn again."""
    from vitviz.looks import Settings
    from vitviz.ui import drawn, gpu

    calls, draw = [], gpu.draw_pictures
    monkeypatch.setattr(gpu, "draw_pictures", lambda *a, **k: calls.append(a) or draw(*a, **k))
    ask = lambda number=5, seed=0, position=None: drawn.draw_pictures(
        [["vit-cifar10"]], "unit", number, block=2, settings=Settings(steps=2, copies=1, seed=seed),
        position=position)
    first = ask()
    again = ask()
    assert len(calls) == 1 and len(list(drawn_pictures.glob("*.safetensors"))) == 1
    for a, b in zip(first, again):
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("image", "alpha", "curve"))
        assert (a.models, a.target, a.note, a.label) == (b.models, b.target, b.note, b.label)
    ask(seed=1), ask(number=6), ask(position=3)
    assert len(calls) == 4 and len(list(drawn_pictures.glob("*.safetensors"))) == 4
    for path in drawn_pictures.glob("*.safetensors"):
        path.write_bytes(b"not a safetensors file")
    assert all(np.array_equal(a.image, b.image) for a, b in zip(ask(), first)) and len(calls) == 5
