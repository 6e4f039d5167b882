"""Each concept's top images from a data set, with where in them it fires: the exemplar index of a dictionary.

    exemplars = exemplars_of(dictionary, cached, data, top=8)   # a cached layer of `data` (`activations/cache.py`)
    save_exemplars(exemplars, "dictionaries/vit-cifar10")        # beside concepts.safetensors
    exemplars = load_exemplars("dictionaries/vit-cifar10", dictionary=dictionary)
    exemplars = index_in("vit-cifar10-last")                     # the one beside a dictionary (bundled or a folder)
    for image, cells, value, index, id, label in exemplars.of(17): ...   # concept 17's top images and maps

The ranking. With z_{g,c} the code of concept c at grid token g of an image (`Dictionary.encode` of the block's
grid tokens: the class tokens left out, or of the cells of an `Alignment` for a dictionary across models), an
image's value for c is its largest code over the grid,

    v_c(image) = max_g z_{g,c}

and concept c's exemplars are the `top` images of largest v_c among those it fires on (v_c > 0), the larger
value first and, between equal values, the smaller data set index first. A concept that fires on fewer images
has its remaining places empty: image -1, value 0, a map of zeros. Each exemplar keeps its map, z_{g,c} over the
grid (float16), for drawing where it fires. Every image is streamed once; one streamed twice would be ranked
twice.

How often it fires: over the T grid tokens (cells) of every image streamed,

    frequency_c = #{(image, g) : z_{g,c} > 0} / T

Memory. `TopImages` streams batches of codes and keeps, at every point, only n x top candidates per concept
(value, image, map): each batch's values are ranked with the kept ones (one stable sort of top + b per concept)
and all but the top are dropped, so the index holds n·top·(gh·gw + 2) numbers and n counters however many
images pass, O(n·top) rather than O(images).

The file, `exemplars.safetensors` beside the dictionary's (`FILE`), one safetensors file:

    tensors  images n top int64, values n top float32, maps n top gh gw float16, frequency n float64,
             thumbnail_images u int64 (the data set indices of the images referenced, each once, ascending),
             labels u int64 (their classes, -1 where the data has none), thumbnail_offsets u+1 int64,
             thumbnail_jpeg (the u JPEGs, concatenated)
    __metadata__ {"vitviz_exemplars": JSON}: format "vitviz-exemplars", version, n_concepts, top, grid, tokens
             (T), data (the data set's name), ids (the u images' ids in it), classes, model (whose images),
             origin (the dictionary's), dictionary_sha256 (its tensors', as `files.own.checksum`), thumbnail_size (px),
             sha256 (of the tensors above)

The thumbnails are the data set's own images (`Dataset.image`), reduced to at most `thumbnail` pixels on the
longer side (64; CIFAR-10's 32 x 32 kept at their size) and stored as JPEG, so the index shows its exemplars
without the data set, and `ids` finds the full images in it. Indexes over one data set may leave their JPEGs to a
store they share (`thumbnails.py`): then thumbnail_offsets and thumbnail_jpeg are not in the file, and its header
says where the store is and the SHA-256 of what it takes from it ("thumbnails": {"file", "sha256"}). Written
through a temporary file renamed into place; a file damaged or inconsistent, or built for another dictionary, is
refused in words.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor

from ...data import Dataset
from ...files import safe_name, write_atomic
from ...image import ImageError, read_image
from ..activations.align import Alignment
from ..activations.cache import Cached
from ..files import folder_of
from ..files.own import checked_format, checksum, header_json
from ..kinds.dictionary import ConceptsError, Dictionary, Origin
from . import thumbnails as store

FORMAT, VERSION = "vitviz-exemplars", 1
FILE = "exemplars.safetensors"    # the file's name in a dictionary's folder
HEADER_KEY = "vitviz_exemplars"   # its key in the safetensors header's __metadata__
TOP = 8                           # images kept per concept
THUMBNAIL = 64                    # px, the longer side of a thumbnail at most
JPEG_QUALITY = 90                 # a 32 x 32 CIFAR image: about 1 KB, 42 dB PSNR against the decoded original
                                  # (the bundled indexes use 60: about 0.55 KB, to keep the bundle small)
BATCH_IMAGES = 256                # images encoded at once by `exemplars_of`
Grid = tuple[int, int]


class TopImages:
    """The streaming state of an exemplar index: per concept its `top` best images so far (value, image, map on
    the `grid`) and how many grid tokens it fired on, updated batch by batch by `add` (module docstring: the
    ranking, its tie rule and the memory bound). Kept on `device` (where the codes are computed)."""

    def __init__(self, n_concepts: int, *, grid: Grid, top: int = TOP, device: str | torch.device = "cpu"):
        if not isinstance(top, int) or top < 1:
            raise ConceptsError(f"top must be a whole number of at least 1, not {top!r}.")
        self.grid = tuple(grid)
        cells = self.grid[0] * self.grid[1]
        self.values = torch.zeros(n_concepts, top, device=device)
        self.images = torch.full((n_concepts, top), -1, dtype=torch.int64, device=device)
        self.maps = torch.zeros(n_concepts, top, cells, device=device)
        self.fired = torch.zeros(n_concepts, dtype=torch.int64, device=device)
        self.tokens = 0   # grid tokens (cells) streamed: the frequencies' denominator

    @property
    def nbytes(self) -> int:
        """The bytes the state holds: n·top·(gh·gw + 2) numbers and n counters, whatever was streamed."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.images, self.maps, self.fired))

    @property
    def frequency(self) -> Tensor:
        """n float64: the share of the grid tokens streamed that each concept fired on (0 before any)."""
        return self.fired.double() / max(self.tokens, 1)

    def add(self, images: Tensor, codes: Tensor) -> None:
        """One batch: `images` (b,) the data set indices of b images, `codes` (b, gh·gw, n) their codes at each
        grid token; the kept candidates of every concept become the best `top` of the kept and the new."""
        n, top, cells = self.maps.shape
        if codes.ndim != 3 or tuple(codes.shape[1:]) != (cells, n) or tuple(images.shape) != tuple(codes.shape[:1]):
            raise ConceptsError(f"An exemplar index of {n} concepts on a {self.grid[0]} x {self.grid[1]} grid takes "
                                f"codes (images, {cells}, {n}) with one image index each, not codes "
                                f"{tuple(codes.shape)} for image indices {tuple(images.shape)}.")
        if len(images) == 0:
            return
        codes = codes.detach().to(device=self.maps.device, dtype=torch.float32)
        images = images.to(device=self.images.device, dtype=torch.int64)
        self.fired += (codes > 0).sum((0, 1))
        self.tokens += codes.shape[0] * cells
        by_concept = codes.permute(2, 0, 1)   # n b cells, a view
        values = torch.cat([self.values, by_concept.amax(2)], 1)          # n (top + b): the kept, then the new
        owners = torch.cat([self.images, images.expand(n, -1)], 1)
        # The larger value first, the smaller image index between equals: candidates sorted by image, then
        # stably by value (torch.topk leaves the order of equal values unspecified).
        by_image = owners.argsort(dim=1, stable=True)
        ranked = by_image.gather(1, values.gather(1, by_image).argsort(dim=1, descending=True, stable=True)[:, :top])
        rows = torch.arange(n, device=ranked.device)[:, None]
        maps = torch.where((ranked < top)[..., None], self.maps[rows, ranked.clamp(max=top - 1)],
                           by_concept[rows, (ranked - top).clamp(min=0)])
        values = values.gather(1, ranked)
        fires = values > 0
        self.values = torch.where(fires, values, 0.0)
        self.images = torch.where(fires, owners.gather(1, ranked), -1)
        self.maps = torch.where(fires[..., None], maps, 0.0)


