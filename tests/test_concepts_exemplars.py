"""vitviz.concepts.analysis.exemplars: each concept's top images with their maps, built streaming, kept in one file.

References are independent of the builder: a brute-force ranking over every image at once (Python's sort on
(-value, index)), frequencies worked by hand, and on the bundled ViT each exemplar's value recomputed from the
model's own trace and the dictionary's encoder.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load as load_tensors, save as save_tensors

from vitviz import concepts, hub
from vitviz.concepts import ConceptsError, Origin, TopK
from vitviz.concepts.activations.align import align, in_photo
from vitviz.concepts.activations.cache import block_tokens, cache_activations
from vitviz.concepts.analysis.exemplars import (
    FILE,
    HEADER_KEY,
    TopImages,
    build_exemplars,
    exemplars_of,
    load_exemplars,
    save_exemplars,
)
from vitviz.concepts.files.own import checksum
from vitviz.data import Dataset

ORIGIN = Origin(model="synthetic", block=0, tokens="patch")


def brute_force_top(codes: torch.Tensor, top: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per concept, the `top` images of largest max-over-tokens code among those it fires on, ties to the smaller
    image index, padded with (-1, 0.0): every image ranked at once."""
    peaks = codes.amax(1)   # images n
    images, values = [], []
    for c in range(codes.shape[2]):
        ranked = sorted((-float(peaks[i, c]), i) for i in range(len(peaks)) if peaks[i, c] > 0)[:top]
        images.append([i for _, i in ranked] + [-1] * (top - len(ranked)))
        values.append([-v for v, _ in ranked] + [0.0] * (top - len(ranked)))
    return images, values


def sparse_codes(images: int, cells: int, n: int, *, seed: int) -> torch.Tensor:
    """images cells n codes with many exact ties: small whole numbers, mostly 0; concept 0 fires on two images
    only, concept 1 on none."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 5, (images, cells, n), generator=g).float() * (torch.rand(images, cells, n, generator=g)
                                                                         < 0.2)
    codes[:, :, 0] = 0
    codes[[17, 3], 1, 0] = torch.tensor([2.0, 2.0])
    codes[:, :, 1] = 0
    return codes


def stream(index: TopImages, codes: torch.Tensor, *, seed: int) -> None:
    """Every image's codes into `index` once, in a shuffled order and batches of uneven sizes (one empty)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(codes), generator=g)
    index.add(torch.zeros(0, dtype=torch.int64), codes[:0])
    start = 0
    while start < len(order):
        size = int(torch.randint(1, 40, (1,), generator=g))
        chosen = order[start:start + size]
        index.add(chosen, codes[chosen])
        start += size


def test_streaming_top_images_equal_a_brute_force_ranking_ties_to_the_smaller_index():
    codes = sparse_codes(300, 6, 12, seed=0)
    index = TopImages(12, grid=(3, 2), top=5)
    stream(index, codes, seed=1)
    images, values = brute_force_top(codes, 5)
    assert index.images.tolist() == images
    assert index.values.tolist() == values
    assert images[0] == [3, 17, -1, -1, -1] and images[1] == [-1] * 5   # the tie at 2.0 and the empty places
    for c in range(12):
        for r, i in enumerate(images[c]):
            expected = codes[i, :, c] if i >= 0 else torch.zeros(6)
            assert torch.equal(index.maps[c, r], expected)


def test_the_index_holds_concepts_times_top_candidates_however_many_images_pass():
    n, top, grid = 32, 4, (4, 4)
    index = TopImages(n, grid=grid, top=top)
    g = torch.Generator().manual_seed(0)
    sizes = []
    for batch in range(200):
        codes = torch.relu(torch.randn(64, 16, n, generator=g))
        index.add(torch.arange(batch * 64, (batch + 1) * 64), codes)
        sizes.append(index.nbytes)
    assert set(sizes) == {n * top * (16 * 4 + 4 + 8) + n * 8}   # maps f32, values f32, images i64; counters i64
    assert index.images.shape == index.values.shape == (n, top) and index.maps.shape == (n, top, 16)
    assert index.tokens == 200 * 64 * 16 and int(index.images.max()) >= 12_000   # the late images got in


