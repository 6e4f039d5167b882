"""The app's Concepts tab: what its cards draw and its words say, checked against `concepts.photo`'s reading on the
locally loaded models (`vitviz.load` and `photo.readers`, run here, not through the app), the exemplar index read
by `load_exemplars` and a match read by `Matches.load`; one model pass per photo and pair of dictionaries; the
refusals in words; and the launched app from a real browser and a real client."""
import json
import pickle
import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

import vitviz
from tests.app_server import SCREENSHOTS, explained_page, launch
from vitviz import catalog
from vitviz.concepts import TopK, save
from vitviz.concepts.activations.cache import cache_activations
from vitviz.concepts.analysis.exemplars import exemplars_of, load_exemplars, save_exemplars
from vitviz.concepts.analysis.match import Matches
from vitviz.concepts.analysis.names import concept_names
from vitviz.concepts.analysis.photo import ACROSS_REMOVAL, readers, shared_concepts
from vitviz.concepts.files.across import save_across
from vitviz.concepts.kinds.across import Across
from vitviz.concepts.kinds.dictionary import Origin
from vitviz.data import open_folder
from vitviz.looks.pictures import FILE
from vitviz.session import ModelRun
from vitviz.ui import concepts, gpu, page, shared
from vitviz.ui.concept_words import change, percent

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")
DICTIONARIES = ("vit-cifar10-last", "cvt-cifar10-last")   # the bundled pair's own
QUIET = dict(progress=lambda *a, **k: None)


def explained(pair=PAIR) -> str:
    """A new Explain of the photo (its own session: nothing of it is kept yet)."""
    return page.explain({"path": str(PHOTO)}, *pair, **QUIET).key


def recording(monkeypatch, name: str) -> list:
    """Each call's arguments of concepts.`name` (a drawing function), which still draws."""
    calls, draw = [], getattr(concepts, name)
    monkeypatch.setattr(concepts, name, lambda *a, **k: calls.append((a, k)) or draw(*a, **k))
    return calls


def local_reading(name: str, source: str, *, remove: bool = True):
    """The library's reading of the photo through `source`, on the locally loaded model."""
    loaded = vitviz.load(name)
    run = ModelRun(loaded, shared.SESSIONS.get(explained()).picture)
    (reader,) = readers([loaded], [source])
    return run, reader.read(run, remove=remove)


def crop_region(transform, size: tuple[int, int]) -> tuple[float, ...]:
    """The part of a photo of `size` (h, w) the model's centre crop keeps, in fractions (y0, x0, y1, x1)."""
    (rh, rw), (top, left, h, w) = transform.resized_size(size), transform.crop_box(size)
    return top / rh, left / rw, (top + h) / rh, (left + w) / rw


def shown_order(reference) -> list[int]:
    """The concepts a column shows for one model's own dictionary: the grid's top, then the class token's others."""
    return list(dict.fromkeys([*reference.top.tolist(), *([] if reference.class_top is None else
                                                          reference.class_top.tolist())]))


def table_of(words: str) -> list[dict[str, str]]:
    """A column's Markdown table, read back: a dict per row, keyed by the heads."""
    lines = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in words.splitlines()
             if line.startswith("|")]
    heads, rows = lines[0], lines[2:]   # the second line sets the alignment
    return [dict(zip(heads, row)) for row in rows]