class Exemplar(NamedTuple):
    """One of a concept's top images: its thumbnail, the concept's code at each grid token (gh gw), its value (the
    largest of them), and where it is in the data set (index, id, class name or None)."""
    image: Image.Image
    map: np.ndarray
    value: float
    index: int
    id: str
    label: str | None


@dataclass(frozen=True, eq=False)
class Exemplars:
    """A dictionary's exemplar index over a data set (module docstring): per concept its top images, their values
    and maps, how often it fires, and a thumbnail of each image referenced."""
    images: Tensor              # n top int64: data set indices, -1 where the concept fires on fewer images
    values: Tensor              # n top float32: each image's largest code of the concept (the ranking key)
    maps: Tensor                # n top gh gw float16: the concept's code at each grid token (cell)
    frequency: Tensor           # n float64: the share of the grid tokens it fires on
    tokens: int                 # the grid tokens (cells) evaluated: the frequencies' denominator
    data: str                   # the data set's name (as `open_data` was given it)
    ids: tuple[str, ...]        # u: the ids in the data set of the images referenced
    classes: tuple[str, ...] | None
    labels: Tensor              # u int64: their classes, -1 where the data has no labels
    thumbnail_images: Tensor    # u int64: their data set indices, ascending
    thumbnail_offsets: Tensor   # u+1 int64: thumbnail i is thumbnail_jpeg[offsets[i]:offsets[i + 1]]
    thumbnail_jpeg: Tensor      # uint8: the JPEGs, concatenated
    thumbnail_size: int         # px, the longer side of a thumbnail at most
    model: str | None           # the model whose tokens were encoded
    origin: Origin              # the dictionary's
    dictionary_sha256: str      # its tensors' SHA-256 (`files.own.checksum`): which dictionary the index belongs to

    @property
    def n_concepts(self) -> int:
        return self.images.shape[0]

    @property
    def top(self) -> int:
        """Images kept per concept."""
        return self.images.shape[1]

    @property
    def grid(self) -> Grid:
        """The maps' grid (gh, gw): the model's own, or an alignment's cells."""
        return tuple(self.maps.shape[2:])

    def thumbnail(self, image: int) -> Image.Image:
        """The thumbnail of data set image `image` (one of `images`), as an RGB PIL image."""
        where = int(torch.searchsorted(self.thumbnail_images, image))
        if where == len(self.thumbnail_images) or int(self.thumbnail_images[where]) != image:
            raise ConceptsError(f"Image {image} of {self.data} is no concept's exemplar here: this index holds "
                                f"thumbnails of its {len(self.thumbnail_images)} exemplar images only.")
        start, end = (int(v) for v in self.thumbnail_offsets[where:where + 2])
        return read_image(self.thumbnail_jpeg[start:end].numpy().tobytes())

    def of(self, concept: int) -> list[Exemplar]:
        """Concept `concept`'s top images, best first: (thumbnail, map, value, index, id, label) each."""
        if not isinstance(concept, int) or not 0 <= concept < self.n_concepts:
            raise ConceptsError(f"This dictionary has concepts 0 to {self.n_concepts - 1}; there is no {concept!r}.")
        out = []
        for image, value, cells in zip(self.images[concept].tolist(), self.values[concept].tolist(),
                                       self.maps[concept].float().numpy()):
            if image < 0:
                break   # the places after the last image it fires on are empty
            where = int(torch.searchsorted(self.thumbnail_images, image))
            label = int(self.labels[where])
            out.append(Exemplar(self.thumbnail(image), cells, value, image, self.ids[where],
                                self.classes[label] if label >= 0 and self.classes else None))
        return out