def test_frequency_and_ranking_worked_by_hand():
    # two images on a 1 x 2 grid, three concepts:  image 5: tokens (1, 0, 0), (0, 0, 2);  image 9: (3, 0, 0), (0, 0, 0)
    codes = torch.tensor([[[1.0, 0, 0], [0, 0, 2]], [[3.0, 0, 0], [0, 0, 0]]])
    index = TopImages(3, grid=(1, 2), top=2)
    index.add(torch.tensor([5, 9]), codes)
    # concept 0 fires on 2 of the 4 tokens, concept 1 on none, concept 2 on one
    assert index.frequency.tolist() == [0.5, 0.0, 0.25]
    assert index.images.tolist() == [[9, 5], [-1, -1], [5, -1]]
    assert index.values.tolist() == [[3.0, 1.0], [0.0, 0.0], [2.0, 0.0]]
    assert index.maps[0].tolist() == [[3.0, 0.0], [1.0, 0.0]] and index.maps[2, 0].tolist() == [0.0, 2.0]


def test_a_batch_of_the_wrong_shape_is_refused_in_words():
    index = TopImages(3, grid=(2, 2), top=2)
    with pytest.raises(ConceptsError, match=r"codes \(images, 4, 3\)"):
        index.add(torch.arange(2), torch.zeros(2, 5, 3))


# ---- the index with its thumbnails, and its file ------------------------------------------------------------