def photos_folder(tmp: Path) -> Path:
    """The example photos as a data set labelled by their names' first word (airplane, cat, ...)."""
    folder = tmp / "photos"
    for photo in sorted((ROOT / "assets").glob("*.jpg")):
        (folder / photo.stem.split("_")[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(photo, folder / photo.stem.split("_")[0] / photo.name)
    return folder


def with_exemplars(tmp: Path, name: str) -> Path:
    """A copy of bundled dictionary `name` with a small exemplar index of its own, over the example photos."""
    folder = tmp / "dictionaries" / name
    folder.mkdir(parents=True)
    shutil.copy(catalog.BUNDLED_DICTIONARIES[name].path / "concepts.safetensors", folder)
    dictionary = vitviz.concepts.load(folder)
    data = open_folder(photos_folder(tmp) if not (tmp / "photos").is_dir() else tmp / "photos")
    cached = cache_activations(vitviz.load(dictionary.model), data, block=dictionary.block,
                               tokens=dictionary.origin.tokens, root=tmp / "cache", progress=False)
    save_exemplars(exemplars_of(dictionary, cached, data, top=4), folder)
    return folder


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> list[Path]:
    """Copies of the bundled pair's dictionaries with exemplar indexes over the example photos."""
    tmp = tmp_path_factory.mktemp("indexed")
    return [with_exemplars(tmp, name) for name in DICTIONARIES]


@pytest.fixture
def allowed(monkeypatch, indexed) -> list[str]:
    monkeypatch.setattr(gpu.dictionaries, "LOCAL_DICTIONARIES", {str(indexed[0].parent)})   # VITVIZ_DICTIONARIES
    return [str(folder) for folder in indexed]


def test_a_concept_map_colours_each_cell_of_its_region_by_its_code_and_leaves_the_rest():
    from vitviz.render.concepts import OPACITY, cell_overlay
    from vitviz.render.overlay import colormap
    grey = np.full((8, 12, 3), 100, np.uint8)
    drawn = cell_overlay(grey, np.array([[0.0, 2.0], [1.0, 4.0]]), (0.5, 0.25, 1.0, 0.75), vmax=2.0)
    lut = colormap("inferno").astype(float)
    # the region is rows 4-7, columns 3-8: four cells of 2 x 3 pixels; codes over vmax are at the top of the scale
    expected = grey.astype(float)
    for (rows, columns), unit in zip([((4, 6), (3, 6)), ((4, 6), (6, 9)), ((6, 8), (3, 6)), ((6, 8), (6, 9))],
                                     [0.0, 1.0, 0.5, 1.0]):
        colour = lut[int(np.round(unit * 255))]
        expected[rows[0]:rows[1], columns[0]:columns[1]] = 100 + OPACITY * unit * (colour - 100)
    np.testing.assert_allclose(drawn, np.round(expected), atol=1)
    assert (drawn[:4] == 100).all() and (drawn[:, :3] == 100).all() and (drawn[:, 9:] == 100).all()


def test_the_cards_draw_photo_pys_reading_its_exemplars_and_removals_on_the_bundled_pair(monkeypatch, allowed):
    key = explained()
    concepts.exemplar_tiles.cache_clear()   # drawn here, not by an earlier test
    overlays, tiles = recording(monkeypatch, "cell_overlay"), recording(monkeypatch, "exemplar_tile")
    drawn = recording(monkeypatch, "concept_card")
    shown = concepts.render_concepts(key, *allowed)
    kept = concepts.reading(key, *allowed, compute=False)
    for side, (name, source, cards) in enumerate(zip(PAIR, allowed, (shown.concepts_a, shown.concepts_b))):
        run, reference = local_reading(name, source)
        order = shown_order(reference)
        assert [caption for _, caption in cards] == [str(c) for c in order]
        assert all(view.ndim == 3 and view.dtype == np.uint8 for view, _ in cards)
        maps, overlays = overlays[:len(order)], overlays[len(order):]   # column by column, card by card
        for (args, options), concept in zip(maps, order):
            np.testing.assert_allclose(args[1], reference.concept_map(concept), rtol=1e-5, atol=1e-6)
            assert args[2] == pytest.approx(crop_region(run.loaded.transform, (run.image.height, run.image.width)))
            assert options["vmax"] == pytest.approx(float(reference.concept_map(concept).max()))
        index = load_exemplars(source, dictionary=vitviz.concepts.load(source))
        expected = [e for c in order for e in index.of(c)]
        mine, tiles = tiles[:len(expected)], tiles[len(expected):]
        assert expected and len(mine) == len(expected)
        for ((thumbnail, values, region), _), exemplar in zip(mine, expected):
            np.testing.assert_array_equal(thumbnail, np.asarray(exemplar.image))
            np.testing.assert_array_equal(values, exemplar.map)
            assert region == pytest.approx(crop_region(run.loaded.transform, thumbnail.shape[:2]))
        column = kept.columns[side]
        assert column.frequency == pytest.approx(index.frequency[order].numpy())
        removed, rows = reference.removed.tolist(), table_of((shown.words_a, shown.words_b)[side])
        assert [row["concept"] for row in rows] == [str(c) for c in order]   # a row per card, in the cards' order
        # each card titled, and each row named, by the classes of its concept's top images (the photos' names)
        names, (cards_drawn, drawn) = concept_names(index, order), (drawn[:len(order)], drawn[len(order):])
        assert [options["title"] for _, options in cards_drawn] == [name.title for name in names]
        assert [row["name"] for row in rows] == [name.words for name in names]
        assert all(name.title.startswith(f"#{c} ") for name, c in zip(names, order) if name.words)
        assert any(name.classes for name in names), "the example photos' classes name no concept shown"
        for row, concept in zip(rows, order):
            k = removed.index(concept)
            assert column.removal.without[concept] == (pytest.approx(float(reference.without[k])),
                                                       run.label(int(reference.top_without[k])))
            target, before, after = run.label(reference.target), reference.probability, float(reference.without[k])
            top = run.label(int(reference.top_without[k]))
            assert row["without it"] == (f"{target} stays at {percent(before)}" if abs(after - before) < 5e-4
                                         else f"{target} {change(before, after)}"
                                         + ("" if top == target else f" ({top} on top)"))
            codes = reference.codes[:, concept]
            assert row["code"] == f"{codes.mean():.2f}" and row["photo"] == percent(float((codes > 0).mean()))
        strongest = max(order, key=lambda c: abs(column.removal.without[c][0] - reference.probability))
        assert f"removing concept {strongest} moves the prediction most" in shown.note
        assert "held-out FVU" not in shown.note   # these copies have no metrics.json beside them
        assert reference.class_top is not None, "the bundled pair's dictionaries read the class token too"
        at_class = {row["concept"]: row["class token"] for row in rows}
        for concept, code in zip(reference.class_top.tolist(), reference.class_codes[reference.class_top]):
            assert at_class[str(concept)] == f"{code:.2f}"
    assert not overlays and not tiles
    assert "Two separate dictionaries: no match of" in shown.note and "No exemplar images" not in shown.note
    # a concept's top images are drawn once a process: drawn again, the cards are the same and no tile is redrawn
    again = concepts.render_concepts(key, *allowed)
    assert not tiles
    for before, after in ((shown.concepts_a, again.concepts_a), (shown.concepts_b, again.concepts_b)):
        assert [caption for _, caption in after] == [caption for _, caption in before]
        for (view, _), (redrawn, _) in zip(before, after):
            np.testing.assert_array_equal(redrawn, view)


def test_a_concepts_top_image_is_equal_by_content_so_another_photos_reading_finds_its_tiles_drawn():
    thumbnail = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    made = [gpu.ConceptImage(thumbnail=thumbnail.copy(), map=np.ones((4, 4), np.float32) * v, region=(0, 0, 1, 1),
                             value=1.5, label="cat") for v in (1, 1, 2)]   # as two readings bring them back
    assert made[0] == made[1] and hash(made[0]) == hash(made[1]) and made[0] != made[2]
    concepts.exemplar_tiles.cache_clear()
    first, again = concepts.exemplar_tiles((made[0],), 60), concepts.exemplar_tiles((made[1],), 60)
    assert again is first and concepts.exemplar_tiles.cache_info().hits == 1
    assert not first[0].flags.writeable


def random_dictionary(model: str, *, d: int, block: int, tokens: str, n: int = 64, k: int = 8, seed: int = 0) -> TopK:
    """A TopK dictionary of random unit directions, said to be trained on `model`'s block `block`."""
    g = torch.Generator().manual_seed(seed)
    dictionary = TopK(d, n, k=k, origin=Origin(model=model, block=block, tokens=tokens))
    with torch.no_grad():
        dictionary.W_dec.copy_(torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1))
        dictionary.W_enc.copy_(dictionary.W_dec.T)
    return dictionary


def last_block(name: str) -> tuple[int, int]:
    """(index, width) of a model's last block."""
    loaded = vitviz.load(name)
    trace = loaded.model.trace(torch.zeros(1, 3, *loaded.transform.crop), attention=False)
    return len(trace.blocks) - 1, trace.blocks[-1].tokens.shape[-1]


@pytest.fixture
def across(tmp_path, monkeypatch) -> str:
    """One dictionary across the bundled pair (random directions) on 4 x 4 cells, in a folder the owner allows."""
    folder = tmp_path / "across"
    blocks = [last_block(name) for name in PAIR]
    across = Across([random_dictionary(name, d=width, block=index, tokens="patch", seed=seed)
                     for seed, (name, (index, width)) in enumerate(zip(PAIR, blocks))])
    across.training_record = {"cells": [4, 4]}
    save_across(across, folder)
    monkeypatch.setattr(gpu.dictionaries, "LOCAL_DICTIONARIES", {str(tmp_path)})
    return str(folder)


def test_one_dictionary_across_both_models_shows_the_same_concepts_in_both_columns_and_which_only_one_uses(
        monkeypatch, across):
    key = explained()
    overlays = recording(monkeypatch, "cell_overlay")
    shown = concepts.render_concepts(key, across, across)
    references = [local_reading(name, across)[1] for name in PAIR]
    both, only_a, only_b = shared_concepts(*references)
    assert both, "the random directions share no concept on the photo: pick another seed"
    for cards, only, reference in zip((shown.concepts_a, shown.concepts_b), (only_a, only_b), references):
        order = both + only
        assert [caption for _, caption in cards] == [str(c) for c in order]
        maps, overlays = overlays[:len(order)], overlays[len(order):]
        assert reference.grid == (4, 3)   # the 4 x 4 cells over the whole photo, where the crop keeps 3 columns
        for (args, _), concept in zip(maps, order):
            np.testing.assert_allclose(args[1], reference.concept_map(concept), rtol=1e-5, atol=1e-6)
        assert reference.no_removal == ACROSS_REMOVAL and ACROSS_REMOVAL in shown.note
    for words, only in ((shown.words_a, only_a), (shown.words_b, only_b)):
        assert {row["concept"]: row["both models"] for row in table_of(words)} == {
            **{str(c): "both" for c in both}, **{str(c): "only this one" for c in only}}
        assert all("name" not in row for row in table_of(words))   # no exemplar index: called by their numbers
    assert "One dictionary across both models" in shown.note and "has no exemplar index" in shown.note


def test_two_separate_dictionaries_show_their_matched_pairs_from_a_match_beside_them(tmp_path, monkeypatch):
    folders = [tmp_path / name for name in DICTIONARIES]
    for name, folder in zip(DICTIONARIES, folders):
        folder.mkdir()
        shutil.copy(catalog.BUNDLED_DICTIONARIES[name].path / "concepts.safetensors", folder)
    monkeypatch.setattr(gpu.dictionaries, "LOCAL_DICTIONARIES", {str(tmp_path)})
    key = explained()
    sources = [str(folder) for folder in folders]
    references = [local_reading(name, source, remove=False)[1] for name, source in zip(PAIR, sources)]
    # concept i of the ViT's matched to the CvT's i-th most active, the ViT's top 3 only
    top_a, top_b = references[0].top[:3].tolist(), references[1].top[:3].tolist()
    sides = tuple({"model": name, "block": r.block, "tokens": "patch+cls", "dictionary": {"n_concepts": 768}}
                  for name, r in zip(PAIR, references))
    Matches(sides=sides[::-1], pairs=torch.tensor([[b, a] for a, b in zip(top_a, top_b)]),
            correlation=torch.tensor([0.9, 0.5, 0.25], dtype=torch.float64),
            firing=(torch.zeros(768, dtype=torch.float64),) * 2, rows=100, images=10, skipped=0,
            min_rows=10).save(tmp_path / f"match-{folders[1].name}-{folders[0].name}")   # saved the other way round
    shown = concepts.render_concepts(key, *sources)
    column = concepts.reading(key, *sources, compute=False).columns[0]
    for k, concept in enumerate(column.concepts.tolist()):
        partner = column.partners[k]
        if concept in top_a:
            b, rho = top_b[top_a.index(concept)], [0.9, 0.5, 0.25][top_a.index(concept)]
            assert partner == (b, pytest.approx(rho), pytest.approx(float(references[1].codes[:, b].mean())))
        else:
            assert partner is None
    matched = {str(a): f"{b} ({rho:.2f})" for a, b, rho in zip(top_a, top_b, (0.9, 0.5, 0.25))}
    rows = table_of(shown.words_a)
    assert {row["concept"]: row["match"] for row in rows} == {
        row["concept"]: matched.get(row["concept"], "none") for row in rows}
    assert "their concepts matched by the correlation of their maps" in shown.note
    assert "*match*, cvt-cifar10's concept whose map goes with it (correlation)" in shown.words_a


def test_a_click_lists_the_concepts_active_at_the_token_under_it_in_both_models(allowed):
    key = explained()
    assert concepts.concepts_at(key, (200, 150), *allowed).startswith("Press **Read the concepts** first")
    concepts.render_concepts(key, *allowed)
    point = (180.0, 200.0)   # on the cat's nose, in the pixels of the photo as shown (its full size)
    words = concepts.concepts_at(key, point, *allowed)
    for name, source in zip(PAIR, allowed):
        run, reference = local_reading(name, source, remove=False)
        x, y = run.canvas.frame.to_input(*shared.run_point(run, point))   # in the model's input pixels
        (height, width), (rows, columns) = run.loaded.transform.crop, reference.grid
        i, j = int(y // (height / rows)), int(x // (width / columns))   # the token whose tile holds the point
        listed = ", ".join(f"{c} ({code:.2f})" for c, code in reference.at(i * reference.grid[1] + j))
        assert f"**{name}**, cell ({i + 1}, {j + 1}) of its {reference.grid[0]} x {reference.grid[1]}: {listed}." \
            in words
    assert "outside its crop" in concepts.concepts_at(key, (5.0, 150.0), *allowed)   # the hatched left edge
    assert concepts.concepts_at(key, None, *allowed) == concepts.POINT_WORDS


def test_one_model_pass_per_photo_and_dictionaries_and_redrawing_or_clicking_runs_none(monkeypatch):
    key = explained()
    asked, compute = [], gpu.concepts
    monkeypatch.setattr(gpu, "concepts", lambda names, picture, pixels, sources, prompts=None, pinned=None:
                        asked.append(list(sources)) or compute(names, picture, pixels, sources, prompts, pinned))
    first = concepts.render_concepts(key, *DICTIONARIES)
    assert asked == [list(DICTIONARIES)]
    for name, line in zip(DICTIONARIES, first.note.split("\n\n")):   # the held-out FVU in metrics.json beside each
        fvu = json.loads((catalog.BUNDLED_DICTIONARIES[name].path / "metrics.json").read_text())["fvu"]
        assert f"through **{name}** (" in line and f"; held-out FVU {fvu:.3f})" in line
    found = concepts.reading(key, *DICTIONARIES, compute=False)
    crossed = pickle.dumps(found)   # as ZeroGPU's worker hands it back: plain data, no weights
    assert len(crossed) < 2_000_000 and b"torch.nn" not in crossed and b"Parameter" not in crossed
    np.testing.assert_array_equal(pickle.loads(crossed).columns[1].maps, found.columns[1].maps)
    for name in ("trace", "class_maps", "decide", "concepts"):
        monkeypatch.setattr(gpu, name, lambda *a, **k: pytest.fail("a redraw asked for a model pass"))
    again = concepts.render_concepts(key, *DICTIONARIES)
    assert first.note == again.note and np.array_equal(first.concepts_b[0][0], again.concepts_b[0][0])
    assert "cell (" in concepts.concepts_at(key, (200.0, 150.0), *DICTIONARIES)
    closed = concepts.Shown(*(gr.skip(),) * len(concepts.Shown._fields))   # a closed tab draws nothing
    assert concepts.concepts_if_open(key, *DICTIONARIES, None, False) == closed
    assert concepts.render_concepts(None, *DICTIONARIES).note == concepts.WAITING


def test_each_column_opens_with_its_models_own_dictionary_and_keeps_one_typed_in():
    assert concepts.default_dictionary("vit-cifar10") == "vit-cifar10-last"
    assert concepts.default_dictionary("cvt-cifar10") == "cvt-cifar10-last"
    assert concepts.default_dictionary("dinov2-b14") == "saev-dinov2-b14"   # a published one, from the catalog
    assert concepts.default_dictionary("dinov2-s14") == ""
    assert "vit-cifar10-middle" in concepts.dictionaries_for("vit-cifar10")
    # what an Explain sends each box: another model's dictionary replaced by the model's own; one that serves the
    # model, or one typed in, left as the box holds it (no value sent: one typed since the Explain began stays)
    assert concepts.dictionary_box("swin-cifar10", "vit-cifar10-last").constructor_args["value"] == "swin-cifar10-last"
    for model, held in (("swin-cifar10", "someone/their-sae"), ("vit-cifar10", "vit-cifar10-middle")):
        box = concepts.dictionary_box(model, held)
        assert "value" not in box.constructor_args, held
        assert box.constructor_args["choices"] == concepts.dictionaries_for(model)


def test_refusals_and_what_does_not_apply_are_said_in_words(tmp_path, monkeypatch, dinov2_repos):
    key = explained()
    shown = concepts.render_concepts(key, "", "vit-cifar10-last")
    assert "**vit-cifar10**: No dictionary is chosen for vit-cifar10: name one in its box." in shown.note
    assert ("**cvt-cifar10**: vit-cifar10-last was trained on vit-cifar10, which is none of the models asked for "
            "(cvt-cifar10).") in shown.note
    assert shown.concepts_a == shown.concepts_b == []
    with pytest.raises(gr.Error, match="reads local dictionaries only below the folders its owner allows"):
        concepts.render_concepts(key, str(catalog.BUNDLED_DICTIONARIES["vit-cifar10-last"].path), "")
    with pytest.raises(gr.Error, match="a path on the server"):
        concepts.render_concepts(key, "../../etc", "")
    # a model without a classifier: its concepts, and no prediction to move
    index, width = last_block("dinov2-s14")
    save(random_dictionary("dinov2-s14", d=width, block=index, tokens="patch"), tmp_path / "dino")
    monkeypatch.setattr(gpu.dictionaries, "LOCAL_DICTIONARIES", {str(tmp_path)})
    shown = concepts.render_concepts(explained(("dinov2-s14", "resnet-cifar10")), str(tmp_path / "dino"),
                                     "resnet-cifar10-last")
    assert "No removal: dinov2-s14 has no classifier: there is no prediction to move." in shown.note
    assert shown.concepts_a and shown.concepts_b
    cnn = shown.note.split("\n\n")[1]   # a CNN's concepts are of its positions; its blocks' output is what it reads
    assert cnn.startswith(f"**resnet-cifar10** through **resnet-cifar10-last** (block "
                          f"{last_block('resnet-cifar10')[0] + 1}'s positions, 512 concepts")
    assert "moves the prediction most, cat" in cnn


# ---- what each concept looks like ------------------------------------------------------------------------

def picture_colours(n: int, seed: int) -> np.ndarray:
    """n flat pictures of 8 px, each its own colour (floats in [0, 1]): a card's tile shows which one it holds."""
    return np.broadcast_to(np.random.default_rng(seed).uniform(0.1, 0.9, (n, 1, 1, 3)), (n, 8, 8, 3)).astype(np.float32)


def ship_pictures(folder: Path, sets: dict[str, np.ndarray], tables=None) -> None:
    """A pictures file beside the dictionary in `folder`, written by `looks.save_pictures` as a shipped one is: per
    set (a model's name, or 'shared'), each concept's picture and a flat transparency map; `tables`
    (`looks.alike.Tables`) where given."""
    from vitviz.looks import Pictures, save_pictures
    from vitviz.looks.pictures import jpegs

    made = {}
    for name, images in sets.items():
        encoded = jpegs(images, np.full(images.shape[:3], 0.5, np.float32))
        offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(b) for b in encoded])]), dtype=torch.int64)
        made[name] = (torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8), offsets,
                      torch.zeros(len(images), 4))
    n = len(next(iter(sets.values())))
    save_pictures(Pictures(sets=made, n_concepts=n, dictionary_sha256="", seconds=0.0,
                           settings={"method": "maco", "steps": 32, "copies": 2, "seed": 0, "canvas": None},
                           tables=tables), folder)


