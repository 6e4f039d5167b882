"""A store of a data set's thumbnails that several exemplar indexes share.

    save_exemplars(exemplars, folder, thumbnails="checkpoints/concepts/thumbnails-cifar10.safetensors")
    offsets, jpeg = gather(store_path, images, ids, data="cifar10", size=64)   # what `load_exemplars` does

An exemplar index keeps a thumbnail of every image it references (`exemplars.py`), so it shows its exemplars
without the data set. Indexes over the same data set reference mostly the same images: the 33 bundled ones over
CIFAR-10's test split held 19.7 MB of thumbnails of 1,448 distinct images (1.3 MB once each). An index
written with a store keeps its images' indices, ids and labels, and leaves the JPEGs to the store, which holds each
image's once; the index's header says where the store is (relative to the index's folder) and the SHA-256 of the
thumbnails it takes from it, so what `load_exemplars` returns is the index as it was built, bit for bit, or a
refusal in words.

The file, one safetensors file:

    tensors  images u int64 (data set indices, ascending), offsets u+1 int64, jpeg uint8 (the u JPEGs, concatenated)
    __metadata__ {"vitviz_thumbnails": JSON}: format "vitviz-thumbnails", version, data (the data set's name),
             thumbnail_size (px), ids (the u images' ids in it), sha256 (of the tensors)

A store only grows: merging an index's thumbnails adds the images it lacks and keeps those it has (the same image
at the same size), so every index that referenced it before still finds its images. Written atomically.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor

from ...files import write_atomic
from ..files.own import checked_format, checksum, header_json
from ..kinds.dictionary import ConceptsError

FORMAT, VERSION = "vitviz-thumbnails", 1
HEADER_KEY = "vitviz_thumbnails"


class Store:
    """A thumbnail store read from its file: `images` (u,) ascending, `offsets` (u+1,), `jpeg`, and its header's
    `data`, `size` and `ids`."""

    def __init__(self, images: Tensor, offsets: Tensor, jpeg: Tensor, *, data: str, size: int, ids: tuple[str, ...]):
        self.images, self.offsets, self.jpeg = images, offsets, jpeg
        self.data, self.size, self.ids = data, size, ids

    def select(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """(offsets u'+1, jpeg) of data set images `images` (ascending, each in the store), cut as an index's."""
        where = torch.searchsorted(self.images, images)
        starts, ends = self.offsets[where], self.offsets[where + 1]
        lengths = ends - starts
        pieces = [self.jpeg[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
        jpeg = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.uint8)
        return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), jpeg


def same_data(store: Store, data: str, size: int) -> bool:
    """Whether `store` holds `size` px thumbnails of data set `data`: the same size, and the same file name (one
    data set opened from two places, '../shared/data/cifar10_jpeg.npz' and '/work/shared/data/cifar10_jpeg.npz',
    is one; each image's id is checked too)."""
    return store.size == size and Path(store.data).name == Path(data).name


def read(path: str | Path) -> Store:
    """The store in `path`, or a ConceptsError that says what is wrong with it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConceptsError(f"The thumbnail store {path} cannot be read ({e.strerror}).") from None
    try:
        tensors = load_tensors(raw)
    except SafetensorError as e:
        raise ConceptsError(f"{path} cannot be read as a thumbnail store ({str(e).splitlines()[0]}).") from None
    header = checked_format(header_json(raw, path, key=HEADER_KEY, what="thumbnail store"), path, format=FORMAT,
                            version=VERSION, what="store")
    if header.get("sha256") != checksum(tensors):
        raise ConceptsError(f"{path} is damaged: its tensors are not the ones it was written with.")
    try:
        store = Store(tensors["images"], tensors["offsets"], tensors["jpeg"], data=str(header["data"]),
                      size=int(header["thumbnail_size"]), ids=tuple(str(i) for i in header["ids"]))
        u = len(store.images)
        sound = (store.images.dtype == store.offsets.dtype == torch.int64 and store.jpeg.dtype == torch.uint8
                 and len(store.offsets) == u + 1 and len(store.ids) == u
                 and bool((store.images.diff() > 0).all()) and int(store.offsets[0]) == 0
                 and int(store.offsets[-1]) == len(store.jpeg) and bool((store.offsets.diff() > 0).all()))
    except (KeyError, TypeError, ValueError) as e:
        raise ConceptsError(f"{path} is not a sound thumbnail store ({type(e).__name__}: {e}).") from None
    if not sound:
        raise ConceptsError(f"{path} is not a sound thumbnail store: its images, offsets, JPEG bytes and ids do not "
                            f"fit together.")
    return store


def merge(path: str | Path, images: Tensor, offsets: Tensor, jpeg: Tensor, *, data: str, size: int,
          ids: tuple[str, ...]) -> None:
    """The thumbnails of data set images `images` (ascending; cut by `offsets`, ids `ids`) added to the store in
    `path` (made if there is none) where it lacks them; refused in words for a store of another data set or size,
    or where an image's id differs from the store's."""
    path = Path(path)
    if path.is_file():
        store = read(path)
        if not same_data(store, data, size):
            raise ConceptsError(f"{path} holds {store.size} px thumbnails of {store.data}; these are {size} px "
                                f"thumbnails of {data}: give a store of their own.")
    else:
        store = Store(torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                      torch.zeros(0, dtype=torch.uint8), data=data, size=size, ids=())
    by_image = dict(zip(store.images.tolist(), store.ids))
    for image, id_ in zip(images.tolist(), ids):
        if by_image.get(image, id_) != id_:
            raise ConceptsError(f"Image {image} of {data} is {id_} here but {by_image[image]} in {path}: the data "
                                f"set changed since the store was written; give a store of its own.")
    new = ~torch.isin(images, store.images)
    if not bool(new.any()) and path.is_file():
        return
    # each thumbnail as bytes, the store's and the new ones, in image order
    pieces = {int(i): store.jpeg[s:e] for i, s, e in zip(store.images.tolist(), store.offsets[:-1].tolist(),
                                                           store.offsets[1:].tolist())}
    id_of = dict(by_image)
    for i, s, e, id_ in zip(images.tolist(), offsets[:-1].tolist(), offsets[1:].tolist(), ids):
        if i not in pieces:
            pieces[i], id_of[i] = jpeg[s:e], id_
    order = sorted(pieces)
    lengths = np.array([len(pieces[i]) for i in order], dtype=np.int64)
    tensors = {"images": torch.tensor(order, dtype=torch.int64),
               "offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
               "jpeg": torch.cat([pieces[i] for i in order]) if order else torch.zeros(0, dtype=torch.uint8)}
    header = {"format": FORMAT, "version": VERSION, "data": data, "thumbnail_size": size,
              "ids": [id_of[i] for i in order], "sha256": checksum(tensors)}
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))


def gather(path: Path, images: Tensor, ids: tuple[str, ...], *, data: str, size: int) -> tuple[Tensor, Tensor]:
    """(offsets, jpeg) of data set images `images` (ascending, ids `ids`) from the store in `path`, as an index
    that kept them itself holds them; refused in words where the store is of another data set or size, or lacks
    an image."""
    store = read(path)
    if not same_data(store, data, size):
        raise ConceptsError(f"{path} holds {store.size} px thumbnails of {store.data}, not the {size} px thumbnails "
                            f"of {data} this index needs.")
    where = torch.searchsorted(store.images, images).clamp(max=max(len(store.images) - 1, 0))
    found = store.images[where] == images if len(store.images) else torch.zeros_like(images, dtype=torch.bool)
    if not bool(found.all()):
        missing = images[~found][:3].tolist()
        raise ConceptsError(f"{path} has no thumbnail of image(s) {missing} of {data}: it is not the store this "
                            f"index was written with.")
    if [store.ids[i] for i in where.tolist()] != list(ids):
        raise ConceptsError(f"{path} names its images otherwise than this index (another version of {data}).")
    return store.select(images)


def taken_by(index: Path, header: dict, images: Tensor) -> dict[str, Tensor]:
    """The thumbnail_offsets and thumbnail_jpeg that the exemplar index in file `index` (its `header`, its
    `images`) left to a store, taken from the store its header names and checked to be the ones it was written
    with."""
    try:
        reference = header["thumbnails"]
        offsets, jpeg = gather(index.parent / reference["file"], images, tuple(str(i) for i in header["ids"]),
                               data=str(header["data"]), size=int(header["thumbnail_size"]))
        written = reference["sha256"]
    except (KeyError, TypeError, ValueError) as e:
        raise ConceptsError(f"{index} is not a sound exemplar index: its thumbnails' store is not said "
                            f"({type(e).__name__}: {e}). Build it again.") from None
    taken = {"thumbnail_offsets": offsets, "thumbnail_jpeg": jpeg}
    if checksum(taken) != written:
        raise ConceptsError(f"The thumbnails of {index} in {reference['file']} are not the ones it was written with "
                            f"(the store was replaced): build the exemplar index again.")
    return taken