def picture(h: int, w: int, seed: int) -> Image.Image:
    """A smooth RGB picture (gradients: JPEG keeps them well)."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w] / max(h, w)
    channels = [np.sin(2 * math.pi * (a * ys + b * xs) + c) for a, b, c in rng.uniform(0, 1, (3, 3))]
    return Image.fromarray(((np.stack(channels, -1) + 1) * 127.5).astype(np.uint8))


def synthetic_data() -> Dataset:
    """Twelve pictures: the even ones 100 x 50 (reduced to 64 x 32 thumbnails), the odd ones 20 x 30 (kept)."""
    pictures = [picture(50, 100, i) if i % 2 == 0 else picture(30, 20, i) for i in range(12)]
    return Dataset(name="synthetic", ids=tuple(f"picture-{i}.png" for i in range(12)),
                   labels=tuple(i % 3 for i in range(12)), classes=("red", "green", "blue"),
                   source=pictures.__getitem__)


def random_dictionary(seed: int, d: int = 8, n: int = 6) -> TopK:
    g = torch.Generator().manual_seed(seed)
    dictionary = TopK(d, n, k=2, origin=ORIGIN)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, n, generator=g))
        rows = torch.randn(n, d, generator=g)
        dictionary.W_dec.copy_(rows / rows.norm(dim=1, keepdim=True))
    return dictionary.eval()


def built_index():
    """(exemplars, dictionary, data): a random dictionary's index over the synthetic pictures' random tokens."""
    data, dictionary = synthetic_data(), random_dictionary(0)
    tokens = torch.randn(12, 4, 8, generator=torch.Generator().manual_seed(1))
    batches = [(images, dictionary.encode(tokens[images])) for images in torch.arange(12).split(5)]
    return build_exemplars(dictionary, batches, data, grid=(2, 2), top=3, model="synthetic"), dictionary, data


@pytest.fixture
def built():
    return built_index()


def psnr(a: Image.Image, b: Image.Image) -> float:
    error = np.mean((np.asarray(a, float) - np.asarray(b, float)) ** 2)
    return 10 * math.log10(255 ** 2 / error)


def test_thumbnails_are_the_data_sets_own_images_reduced_to_64_px_at_most(built):
    exemplars, _, data = built
    assert len(exemplars.ids) == len(exemplars.thumbnail_images) > 0
    for i in exemplars.thumbnail_images.tolist():
        thumbnail, original = exemplars.thumbnail(i), data.image(i)
        reference = original.copy()
        reference.thumbnail((64, 64))
        assert thumbnail.size == ((64, 32) if i % 2 == 0 else (20, 30))
        assert psnr(thumbnail, reference) > 30   # JPEG's error only
    with pytest.raises(ConceptsError, match="no concept's exemplar"):
        exemplars.thumbnail(999)


def test_a_concepts_exemplars_come_as_image_and_map_with_their_value_and_place(built):
    exemplars, _, data = built
    concept = int(exemplars.frequency.argmax())
    shown = exemplars.of(concept)
    assert [e.index for e in shown] == [i for i in exemplars.images[concept].tolist() if i >= 0]
    for e in shown:
        assert e.map.shape == (2, 2) and e.value == pytest.approx(float(e.map.max()), rel=1e-3)
        assert e.id == data.ids[e.index] and e.label == data.classes[data.labels[e.index]]
        assert e.image.size == exemplars.thumbnail(e.index).size
    with pytest.raises(ConceptsError, match="concepts 0 to 5"):
        exemplars.of(6)


def test_saved_and_loaded_the_index_is_the_same(built, tmp_path):
    exemplars, dictionary, _ = built
    path = save_exemplars(exemplars, tmp_path / "dictionary")
    assert path == tmp_path / "dictionary" / FILE
    back = load_exemplars(tmp_path / "dictionary", dictionary=dictionary)
    for name in ("images", "values", "maps", "frequency", "labels", "thumbnail_images", "thumbnail_offsets",
                 "thumbnail_jpeg"):
        assert torch.equal(getattr(back, name), getattr(exemplars, name)), name
        assert getattr(back, name).dtype == getattr(exemplars, name).dtype
    for name in ("tokens", "data", "ids", "classes", "thumbnail_size", "model", "origin", "dictionary_sha256", "grid"):
        assert getattr(back, name) == getattr(exemplars, name), name


def test_an_index_of_another_dictionary_is_refused_in_words(built, tmp_path):
    exemplars, _, _ = built
    save_exemplars(exemplars, tmp_path)
    with pytest.raises(ConceptsError, match="built for another dictionary"):
        load_exemplars(tmp_path, dictionary=random_dictionary(1))


def forged(path: Path, change) -> None:
    """The file at `path` rewritten with `change(tensors)` applied and a checksum that agrees: inconsistent, not
    damaged."""
    raw = path.read_bytes()
    header = load_header(raw)
    tensors = load_tensors(raw)
    change(tensors)
    header["sha256"] = checksum(tensors)
    path.write_bytes(save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))


def load_header(raw: bytes) -> dict:
    length = int.from_bytes(raw[:8], "little")
    return json.loads(json.loads(raw[8:8 + length])["__metadata__"][HEADER_KEY])


def flip_last_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))


def unthumbnailed_exemplar(tensors) -> None:
    tensors["images"][0, 0] = 11 if 11 not in tensors["thumbnail_images"].tolist() else 10
    tensors["values"][0, 0] = 1.0


@pytest.mark.parametrize(("damage", "words"), [
    (flip_last_byte, "is damaged: its tensors are not the ones it was written with"),
    (lambda path: path.write_bytes(path.read_bytes()[:-100]), "cannot be read as an exemplar index"),
    (lambda path: forged(path, unthumbnailed_exemplar), "an exemplar has no thumbnail"),
    (lambda path: forged(path, lambda t: t.update(maps=t["maps"].float())), "maps is torch.float32"),
    (lambda path: forged(path, lambda t: t["values"].__setitem__((0, 0), float("nan"))), "NaN or infinite"),
    (lambda path: concepts.save(random_dictionary(0), path), "not a vitviz exemplar index"),
])
def test_a_damaged_or_inconsistent_file_is_refused_in_words(built, tmp_path, damage, words):
    path = save_exemplars(built[0], tmp_path / "exemplars.safetensors")
    damage(path)
    with pytest.raises(ConceptsError, match=words):
        load_exemplars(path)


def test_thumbnails_cost_about_a_kilobyte_for_a_cifar_image(one_torch_thread, cifar10_test):
    dictionary = random_dictionary(0)
    codes = torch.zeros(64, 1, 6)
    codes[:, 0, :] = torch.arange(64, dtype=torch.float32)[:, None] + 1   # every concept: images 63, 62, ...
    exemplars = build_exemplars(dictionary, [(torch.arange(64), codes)], cifar10_test, grid=(1, 1), top=8)
    assert exemplars.images[0].tolist() == list(range(63, 55, -1))
    per_image = len(exemplars.thumbnail_jpeg) / len(exemplars.thumbnail_images)
    assert 600 < per_image < 1400
    assert all(exemplars.thumbnail(i).size == (32, 32) for i in exemplars.images[0].tolist())


# ---- end to end on the bundled ViT ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vit_layer(tmp_path_factory, one_torch_thread, cifar10_test):
    """(loaded, data, cached, dictionary): vit-cifar10's last block over 64 CIFAR-10 test images, and a small
    TopK dictionary trained on them."""
    loaded = hub.load("vit-cifar10", device="cpu")
    cached = cache_activations(loaded, cifar10_test, block=-1, root=tmp_path_factory.mktemp("cache"), indices=range(64),
                               progress=False)
    dictionary = concepts.train(cached.tokens(), kind="topk", k=4, expansion=2, epochs=1, progress=False,
                                model="vit-cifar10", block=cached.block, tokens="patch")
    return loaded, cifar10_test, cached, dictionary


def traced_codes(loaded, data, dictionary, indices) -> torch.Tensor:
    """images tokens n: the dictionary's codes of each image's last-block patch tokens, from the model's trace."""
    with torch.inference_mode():
        pixels = torch.cat([loaded.preprocess(data.image(i)) for i in indices])
        return dictionary.encode(block_tokens(loaded.model.trace(pixels, attention=False), -1, "patch"))