def tile_centre(card: np.ndarray, k: int, exemplars: int) -> np.ndarray:
    """The colour at the centre of the k-th tile of a card's row of pictures (which lies over its exemplar tiles)."""
    from vitviz.render.concepts import CARD_WIDTH, GAP, PHOTO_HEIGHT, exemplar_layout
    per_row, side = exemplar_layout(exemplars or 5)
    x0 = (CARD_WIDTH - (per_row * side + (per_row + 1) * GAP)) // 2
    y, x = PHOTO_HEIGHT + GAP + side // 3, x0 + GAP + k * (side + GAP) + side // 2   # above the tile's label
    return card[y, x].astype(int)


def test_each_card_shows_the_picture_shipped_beside_its_dictionary_and_an_across_ones_shared_and_each_models(
        monkeypatch, tmp_path, across):
    from vitviz.looks import pictures_of
    from vitviz.looks.alike import Tables
    own = tmp_path / "vit-own"   # a copy of the ViT's own dictionary, in the folder the across fixture allows
    own.mkdir()
    shutil.copy(catalog.BUNDLED_DICTIONARIES["vit-cifar10-last"].path / "concepts.safetensors", own)
    ship_pictures(own, {"vit-cifar10": picture_colours(768, seed=1)})
    values = np.arange(64 * 3 * 2, dtype=np.float64).reshape(64, 3, 2) / 8   # exact in float32
    tables = Tables(sets=("shared", *PAIR), models=PAIR, values=values, percentiles=np.ones((64, 2)),
                    data="500 test images of cifar10")
    ship_pictures(Path(across), {"shared": picture_colours(64, 2), "vit-cifar10": picture_colours(64, 3),
                                 "cvt-cifar10": picture_colours(64, 4)}, tables)
    key = explained()
    drawn = recording(monkeypatch, "concept_card")
    shown = concepts.render_concepts(key, str(own), "cvt-cifar10-last")
    shipped = pictures_of(own)
    for (_, options), (card, caption) in zip(drawn, shown.concepts_a):
        (label, picture), = options["pictures"]
        assert label == "its picture" and np.array_equal(picture, shipped.picture(int(caption))[0])
        expected = np.round(picture_colours(768, seed=1)[int(caption), 0, 0] * 255)
        assert np.abs(tile_centre(card, 0, 0) - expected).max() <= 12   # on the card (this copy has no index)
    bundled = pictures_of("cvt-cifar10-last")   # the bundled CvT's pictures, shipped with it (none: the cards say so)
    for (_, options), (_, caption) in zip(drawn[len(shown.concepts_a):], shown.concepts_b):
        expected = [] if bundled is None else [("its picture", bundled.picture(int(caption))[0])]
        assert [label for label, _ in options["pictures"]] == [label for label, _ in expected]
        assert all(np.array_equal(mine, theirs) for (_, mine), (_, theirs) in zip(options["pictures"], expected))
    drawn.clear()
    shown = concepts.render_concepts(key, across, across)
    shipped = pictures_of(across)
    assert shipped.models == PAIR
    for (_, options), (card, caption) in zip(drawn, shown.concepts_a + shown.concepts_b):
        c = int(caption)
        assert [label for label, _ in options["pictures"]] == ["shared", "vit", "cvt"]   # the models' names, short
        for (_, picture), model in zip(options["pictures"], (None, *PAIR)):
            assert np.array_equal(picture, shipped.picture(c, model)[0])
        for k, seed in enumerate((2, 3, 4)):
            colour = np.round(picture_colours(64, seed)[c, 0, 0] * 255)
            assert np.abs(tile_centre(card, k, 0) - colour).max() <= 12
    picked, words, button, _ = concepts.picked_at(0)(key, across, across, None,
                                                     gr.SelectData(None, {"index": 0, "value": 0}))
    assert picked == (0, int(shown.concepts_a[0][1])) and not button.visible
    assert f"its pictures ship with {across} (MACO, 32 steps, seed 0; the shared one and each model's own)" in words
    c = picked[1]   # the table shipped with the pictures, each picture's row
    for label, row in zip(("shared", "vit's own", "cvt's own"), values[c]):
        assert f"| {label} | {row[0]:.1f}x | {row[1]:.1f}x |" in words
    assert (f"Most strongly, cvt-cifar10's picture excites concept {c} in vit-cifar10 at {values[c, 2, 0]:.1f}x its "
            f"99th percentile on 500 test images of cifar10; least, vit-cifar10's picture excites concept {c} in "
            f"cvt-cifar10 at {values[c, 1, 1]:.1f}x") in words