def build_exemplars(dictionary: Dictionary, codes: Iterable[tuple[Tensor, Tensor]], data: Dataset, *, grid: Grid,
                    top: int = TOP, thumbnail: int = THUMBNAIL, quality: int = JPEG_QUALITY,
                    model: str | None = None) -> Exemplars:
    """The exemplar index of `dictionary` from `codes`, batches of (image indices into `data` (b,), codes
    (b, gh·gw, n) at each token of the `grid`), streamed through `TopImages` on the codes' device; the thumbnails
    from `data`. `model` names the model whose tokens were encoded."""
    if not isinstance(thumbnail, int) or thumbnail < 1:
        raise ConceptsError(f"thumbnail must be a whole number of pixels, at least 1, not {thumbnail!r}.")
    index = None
    for images, batch in codes:
        if index is None:
            index = TopImages(dictionary.n_concepts, grid=grid, top=top, device=batch.device)
        index.add(images, batch)
    if index is None or index.tokens == 0:
        raise ConceptsError("There were no images to build the exemplar index from.")
    referenced = index.images[index.images >= 0].unique().cpu()   # ascending, each once
    if len(referenced) and int(referenced[-1]) >= len(data):
        raise ConceptsError(f"The codes name image {int(referenced[-1])}, but {data.name} has {len(data)} images: "
                            f"give the data set the activations were read from.")
    jpeg, offsets = _thumbnails(data, referenced.tolist(), size=thumbnail, quality=quality)
    labels = torch.tensor([data.labels[i] for i in referenced.tolist()] if data.labels else [-1] * len(referenced),
                          dtype=torch.int64)
    maps = index.maps.reshape(*index.maps.shape[:2], *index.grid).half().cpu()
    state = {name: value.detach().cpu() for name, value in dictionary.state_dict().items()}
    return Exemplars(images=index.images.cpu(), values=index.values.cpu(), maps=maps, frequency=index.frequency.cpu(),
                     tokens=index.tokens, data=data.name, ids=tuple(data.ids[i] for i in referenced.tolist()),
                     classes=data.classes, labels=labels, thumbnail_images=referenced, thumbnail_offsets=offsets,
                     thumbnail_jpeg=jpeg, thumbnail_size=thumbnail, model=model, origin=dictionary.origin,
                     dictionary_sha256=checksum(state))