def test_each_concepts_top_image_has_its_largest_code_in_the_vit(vit_layer):
    loaded, data, cached, dictionary = vit_layer
    exemplars = exemplars_of(dictionary, cached, data, top=4, batch_images=20)
    codes = traced_codes(loaded, data, dictionary, range(64))   # 64 64 n
    peaks = codes.amax(1)
    fired = [c for c in range(dictionary.n_concepts) if exemplars.images[c, 0] >= 0]
    assert len(fired) > dictionary.n_concepts // 4 and exemplars.grid == (8, 8)
    for c in fired:
        best = int(exemplars.images[c, 0])
        assert float(peaks[best, c]) == pytest.approx(float(peaks[:, c].max()), abs=1e-4)
        assert float(exemplars.values[c, 0]) == pytest.approx(float(peaks[best, c]), abs=1e-4)
        torch.testing.assert_close(exemplars.maps[c, 0].float(), codes[best, :, c].reshape(8, 8), atol=2e-3,
                                   rtol=1e-3)
    never = [c for c in range(dictionary.n_concepts) if not (peaks[:, c] > 0).any()]
    assert all(exemplars.images[c, 0] == -1 for c in never)
    torch.testing.assert_close(exemplars.frequency, (codes > 0).double().mean((0, 1)), atol=3 / (64 * 64), rtol=0)
    best = int(exemplars.images[fired[0], 0])
    assert psnr(exemplars.thumbnail(best), data.image(best)) > 30


def test_the_class_token_of_a_cached_layer_is_left_out_of_the_index(vit_layer, tmp_path):
    loaded, data, cached, dictionary = vit_layer
    with_cls = cache_activations(loaded, data, block=-1, tokens="patch+cls", root=tmp_path, indices=range(64),
                                 progress=False)
    assert with_cls.layer["prefix"] == 1
    patch, both = (exemplars_of(dictionary, layer, data, top=4) for layer in (cached, with_cls))
    assert torch.equal(both.images, patch.images) and torch.equal(both.frequency, patch.frequency)
    only_cls = cache_activations(loaded, data, block=-1, tokens="cls", root=tmp_path, indices=range(8),
                                 progress=False)
    with pytest.raises(ConceptsError, match="class tokens alone has no grid"):
        exemplars_of(dictionary, only_cls, data)


def test_on_an_alignments_cells_the_maps_are_its_grid_and_the_values_its_cells_codes(vit_layer):
    loaded, data, cached, dictionary = vit_layer
    vit = in_photo(torch.tensor(cached.layer["rectangles"], dtype=torch.float64), loaded.transform, (32, 32))
    quarters = torch.tensor([[y / 4, x / 4, (y + 1) / 4, (x + 1) / 4] for y in range(4) for x in range(4)],
                            dtype=torch.float64)   # a model with 4 x 4 tokens over the whole photo
    alignment = align([vit, quarters])
    exemplars = exemplars_of(dictionary, cached, data, top=2, alignment=alignment, model_index=0)
    assert exemplars.grid == (4, 4)
    with torch.inference_mode():
        pixels = torch.cat([loaded.preprocess(data.image(i)) for i in range(64)])
        grid = block_tokens(loaded.model.trace(pixels, attention=False), -1, "patch").reshape(64, 4, 2, 4, 2, -1)
        cells = dictionary.encode(grid.mean((2, 4)).reshape(64, 16, -1))   # each cell: the mean of its 2 x 2 patches
    peaks = cells.amax(1)
    for c in (c for c in range(dictionary.n_concepts) if exemplars.images[c, 0] >= 0):
        assert float(exemplars.values[c, 0]) == pytest.approx(float(peaks[:, c].max()), abs=1e-4)
    with pytest.raises(ConceptsError, match="say which of them"):
        exemplars_of(dictionary, cached, data, alignment=alignment)