@pytest.fixture
def quick(monkeypatch):
    """The cards' drawing settings, cut to a few steps of one crop (the shipped ones, otherwise)."""
    from vitviz import looks
    from vitviz.ui import pictures
    settings = looks.Settings(method=looks.Maco(canvas=1.0, box=(0.8, 1.0)), steps=3, copies=1, seed=0)
    monkeypatch.setattr(pictures, "settings", lambda: settings)
    return settings


def test_draw_this_concept_draws_what_the_library_draws_once_and_puts_it_on_both_columns_cards(monkeypatch, across,
                                                                                                quick):
    from vitviz import looks
    key = explained()
    first = concepts.render_concepts(key, across, across)
    with pytest.raises(gr.Error, match="click a card first"):
        concepts.draw_picked(key, across, across, None, None, **QUIET)
    picked, words, button, _ = concepts.picked_at(1)(key, across, across, None,
                                                     gr.SelectData(None, {"index": 0, "value": 0}))
    concept = picked[1]
    assert picked == (1, int(first.concepts_b[0][1])) and button.visible
    assert (f"no picture of it ships with {across}. **Draw this concept** draws one in vit-cifar10 and cvt-cifar10 "
            f"at once, then in each alone (MACO, 3 steps of 1 crop, seed 0; about ") in words   # said beforehand
    calls, draw = [], gpu.draw_pictures
    monkeypatch.setattr(gpu, "draw_pictures", lambda *a, **k: calls.append((a, k)) or draw(*a, **k))
    drawn, heard = recording(monkeypatch, "concept_card"), []
    cards_a, cards_b, words, button, _ = concepts.draw_picked(key, across, across, None, picked,
                                                              progress=lambda f, desc=None: heard.append(desc))
    assert len(calls) == 1 and not button.visible and "drawn in" in words
    assert heard[0].startswith(f"drawing concept {concept} of {across}: about") and heard[-1] == "step 9 of 9"
    references = [looks.draw(models, looks.Concept(across, concept), settings=quick, device="cpu", bar=False)
                  for models in (list(PAIR), [PAIR[0]], [PAIR[1]])]
    cards = [options for (_, options), (_, caption) in zip(drawn, cards_a + cards_b) if caption == str(concept)]
    assert len(cards) == 2   # the concept's card in both columns
    for options in cards:
        assert [label for label, _ in options["pictures"]] == ["shared", "vit", "cvt"]
        for (_, picture), reference in zip(options["pictures"], references):
            np.testing.assert_array_equal(picture, reference.images[0])
    # kept in the session: drawing or picking it again runs no model, and the card keeps its pictures
    concepts.draw_picked(key, across, across, None, picked, **QUIET)
    picked, words, button, _ = concepts.picked_at(1)(key, across, across, None,
                                                     gr.SelectData(None, {"index": 0, "value": 0}))
    assert len(calls) == 1 and not button.visible and "its pictures were drawn here" in words