def exemplars_of(dictionary: Dictionary, cached: Cached, data: Dataset, *, top: int = TOP,
                 alignment: Alignment | None = None, model_index: int | None = None,
                 batch_images: int = BATCH_IMAGES, thumbnail: int = THUMBNAIL,
                 quality: int = JPEG_QUALITY) -> Exemplars:
    """The exemplar index of `dictionary` over a cached layer of `data`: its grid tokens (the class tokens left
    out), shard by shard, encoded `batch_images` images at a time. For a dictionary across models (pass the
    model's own, `Across.dictionary(model)`) the tokens are first resampled onto the `alignment`'s cells as
    model `model_index` of it (needed where it aligns several), and the maps are on its grid."""
    layer = cached.layer
    if layer["tokens"] == "cls":
        raise ConceptsError("An exemplar index shows where each concept fires on the grid; a layer of class tokens "
                            "alone has no grid: cache its 'patch' or 'patch+cls' tokens.")
    if not isinstance(batch_images, int) or batch_images < 1:
        raise ConceptsError(f"batch_images must be a whole number of at least 1, not {batch_images!r}.")
    grid, prefix = tuple(layer["grid"]), layer["prefix"]
    if alignment is not None:
        if model_index is None and len(alignment.weights) == 1:
            model_index = 0
        if not isinstance(model_index, int) or not 0 <= model_index < len(alignment.weights):
            raise ConceptsError(f"The alignment is of {len(alignment.weights)} models: say which of them (model_index "
                                f"0 to {len(alignment.weights) - 1}) this layer is, not {model_index!r}.")
        if alignment.weights[model_index].shape[1] != grid[0] * grid[1]:
            raise ConceptsError(f"Model {model_index} of the alignment has {alignment.weights[model_index].shape[1]} "
                                f"grid tokens; this layer has {grid[0]} x {grid[1]}: pass the model's own layer.")
    elif model_index is not None:
        raise ConceptsError("model_index says which of an alignment's models a layer is; without an alignment the "
                            "layer's own grid is used.")

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for tokens, images, _ in cached.shard_grids():
            for start in range(0, len(images), batch_images):
                x = tokens[start:start + batch_images, prefix:]
                with torch.no_grad():
                    codes = dictionary.encode(x if alignment is None else alignment.resample(model_index, x))
                yield images[start:start + batch_images], codes

    return build_exemplars(dictionary, batches(), data, grid=alignment.grid if alignment else grid, top=top,
                           thumbnail=thumbnail, quality=quality, model=layer["model"]["name"])


def _thumbnails(data: Dataset, indices: list[int], *, size: int, quality: int) -> tuple[Tensor, Tensor]:
    """(the JPEGs concatenated uint8, u+1 offsets int64) of data set images `indices`, each reduced to at most
    `size` px on its longer side (never enlarged)."""
    jpegs = []
    for i in indices:
        try:
            image = data.image(i)
        except ImageError as e:
            raise ConceptsError(f"Image {i} of {data.name} ({data.ids[i]}) no longer decodes ({e}): the data set "
                                f"changed since its activations were cached; cache them again.") from None
        image.thumbnail((size, size))   # in place, keeping the aspect ratio; a smaller image is left as it is
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        jpegs.append(np.frombuffer(buffer.getvalue(), dtype=np.uint8))
    offsets = np.concatenate([[0], np.cumsum([len(j) for j in jpegs], dtype=np.int64)]).astype(np.int64)
    jpeg = np.concatenate(jpegs) if jpegs else np.zeros(0, np.uint8)
    return torch.from_numpy(jpeg), torch.from_numpy(offsets)


# ---- the file ------------------------------------------------------------------------------------------------

TENSORS = ("images", "values", "maps", "frequency", "labels", "thumbnail_images", "thumbnail_offsets",
           "thumbnail_jpeg")
SHARED = ("thumbnail_offsets", "thumbnail_jpeg")   # what a thumbnail store holds in an index's place


