"""vitviz.concepts.analysis.thumbnails: exemplar indexes over one data set sharing a store of its thumbnails.

The reference is the index as built, which keeps its own thumbnails: an index written with a store must load
back equal to it tensor for tensor, and the store must hold each image's JPEG once, the bytes the index built.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load as load_tensors, save as save_tensors

from test_concepts_exemplars import built_index, random_dictionary, synthetic_data
from vitviz.concepts import ConceptsError
from vitviz.concepts.analysis import thumbnails
from vitviz.concepts.analysis.exemplars import HEADER_KEY, TENSORS, build_exemplars, load_exemplars, save_exemplars
from vitviz.concepts.files.own import checksum
from vitviz.data import Dataset


@pytest.fixture
def built():
    return built_index()


HEADER_FIELDS = ("tokens", "data", "ids", "classes", "thumbnail_size", "model", "origin", "dictionary_sha256")


def equal(a, b) -> None:
    for name in TENSORS:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y) and x.dtype == y.dtype, name
    for name in HEADER_FIELDS:
        assert getattr(a, name) == getattr(b, name), name


def second_index(data: Dataset):
    """Another dictionary's index over the same pictures: some images in common with `built`'s, some not."""
    dictionary = random_dictionary(5)
    tokens = torch.randn(12, 4, 8, generator=torch.Generator().manual_seed(7))
    return build_exemplars(dictionary, [(torch.arange(12), dictionary.encode(tokens))], data, grid=(2, 2), top=2)


def test_indexes_written_with_a_store_load_back_as_built_and_the_store_holds_each_image_once(built, tmp_path):
    first, dictionary, data = built
    second = second_index(data)
    store = tmp_path / "thumbnails.safetensors"
    a = save_exemplars(first, tmp_path / "a" / "deeper", thumbnails=store)
    b = save_exemplars(second, tmp_path / "b.safetensors", thumbnails=store)
    equal(load_exemplars(a, dictionary=dictionary), first)
    equal(load_exemplars(b), second)
    assert not {"thumbnail_jpeg", "thumbnail_offsets"} & set(load_tensors(a.read_bytes()))
    held = thumbnails.read(store)
    union = torch.cat([first.thumbnail_images, second.thumbnail_images]).unique()
    assert torch.equal(held.images, union) and len(held.ids) == len(union)
    # each image's JPEG once, the bytes the index that first had it built
    for index in (first, second):
        for i, (s, e) in zip(index.thumbnail_images.tolist(), index.thumbnail_offsets.unfold(0, 2, 1).tolist()):
            where = int(torch.searchsorted(held.images, i))
            assert torch.equal(held.jpeg[held.offsets[where]:held.offsets[where + 1]], index.thumbnail_jpeg[s:e])
    assert len(held.jpeg) < len(first.thumbnail_jpeg) + len(second.thumbnail_jpeg)
    # the store only grows: writing the first again leaves it as it was
    before = store.read_bytes()
    save_exemplars(first, tmp_path / "c.safetensors", thumbnails=store)
    assert store.read_bytes() == before


def test_a_store_moved_replaced_or_of_other_data_is_refused_in_words(built, tmp_path):
    first, _, data = built
    store = tmp_path / "thumbnails.safetensors"
    path = save_exemplars(first, tmp_path / "exemplars.safetensors", thumbnails=store)
    store.rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(ConceptsError, match="thumbnail store .* cannot be read"):
        load_exemplars(path)
    # a store of the same images whose JPEGs are other bytes: the index's checksum of them differs
    (tmp_path / "elsewhere.safetensors").rename(store)
    raw = store.read_bytes()
    tensors = load_tensors(raw)
    tensors["jpeg"][-1] ^= 0xFF
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(json.loads(raw[8:8 + length])["__metadata__"][thumbnails.HEADER_KEY])
    header["sha256"] = checksum(tensors)
    store.write_bytes(save_tensors(tensors, {thumbnails.HEADER_KEY: json.dumps(header)}))
    with pytest.raises(ConceptsError, match="not the ones it was written with"):
        load_exemplars(path)
    # the same pictures under other ids, or at another size: another data set for the store
    renamed = Dataset(name=data.name, ids=tuple(f"other-{i}" for i in range(12)), labels=data.labels,
                      classes=data.classes, source=data.image)
    other = build_exemplars(random_dictionary(0), [(torch.arange(12), torch.rand(12, 4, 6))], renamed, grid=(2, 2))
    with pytest.raises(ConceptsError, match="data set changed since the store was written"):
        save_exemplars(other, tmp_path / "other.safetensors", thumbnails=store)
    small = build_exemplars(random_dictionary(0), [(torch.arange(12), torch.rand(12, 4, 6))], synthetic_data(),
                            grid=(2, 2), thumbnail=16)
    with pytest.raises(ConceptsError, match="16 px thumbnails of synthetic: give a store of their own"):
        save_exemplars(small, tmp_path / "small.safetensors", thumbnails=store)


def test_an_index_whose_store_reference_is_missing_is_refused_in_words(built, tmp_path):
    path = save_exemplars(built[0], tmp_path / "exemplars.safetensors", thumbnails=tmp_path / "t.safetensors")
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(json.loads(raw[8:8 + length])["__metadata__"][HEADER_KEY])
    del header["thumbnails"]["file"]
    path.write_bytes(save_tensors(load_tensors(raw), {HEADER_KEY: json.dumps(header)}))
    with pytest.raises(ConceptsError, match="its thumbnails' store is not said"):
        load_exemplars(path)


def test_the_bundled_indexes_share_one_store_and_show_their_exemplars():
    from vitviz.concepts.analysis.exemplars import index_in

    exemplars = index_in("vit-cifar10-last")
    first = exemplars.of(int(exemplars.frequency.argmax()))[0]
    assert first.image.size == (32, 32) and first.id.startswith("test/")