def test_draw_variants_puts_the_librarys_variants_and_negative_on_the_card_once(monkeypatch, across, quick):
    """"Draw variants" on a picked card of a dictionary across both models: the library's three variants of the
    concept in both models at once and its negative, labelled after the card's own pictures (none ship here), on the
    concept's card in both columns; kept in the session."""
    from vitviz import looks
    key = explained()
    concepts.render_concepts(key, across, across)
    select = gr.SelectData(None, {"index": 0, "value": 0})
    picked, words, _, button = concepts.picked_at(0)(key, across, across, None, select)
    assert button.visible and ("**Draw variants** draws 3 more from other starts, pushed apart in style, and the "
                               "picture that lowers it most, in vit-cifar10 and cvt-cifar10 at once (about") in words
    calls, draw = [], gpu.draw_pictures
    monkeypatch.setattr(gpu, "draw_pictures", lambda *a, **k: calls.append((a, k)) or draw(*a, **k))
    drawn = recording(monkeypatch, "concept_card")
    cards_a, cards_b, words, _, button = concepts.draw_variants_picked(key, across, across, None, picked, **QUIET)
    assert len(calls) == 1 and not button.visible and "vit-cifar10 + cvt-cifar10 negative:" in words
    concept = looks.Concept(across, picked[1])
    variants = looks.draw(list(PAIR), concept, settings=quick, variants=3, device="cpu", bar=False)
    negative = looks.draw(list(PAIR), concept, settings=quick, negative=True, device="cpu", bar=False)
    cards = [options for (_, options), (_, caption) in zip(drawn, cards_a + cards_b) if caption == str(picked[1])]
    assert len(cards) == 2   # the concept's card in both columns
    for options in cards:
        assert [label for label, _ in options["pictures"]] == ["v1", "v2", "v3", "negative"]
        for (_, picture), reference in zip(options["pictures"], [*variants.images, negative.images[0]]):
            np.testing.assert_array_equal(picture, reference)
    concepts.draw_variants_picked(key, across, across, None, picked, **QUIET)
    _, words, _, button = concepts.picked_at(0)(key, across, across, None, select)
    assert len(calls) == 1 and not button.visible and "Its 3 variants (v1 to v3) and its negative were drawn" in words