def file_name(position: int | None = None, model: str | None = None) -> str:
    """The exemplar index's file in a dictionary's folder: exemplars.safetensors, or for the model at `position`
    of a dictionary across models, one per model named like its dictionary's file ('exemplars-0-vit-cifar10...')."""
    return FILE if position is None else f"exemplars-{position}-{safe_name(model)}.safetensors"


def save_exemplars(exemplars: Exemplars, path: str | Path, *, thumbnails: str | Path | None = None) -> Path:
    """`exemplars` written to `path` (a .safetensors file, or a dictionary's folder to hold exemplars.safetensors),
    atomically; with `thumbnails`, a thumbnail store's file (`thumbnails.py`; made if there is none), its JPEGs
    merged into the store and left out of the index. -> the file written."""
    path = Path(path)
    path = path if path.suffix == ".safetensors" else path / FILE
    tensors = {name: getattr(exemplars, name).contiguous() for name in TENSORS}
    header = {"format": FORMAT, "version": VERSION, "n_concepts": exemplars.n_concepts, "top": exemplars.top,
              "grid": list(exemplars.grid), "tokens": exemplars.tokens, "data": exemplars.data,
              "ids": list(exemplars.ids), "classes": list(exemplars.classes) if exemplars.classes else None,
              "thumbnail_size": exemplars.thumbnail_size, "model": exemplars.model,
              "origin": exemplars.origin.to_dict(), "dictionary_sha256": exemplars.dictionary_sha256}
    if thumbnails is not None:
        store.merge(thumbnails, exemplars.thumbnail_images, exemplars.thumbnail_offsets, exemplars.thumbnail_jpeg,
                    data=exemplars.data, size=exemplars.thumbnail_size, ids=exemplars.ids)
        shared = {name: tensors.pop(name) for name in SHARED}
        where = Path(os.path.relpath(Path(thumbnails).resolve(), path.parent.resolve())).as_posix()
        header["thumbnails"] = {"file": where, "sha256": checksum(shared)}
    header["sha256"] = checksum(tensors)
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))
    return path


def load_exemplars(path: str | Path, *, dictionary: Dictionary | None = None) -> Exemplars:
    """The exemplar index in `path` (a file, or a folder holding exemplars.safetensors), or a ConceptsError that
    says what is wrong with it; with `dictionary`, refused unless it was built from that dictionary's weights."""
    path = Path(path)
    path = path / FILE if path.is_dir() else path
    try:
        raw = path.read_bytes()
        tensors = load_tensors(raw)
    except (OSError, SafetensorError) as e:
        raise ConceptsError(f"{path} cannot be read as an exemplar index ({str(e).splitlines()[0]}).") from None
    header = _header(raw, path)
    if header.get("sha256") != checksum(tensors):
        raise ConceptsError(f"{path} is damaged: its tensors are not the ones it was written with (their SHA-256 "
                            f"differs from the one in its header); build the exemplar index again.")
    if "thumbnails" in header:
        tensors.update(store.taken_by(path, header, tensors["thumbnail_images"]))
    try:
        exemplars = Exemplars(**{name: tensors[name] for name in TENSORS}, tokens=int(header["tokens"]),
                              data=str(header["data"]), ids=tuple(str(i) for i in header["ids"]),
                              classes=tuple(header["classes"]) if header["classes"] else None,
                              thumbnail_size=int(header["thumbnail_size"]), model=header["model"],
                              origin=Origin.from_dict(header["origin"]),
                              dictionary_sha256=str(header["dictionary_sha256"]))
        problem = _inconsistency(exemplars, header)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as e:
        problem = f"its header and tensors do not fit together ({type(e).__name__}: {e})"
    if problem:
        raise ConceptsError(f"{path} is not a sound exemplar index: {problem}. Build it again.")
    if dictionary is not None:
        state = {name: value.detach().cpu() for name, value in dictionary.state_dict().items()}
        if exemplars.dictionary_sha256 != checksum(state):
            raise ConceptsError(f"{path} was built for another dictionary (other weights than this one of "
                                f"{dictionary.origin.describe()}, {dictionary.n_concepts} concepts): build the "
                                f"exemplar index of this dictionary again.")
    return exemplars


