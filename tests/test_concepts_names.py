"""vitviz.concepts.analysis.names: a concept's name from the classes of its top images, and by CLIP's nearest words.

References are independent of the naming: names written by hand for planted indexes, the classes counted with a
Counter over `Exemplars.of` (the exemplars' own labels), and for CLIP the cosines computed on open_clip's own
modules (ln_post, proj, encode_text), with a concept planted on a word's text features by least squares.
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitviz
from vitviz import catalog
from vitviz.cli import main
from vitviz.concepts import ConceptsError, Origin, TopK
from vitviz.concepts.analysis.exemplars import build_exemplars, index_in, load_exemplars
from vitviz.concepts.analysis.match import Matches
from vitviz.concepts.analysis.names import (
    MIN_SHARE,
    MOST_CLASSES,
    concept_names,
    dictionary_names,
    nearest_words,
    word_list,
)
from vitviz.data import Dataset, open_folder

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse")
IMAGES = 48   # image i is of class i % 8: six of each


def data(*, labelled: bool = True) -> Dataset:
    """48 one-colour 16 x 16 pictures, image i of class i % 8 (or without labels)."""
    return Dataset(name="planted", ids=tuple(f"{i}.png" for i in range(IMAGES)),
                   labels=tuple(i % len(CLASSES) for i in range(IMAGES)) if labelled else None,
                   classes=CLASSES if labelled else None,
                   source=lambda i: Image.new("RGB", (16, 16), (5 * i, 100, 200)))


def of_class(name: str, count: int) -> list[int]:
    """The first `count` images of class `name`."""
    return [CLASSES.index(name) + len(CLASSES) * j for j in range(count)]


# concept -> {image: value}: the images each fires on, with its code there
PLANTED = {
    0: {i: 1.0 + i / 100 for i in of_class("airplane", 6)},                                 # one class alone
    1: {**{i: 5.0 for i in of_class("bird", 5)}, **{i: 4.0 for i in of_class("cat", 2)}, of_class("deer", 1)[0]: 4.5},
    2: {i: 1.0 for i in range(8)},                                                            # 8 classes, one each
    3: {},                                                                                    # fires on nothing
    4: {**{i: 1.0 for i in of_class("dog", 2)}, **{i: 3.0 for i in of_class("frog", 2)}},  # equal counts
    5: {**{i: 2.0 for i in of_class("horse", 3)}, **{i: 2.5 for i in of_class("airplane", 3)},
        **{i: 9.0 for i in of_class("automobile", 2)}},                                      # 3, 3 and 2 of 8
}
EXPECTED = {0: "#0 airplane 100 %", 1: "#1 bird 62 %, cat 25 %", 2: "#2 mixed classes", 3: "concept 3",
            4: "#4 frog 50 %, dog 50 %", 5: "#5 airplane 37 %, horse 37 %"}


def planted(*, labelled: bool = True, top: int = 8):
    """The exemplar index of `PLANTED` (one grid cell per image) over `data()`."""
    dictionary = TopK(4, len(PLANTED), k=1, origin=Origin(model="synthetic", block=0, tokens="patch"))
    codes = torch.zeros(IMAGES, 1, len(PLANTED))
    for concept, fires in PLANTED.items():
        for image, value in fires.items():
            codes[image, 0, concept] = value
    batches = [(images, codes[images]) for images in torch.arange(IMAGES).split(20)]
    return build_exemplars(dictionary, batches, data(labelled=labelled), grid=(1, 1), top=top, model="synthetic")


def counted(exemplars, concept: int) -> tuple[Counter, int]:
    """(how many of the concept's exemplars are of each class, how many it has), from `Exemplars.of`."""
    shown = exemplars.of(concept)
    return Counter(e.label for e in shown if e.label is not None), len(shown)


def test_planted_concepts_are_named_by_the_classes_of_their_top_images_as_worked_by_hand():
    names = concept_names(planted())
    assert [name.title for name in names] == [EXPECTED[c] for c in range(len(PLANTED))]
    assert names[0].shares == (("airplane", 1.0),) and names[0].words == "airplane 100 %"
    assert names[1].shares == (("bird", 5 / 8), ("cat", 2 / 8))   # deer, one of eight, is under a quarter
    assert names[3].words == "" and names[3].exemplars == 0
    assert [name.title for name in concept_names(planted(), [5, 0])] == [EXPECTED[5], EXPECTED[0]]


def test_equal_shares_go_by_how_strongly_the_concept_fires_not_by_the_classes_order():
    assert concept_names(planted())[4].classes == (("frog", 2), ("dog", 2))   # frog's codes 3, dog's 1


def test_the_shares_named_add_up_to_at_most_100_percent_and_agree_with_the_exemplars_labels():
    g = torch.Generator().manual_seed(0)
    dictionary = TopK(4, 40, k=1)
    codes = torch.rand(IMAGES, 2, 40, generator=g) * (torch.rand(IMAGES, 2, 40, generator=g) < 0.15)
    batches = [(images, codes[images]) for images in torch.arange(IMAGES).split(16)]
    for top in (3, 5, 8):
        exemplars = build_exemplars(dictionary, batches, data(), grid=(1, 2), top=top)
        for name in concept_names(exemplars):
            classes, size = counted(exemplars, name.concept)
            assert name.exemplars == size and name.labelled == sum(classes.values())
            named = [c for c, k in sorted(classes.items(), key=lambda item: -item[1]) if k >= MIN_SHARE * size]
            assert {c for c, _ in name.classes} <= set(named) and len(name.classes) == min(len(named), MOST_CLASSES)
            assert all(count == classes[c] for c, count in name.classes)
            assert sum(share for _, share in name.shares) <= 1
            assert sum(int(p.split()[-2]) for p in name.words.split(", ") if p.endswith("%")) <= 100


def test_an_index_without_classes_or_no_index_calls_each_concept_by_its_number():
    names = concept_names(planted(labelled=False))
    assert [name.title for name in names] == [f"concept {c}" for c in range(len(PLANTED))]
    assert all(name.words == "" and name.classes == () for name in names)
    assert [name.title for name in concept_names(None, [7, 2])] == ["concept 7", "concept 2"]
    with pytest.raises(ConceptsError, match="say which concepts to name"):
        concept_names(None)
    with pytest.raises(ConceptsError, match="concepts 0 to 5; there is no 6"):
        concept_names(planted(), [6])


def bundled_indexes() -> list[Path]:
    return sorted((ROOT / "checkpoints" / "concepts").glob("**/exemplars*.safetensors"))


def test_every_bundled_concept_is_named_from_its_index_alone_its_shares_those_of_its_exemplars_labels():
    from vitviz import catalog

    assert len(bundled_indexes()) == sum(len(d.models) for d in catalog.BUNDLED_DICTIONARIES.values())   # one a model
    for file in bundled_indexes():
        exemplars = load_exemplars(file)
        names = concept_names(exemplars)
        assert len(names) == exemplars.n_concepts and all(n.words for n in names if n.exemplars), file
        assert sum(bool(n.classes) for n in names) > 0.7 * len(names), file   # CIFAR-10's classes name most
    exemplars = index_in("vit-cifar10-last")
    for name in concept_names(exemplars):
        classes, size = counted(exemplars, name.concept)
        assert name.words and name.exemplars == size > 0
        assert all(count == classes[c] and count >= MIN_SHARE * size for c, count in name.classes)
        assert [count for _, count in name.classes] == sorted(classes.values(), reverse=True)[:len(name.classes)]


def test_the_index_beside_a_dictionary_is_found_by_its_name_folder_weights_or_model(tmp_path):
    vit = index_in("vit-cifar10-last")
    folder = catalog.BUNDLED_DICTIONARIES["vit-cifar10-last"].path
    assert vit.dictionary_sha256 == load_exemplars(folder).dictionary_sha256
    across = vitviz.concepts.load("across-cifar10")
    with pytest.raises(ConceptsError, match="an exemplar index for each of vit-cifar10, cvt-cifar10, swin-cifar10, "
                                            "resnet-cifar10: say which model's"):
        index_in("across-cifar10")
    assert index_in("across-cifar10", model="swin-cifar10").model == "swin-cifar10"
    assert index_in("across-cifar10", dictionary=across.dictionary("cvt-cifar10")).model == "cvt-cifar10"
    with pytest.raises(ConceptsError, match="None of the 4 exemplar indexes .* was built from"):
        index_in("across-cifar10", dictionary=vitviz.concepts.load("vit-cifar10-last"))
    with pytest.raises(ConceptsError, match="is no dictionary's folder here"):
        index_in("someone/published-dictionary")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(folder / "concepts.safetensors", copy)
    with pytest.raises(ConceptsError, match="has no exemplar index"):
        index_in(copy)
    dictionary = vitviz.concepts.load(copy)
    assert [n.title for n in dictionary_names(copy, dictionary, [0, 1])] == ["concept 0", "concept 1"]
    assert dictionary_names("vit-cifar10-last", dictionary, [0, 1]) == concept_names(vit, [0, 1])


def test_the_names_command_lists_each_concept_with_its_name_and_refuses_in_words(capsys):
    assert main(["concepts", "names", "vit-cifar10-last", "--concepts", "3", "17", "394"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "top 5 images in cifar10_jpeg.npz" in lines[0]
    assert lines[1:] == [n.title for n in concept_names(index_in("vit-cifar10-last"), [3, 17, 394])]
    assert main(["concepts", "names", "across-cifar10", "--model", "resnet-cifar10", "--concepts", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == concept_names(index_in("across-cifar10",
                                                                             model="resnet-cifar10"), [0])[0].title
    assert main(["concepts", "names", "across-cifar10"]) == 2
    assert "say which model's concepts to name (--model)" in capsys.readouterr().err
    assert main(["concepts", "names", "vit-cifar10-last", "--clip"]) == 2
    assert "vit-cifar10 is not a CLIP model" in capsys.readouterr().err


def test_match_prints_its_closest_pairs_by_name(tmp_path, capsys, one_torch_thread):
    photos = tmp_path / "photos"
    for photo in sorted((ROOT / "assets").glob("*.jpg")):
        (photos / photo.stem.split("_")[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(photo, photos / photo.stem.split("_")[0] / photo.name)
    assert len(open_folder(photos)) == 8
    assert main(["concepts", "match", "vit-cifar10-last", "cvt-cifar10-last", "--data", str(photos),
                 "--out", str(tmp_path / "matched")]) == 0
    lines = capsys.readouterr().out.splitlines()
    pairs = Matches.load(tmp_path / "matched").pairs[:5].tolist()
    names = [concept_names(index_in(source), [pair[side] for pair in pairs])
             for side, source in enumerate(("vit-cifar10-last", "cvt-cifar10-last"))]
    assert pairs and "the closest:" in lines[0]
    assert [line.rsplit("  (", 1)[0].strip() for line in lines[1:1 + len(pairs)]] == [
        f"{a.title}  ~  {b.title}" for a, b in zip(*names)]


# ---- by CLIP's words ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """(the tiny QuickGELU CLIP loaded by vitviz, the same in open_clip), random perturbed weights."""
    from test_clip import TINY_NAMES, open_clip_model, register_tiny_clips, save_open_clip

    register_tiny_clips(tmp_path_factory.mktemp("open-clip-configs"))
    model = open_clip_model(TINY_NAMES["quick_gelu"]).eval()
    folder = save_open_clip(model, TINY_NAMES["quick_gelu"], tmp_path_factory.mktemp("clip") / "tiny")
    return vitviz.load(str(folder)), model, open_clip.get_tokenizer(TINY_NAMES["quick_gelu"])


def test_nearest_words_are_cosines_of_each_direction_through_ln_post_and_proj_with_open_clips_text(tiny_clip):
    loaded, model, tokenizer = tiny_clip
    words = ["ship", "dog", "red", "cloud", "wheel", "grass"]
    with torch.no_grad():
        text = model.encode_text(tokenizer(words))                                # words 32
        width = model.visual.ln_post.weight.shape[0]
        centring = torch.eye(width) - 1 / width
        into_joint = centring @ torch.diag(model.visual.ln_post.weight) @ model.visual.proj   # w (row) -> joint
        g = torch.Generator().manual_seed(0)
        directions = F.normalize(torch.randn(5, width, generator=g), dim=1)
        onto_ship = torch.linalg.lstsq(into_joint.T, text[0:1].T).solution.T   # its image: ship's text features
        directions[0] = F.normalize(onto_ship, dim=1)[0]
    dictionary = TopK(width, 5, k=1, origin=Origin(model=loaded.name, block=2, tokens="patch"))
    with torch.no_grad():
        dictionary.W_dec.copy_(directions)
    expected = F.normalize(directions @ into_joint, dim=1) @ F.normalize(text, dim=1).T
    found = nearest_words(dictionary, loaded, words=words, top=len(words))
    for row, cosines in zip(found, expected):
        assert [w for w, _ in row] == [words[j] for j in cosines.argsort(descending=True).tolist()]
        assert [c for _, c in row] == pytest.approx(sorted(cosines.tolist(), reverse=True), abs=1e-5)
    assert found[0][0] == ("ship", pytest.approx(1.0, abs=1e-5))
    assert [len(row) for row in nearest_words(dictionary, loaded, words=words, concepts=[1, 3])] == [3, 3]


def test_words_are_offered_for_a_clip_image_towers_dictionary_alone_and_the_shipped_list_reads(tiny_clip):
    loaded, *_ = tiny_clip
    listed = word_list()
    assert 250 <= len(listed) <= 500 and len(set(listed)) == len(listed) and {"airplane", "ship", "cat"} <= set(listed)
    vit = vitviz.load("vit-cifar10")
    with pytest.raises(ConceptsError, match="vit-cifar10 is not a CLIP model"):
        nearest_words(vitviz.concepts.load("vit-cifar10-last"), vit)
    with pytest.raises(ConceptsError, match="trained on vit-cifar10, not on"):
        nearest_words(vitviz.concepts.load("vit-cifar10-last"), loaded)
    with pytest.raises(ConceptsError, match="directions have 8 entries"):
        nearest_words(TopK(8, 4, k=1), loaded)
    with pytest.raises(ConceptsError, match="a dictionary across models"):
        nearest_words(vitviz.concepts.load("across-cifar10"), loaded)