# ---- the launched app ------------------------------------------------------------------------------------

def shipped_or_indexed(tmp: Path) -> list[str]:
    """The bundled pair's dictionaries where both ship their exemplar index, else copies indexed over the example
    photos (in tmp/dictionaries, which the server is then told to allow)."""
    if all((catalog.BUNDLED_DICTIONARIES[name].path / "exemplars.safetensors").is_file() for name in DICTIONARIES):
        return list(DICTIONARIES)
    return [str(with_exemplars(tmp, name)) for name in DICTIONARIES]


def undrawn_copy(tmp: Path, name: str = "vit-cifar10-block5") -> Path:
    """A copy of bundled dictionary `name` (its weights, exemplar index and means) without the pictures it ships,
    in tmp/dictionaries: a dictionary whose cards offer to draw its concepts."""
    folder = tmp / "dictionaries" / f"{name}-without-pictures"
    folder.mkdir(parents=True)
    for file in catalog.BUNDLED_DICTIONARIES[name].path.iterdir():
        if file.name != FILE:
            shutil.copy(file, folder)
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app, launched offline; the dictionaries its Concepts tab is to read; one without pictures."""
    tmp = tmp_path_factory.mktemp("concepts-app")
    sources = shipped_or_indexed(tmp)
    undrawn = undrawn_copy(tmp)
    server = launch(tmp, env={"VITVIZ_DICTIONARIES": str(tmp / "dictionaries")})
    yield server, sources, str(undrawn)
    server.stop()


@pytest.mark.slow
def test_concepts_is_one_documented_endpoint_and_answers_from_a_real_client(served):
    from gradio_client import Client, handle_file
    server, sources, _ = served
    client = Client(server.url, verbose=False, analytics_enabled=False,
                    download_files=str(server.log.parent / "downloads"))
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/concepts" in api and "/concepts_open" not in api and "/render_concepts" not in api
    assert [p["parameter_name"] for p in api["/concepts"]["parameters"]] == ["dictionary_a", "dictionary_b"]
    client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    note, cards_a, cards_b, words_a, words_b, point = client.predict(*sources, api_name="/concepts")
    for name, source, cards in zip(PAIR, sources, (cards_a, cards_b)):
        assert f"**{name}** through **{source}**" in note
        assert len(cards) >= 8 and all(Path(card["image"]).is_file() for card in cards)
        assert all(card["caption"].isdigit() for card in cards)
    assert "moves the prediction most" in note and "No exemplar images" not in note and point == concepts.POINT_WORDS
    for name, words, cards in zip(PAIR, (words_a, words_b), (cards_a, cards_b)):
        assert words.startswith(f"**{name}**, card by card") and len(table_of(words)) == len(cards)
        assert all(row["name"] for row in table_of(words))   # the bundled indexes' CIFAR-10 classes name each
    note, cards_a, cards_b, *_ = client.predict("", "vit-cifar10-last", api_name="/concepts")
    assert "No dictionary is chosen for vit-cifar10" in note and cards_a == cards_b == []


@pytest.mark.slow
def test_a_person_reads_both_models_concepts_with_their_maps_and_exemplars_and_clicks_the_photo(served):
    from tests.test_app import open_tab
    server, sources, _ = served
    with explained_page(server.url, PHOTO) as page:
        open_tab(page, "Concepts")
        for box, source in zip(("#concepts-dictionary-a", "#concepts-dictionary-b"), sources):
            field = page.locator(f"{box} input")
            field.fill(source)
            field.press("Enter")
        page.locator("#concepts-read").click()
        page.locator("#concepts-note").get_by_text("moves the prediction most").first.wait_for(timeout=120_000)
        for gallery in ("#concepts-a", "#concepts-b"):
            page.locator(f"{gallery} img").first.wait_for(timeout=60_000)
            assert page.locator(f"{gallery} img").count() >= 8
            for image in page.locator(f"{gallery} img").all():   # a gallery loads its images as they come into view
                image.scroll_into_view_if_needed()
        page.wait_for_function("() => [...document.querySelectorAll('#concepts-a img, #concepts-b img')]"
                               ".every(i => i.complete && i.naturalWidth > 300)", timeout=30_000)   # whole cards
        note = page.locator("#concepts-note").inner_text()
        assert "No exemplar images" not in note and all(f"{name} through" in note for name in PAIR)
        for gallery, words in (("#concepts-a", "#concepts-words-a"), ("#concepts-b", "#concepts-words-b")):
            assert page.locator(f"{words} tbody tr").count() == page.locator(f"{gallery} img").count()   # one per card
        page.evaluate("document.querySelectorAll('#tabs *').forEach(e => { e.scrollTop = 0; })")
        page.locator("#tabs").screenshot(path=str(SCREENSHOTS / "8-concepts.png"))
        image = page.locator("#input-image img").first
        image.scroll_into_view_if_needed()
        box = image.bounding_box()
        image.click(position={"x": box["width"] * 0.4, "y": box["height"] * 0.6})
        page.locator("#concepts-point").get_by_text("cell (").first.wait_for(timeout=30_000)
        words = page.locator("#concepts-point").inner_text()
        assert all(f"{name}, cell (" in words for name in PAIR)
        page.locator("#concepts-point").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "8-concepts-click.png"))
        page.set_viewport_size({"width": 390, "height": 844})   # a phone: each picker's name whole, clear of its arrow
        for box, name in zip(("#concepts-dictionary-a", "#concepts-dictionary-b"), DICTIONARIES):
            field = page.locator(f"{box} input")
            field.fill(name)
            text_end = field.evaluate("""e => { const style = getComputedStyle(e);
                const pen = document.createElement('canvas').getContext('2d');
                pen.font = style.font;
                const start = e.getBoundingClientRect().x + parseFloat(style.paddingLeft);
                return start + pen.measureText(e.value).width; }""")
            assert text_end <= page.locator(f"{box} .dropdown-arrow").bounding_box()["x"], box
        page.locator("#concepts-dictionary-a").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "8-concepts-390.png"))
    assert server.process.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 390], ids=["1400 px wide", "a phone, 390 px wide"])
def test_a_person_sees_each_concepts_picture_on_its_card_and_draws_one_where_none_ships(served, width):
    """The right column's dictionary ships its pictures, the left one's none (a bundled one's copy without them): a
    click on a left card says so with the time a drawing takes, and Draw this concept draws its picture onto the
    card, with a progress bar."""
    from tests.test_app import open_tab
    from vitviz.looks import pictures_of
    server, _, undrawn = served
    assert pictures_of(undrawn) is None and pictures_of("cvt-cifar10-last") is not None
    with explained_page(server.url, PHOTO, width=width) as page_:
        open_tab(page_, "Concepts")
        # the opened tab's own reading (each column's default dictionary) done first: the note then waited for is
        # the typed dictionary's
        page_.locator("#concepts-note").get_by_text("through vit-cifar10-last").first.wait_for(timeout=120_000)
        for box, source in zip(("#concepts-dictionary-a", "#concepts-dictionary-b"), (undrawn, "cvt-cifar10-last")):
            field = page_.locator(f"{box} input")
            field.fill(source)
            field.press("Enter")
        page_.locator("#concepts-read").click()
        page_.locator("#concepts-note").get_by_text(f"through {undrawn}").first.wait_for(timeout=120_000)
        for gallery in ("#concepts-a", "#concepts-b"):
            page_.locator(f"{gallery} img").first.wait_for(timeout=60_000)
            for image in page_.locator(f"{gallery} img").all()[:4]:   # a gallery loads its images as they show
                image.scroll_into_view_if_needed()
        page_.wait_for_function("() => [...document.querySelectorAll('#concepts-b img')].slice(0, 4)"
                                ".every(i => i.complete && i.naturalWidth >= 400)", timeout=30_000)
        assert not page_.locator("#concepts-draw").is_visible()   # nothing picked yet
        page_.locator("#concepts-b img").first.scroll_into_view_if_needed()   # cards with their shipped pictures
        page_.screenshot(path=str(SCREENSHOTS / f"11-concept-pictures-{width}.png"))
        page_.locator("#concepts-a img").first.click()   # a card of the dictionary without pictures
        pick = page_.locator("#concepts-pick")
        pick.get_by_text(f"no picture of it ships with {undrawn}").first.wait_for(timeout=30_000)
        assert " s)" in pick.inner_text() or " min)" in pick.inner_text()   # how long it takes, said beforehand
        before = page_.locator("#concepts-a img").first.get_attribute("src")
        page_.locator("#concepts-draw").click()
        pick.get_by_text("drawn in").first.wait_for(timeout=600_000)
        assert not page_.locator("#concepts-draw").is_visible()
        page_.wait_for_function("before => { const i = document.querySelector('#concepts-a img'); return i && "
                                "i.src !== before && i.complete && i.naturalWidth >= 400; }", arg=before,
                                timeout=30_000)   # the cards drawn again, the picture on its card
        page_.locator("#concepts-a .preview img").first.scroll_into_view_if_needed()   # the card picked, enlarged
        page_.screenshot(path=str(SCREENSHOTS / f"11-concept-drawn-{width}.png"))
    assert server.process.poll() is None