def index_in(source: str | Path, *, dictionary: Dictionary | None = None, model: str | None = None) -> Exemplars:
    """The exemplar index beside a dictionary: in the folder of `source` (a bundled dictionary's name, or a
    dictionary's folder or a file in it), among `file_name`'s files (one, or one per model of a dictionary across
    models), the one built from `dictionary`'s weights where it is given, else the one of `model` (to be said where
    the folder holds several). A ConceptsError says why there is none."""
    text = str(source).strip()
    folder = folder_of(text)
    if folder is None:
        raise ConceptsError(f"{text} is no dictionary's folder here: an exemplar index is read from beside a "
                            f"dictionary's files (a bundled dictionary's name, or a folder; one from the Hub has "
                            f"none).")
    files = sorted(folder.glob(f"{Path(FILE).stem}*.safetensors"))
    if not files:
        raise ConceptsError(f"{text} has no exemplar index ({FILE} in its folder) yet: `python -m vitviz concepts "
                            f"exemplars {folder} --data DATA` builds one.")
    refused, found = [], []
    for file in files:
        try:
            index = load_exemplars(file, dictionary=dictionary)
        except ConceptsError as e:
            refused.append(str(e))
            continue
        if dictionary is not None:
            return index
        if model is None or index.model == model:
            found.append(index)
    if len(found) > 1:
        raise ConceptsError(f"{folder} holds an exemplar index for each of {', '.join(str(e.model) for e in found)}: "
                            f"say which model's.")
    if found:
        return found[0]
    if len(refused) == 1 and len(files) == 1:
        raise ConceptsError(refused[0])
    if dictionary is None and model is None:
        raise ConceptsError(f"None of the {len(files)} exemplar indexes in {folder} can be read: {refused[0]}")
    whose = f"{dictionary.origin.model}'s dictionary" if dictionary is not None else model
    raise ConceptsError(f"None of the {len(files)} exemplar indexes in {folder} was built from {whose}.")


def _inconsistency(exemplars: Exemplars, header: dict) -> str | None:
    """What is inconsistent in an exemplar index read from a file, in words; None when nothing is."""
    e = exemplars
    n, top, gh, gw = int(header["n_concepts"]), int(header["top"]), *(int(v) for v in header["grid"])
    u = len(e.thumbnail_images)
    shapes = {"images": ((n, top), torch.int64), "values": ((n, top), torch.float32),
              "maps": ((n, top, gh, gw), torch.float16), "frequency": ((n,), torch.float64),
              "labels": ((u,), torch.int64), "thumbnail_images": ((u,), torch.int64),
              "thumbnail_offsets": ((u + 1,), torch.int64), "thumbnail_jpeg": ((len(e.thumbnail_jpeg),), torch.uint8)}
    for name, (shape, dtype) in shapes.items():
        value = getattr(e, name)
        if tuple(value.shape) != shape or value.dtype != dtype:
            return f"{name} is {value.dtype} {tuple(value.shape)} where its header says {dtype} {shape}"
    offsets, fires = e.thumbnail_offsets, e.images >= 0
    checks = [
        (len(e.ids) == u, f"it names {len(e.ids)} images for {u} thumbnails"),
        (bool((e.thumbnail_images[1:] > e.thumbnail_images[:-1]).all()) and (u == 0 or int(e.thumbnail_images[0]) >= 0),
         "its thumbnails' image indices are not distinct and ascending"),
        (int(offsets[0]) == 0 and int(offsets[-1]) == len(e.thumbnail_jpeg) and bool((offsets.diff() > 0).all()),
         "its thumbnails' offsets do not cut the JPEG bytes into pieces"),
        (bool(torch.isin(e.images[fires], e.thumbnail_images).all()), "an exemplar has no thumbnail"),
        (bool(e.values.isfinite().all() and e.maps.isfinite().all()), "it holds NaN or infinite codes"),
        (bool((e.values[fires] > 0).all() and (e.values[~fires] == 0).all() and (e.images[~fires] == -1).all()),
         "its values do not match its images (an exemplar's value is above 0, an empty place's image -1 and value 0)"),
        (bool(((e.frequency >= 0) & (e.frequency <= 1)).all()) and e.tokens > 0, "its frequencies are not shares"),
        (bool(((e.labels >= -1) & (e.labels < len(e.classes or ()))).all()), "a label is outside its classes"),
    ]
    return next((problem for sound, problem in checks if not sound), None)


def _header(raw: bytes, path: Path) -> dict:
    """The vitviz JSON in a safetensors file's header, checked for its format and version."""
    return checked_format(header_json(raw, path, key=HEADER_KEY, what="exemplar index"), path, format=FORMAT,
                          version=VERSION, what="index")
