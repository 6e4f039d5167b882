"""The Concepts tab's GPU work: each model's dictionary bound to it, the photo's concepts read through it with
their maps, top images, matches and what removing each does, returned as plain data (`Concepts`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr
import numpy as np
import torch
from PIL import Image

from ... import catalog, hub
from ...gate import MODEL_GATE
from ...session import ModelRun
from .boundary import gpu, models_of

if TYPE_CHECKING:   # vitviz.concepts is imported where it is used: it brings scipy, a second of the server's start
    from ...concepts.analysis.exemplars import Exemplars
    from ...concepts.analysis.match import Matches
    from ...concepts.analysis.names import ConceptName
    from ...concepts.analysis.photo import PhotoConcepts, Reader

# a traced forward of each model and one forward of C + 1 rows (each shown concept removed), and a dictionary named
# by Hub id downloaded the first time
CONCEPTS_S = 30
# local folders of concept dictionaries the server owner allows (VITVIZ_DICTIONARIES, separated as PATH is), with
# every dictionary below them; visitors name the bundled and catalog ones, or Hub ids
LOCAL_DICTIONARIES: set[str] = set(filter(None, os.environ.get("VITVIZ_DICTIONARIES", "").split(os.pathsep)))


Region = tuple[float, float, float, float]   # (y0, x0, y1, x1): a map's extent, in fractions of its photo's h and w


def dictionary_source(text) -> str:
    """What a person typed in a dictionary box -> the source `concepts.load` reads ('' for none): a bundled or
    catalog dictionary, a Hub id (`owner/name[@revision]`), or a path below a folder the server owner allows
    (`LOCAL_DICTIONARIES`); any other path on the server is refused in words."""
    text = (text or "").strip()
    if not text or text in catalog.BUNDLED_DICTIONARIES or text in catalog.DICTIONARIES:
        return text
    path = Path(text).expanduser()
    if (path.exists() or text.startswith(("/", ".", "~"))) and not allowed_path(path):
        raise gr.Error(f"{text} is a path on the server, and the app reads local dictionaries only below the folders "
                       f"its owner allows (VITVIZ_DICTIONARIES). Name a bundled dictionary "
                       f"({', '.join(catalog.BUNDLED_DICTIONARIES)}) or a Hub id (owner/name).")
    return text


def allowed_path(path: Path) -> bool:
    """Whether `path` (symbolic links resolved) is one of `LOCAL_DICTIONARIES` or below one."""
    resolved = path.expanduser().resolve()
    return any(resolved.is_relative_to(Path(folder).expanduser().resolve()) for folder in LOCAL_DICTIONARIES)


def dictionary_folder(source: str) -> Path | None:
    """The folder a dictionary is read from, which holds its exemplar index: a bundled one's or an allowed local
    one's; None for one fetched from the Hub."""
    from ...concepts.files import folder_of

    folder = folder_of(source) if source and source not in catalog.DICTIONARIES else None
    if folder is None or source in catalog.BUNDLED_DICTIONARIES:
        return folder
    return folder if allowed_path(Path(source).expanduser()) else None


@dataclass(frozen=True, eq=False)
class ConceptImage:
    """One of a concept's top images from its exemplar index, as it crosses back: the thumbnail (h w 3 uint8), the
    concept's code on its grid (gh gw float32) and where that grid lies on it, its value (the largest code) and
    its class (None where the data set has no labels). Equal by content, its arrays' bytes included, so what is
    drawn of it can be kept (`ui.concepts.exemplar_tiles`) on ZeroGPU too, where it crosses as a copy."""
    thumbnail: np.ndarray
    map: np.ndarray
    region: Region
    value: float
    label: str | None

    def _content(self) -> tuple:
        return (self.thumbnail.shape, self.thumbnail.tobytes(), self.map.shape, self.map.tobytes(), self.region,
                self.value, self.label)

    def __eq__(self, other) -> bool:
        return isinstance(other, ConceptImage) and self._content() == other._content()

    def __hash__(self) -> int:
        return hash(self._content())


@dataclass(frozen=True)
class Removal:
    """What removing a concept from the block's output does to the model's top class on the photo (`Reader.read`,
    through `splice.concept_effects`): its probability with nothing removed, and per concept removed its
    probability and the top class without it."""
    target: str
    probability: float
    without: dict[int, tuple[float, str]]


@dataclass(frozen=True)
class ConceptReading:
    """One model's dictionary on the photo, as it crosses back (plain arrays, CPU). `concepts` are the C shown, in
    order: the photo's most active on the grid (`top`) and those most active at the class token (`class_top`, for
    a dictionary that reads it), or, with one dictionary across both models, those both fire first; for each its
    mean code over the grid, the share of the grid's cells it fires on, its map, its top images and how often it
    fires over the data set of its exemplar index (None without an index: `exemplar_words` says why), and its name
    from the classes of those top images (`names.concept_names`; its number alone without them). `removal`:
    the prediction with each removed (None: `removal_words` says why). `at_cells`: the concepts active at each
    cell (row-major), strongest first, as `PhotoConcepts.at` gives them. `partners`: with two separate
    dictionaries and their match, each shown concept's matched concept of the other model, their correlation and
    its mean code there on this photo (None: no partner)."""
    source: str
    model: str
    block: int                     # counted from 0
    tokens: str
    n_concepts: int
    grid: tuple[int, int]
    region: Region
    top: np.ndarray
    class_top: list[tuple[int, float]] | None   # the class token's strongest concepts and their codes
    concepts: np.ndarray
    activation: np.ndarray
    on_photo: np.ndarray
    maps: np.ndarray               # C gh gw
    at_cells: list[list[tuple[int, float]]]
    exemplars: list[list[ConceptImage]] | None
    exemplar_words: str
    frequency: np.ndarray | None   # C: the share of the data set's grid tokens each fires on
    data: str | None               # the exemplar index's data set
    names: list[ConceptName]       # C
    removal: Removal | None
    removal_words: str
    partners: list[tuple[int, float, float] | None] | None = None


@dataclass(frozen=True)
class Concepts:
    """`concepts`' answer: per model its reading, or why it has none in words; with one dictionary across both
    models the photo's concepts both fire (`both`) and those only each one does (`only`); with two separate
    dictionaries, why there are no matched pairs (`match_words`, '' where their match was found)."""
    columns: list[ConceptReading | str]
    both: list[int] | None = None
    only: tuple[list[int], list[int]] | None = None
    match_words: str = ""


def bound_dictionaries(loaded: list[hub.LoadedModel], sources: list[str]) -> list[Reader | str]:
    """Each model's dictionary (`photo.readers`), or why it has none, in words. One source named for both models
    is bound to both at once: a dictionary across models serves each of them."""
    from ...concepts import ConceptsError
    from ...concepts.analysis.photo import readers

    groups = [(list(range(len(loaded))), sources[0])] if len(set(sources)) == 1 else \
        [([i], source) for i, source in enumerate(sources)]
    bound: list[Reader | str] = [""] * len(loaded)
    for positions, source in groups:
        if not source:
            for i in positions:
                bound[i] = f"No dictionary is chosen for {loaded[i].name}: name one in its box."
            continue
        try:
            found = readers([loaded[i] for i in positions], [source])
        except ConceptsError as e:
            found = [str(e)] * len(positions)
        for i, reader in zip(positions, found):
            bound[i] = f"{source} holds no dictionary of {loaded[i].name}." if reader is None else reader
    return bound


@lru_cache(maxsize=16)   # a process loads and binds each pair of dictionaries once; the readers are not changed
def bound_dictionaries_of(names: tuple[str, ...], sources: tuple[str, ...],
                          prompts: tuple[str, ...] | None) -> tuple[Reader | str, ...]:
    """`bound_dictionaries` of the models `names` (with `prompts` for CLIP), kept."""
    return tuple(bound_dictionaries(models_of(list(names), prompts=None if prompts is None else list(prompts)),
                                    list(sources)))


@lru_cache(maxsize=32)   # a process reads each dictionary's index once (its checksum alone costs a pass)
def exemplar_index(reader: Reader) -> tuple[Exemplars | None, str]:
    """The exemplar index of `reader`'s dictionary in its folder (`exemplars.index_in`: the one built from these
    weights), or None and why not, in words."""
    from ...concepts import ConceptsError
    from ...concepts.analysis.exemplars import index_in

    folder = dictionary_folder(reader.source)
    if folder is None:
        return None, f"{reader.source} comes from the Hub, where vitviz finds no exemplar index."
    try:
        return index_in(folder, dictionary=reader.dictionary), ""
    except ConceptsError as e:
        return None, str(e)


@lru_cache(maxsize=4096)   # the thumbnails of the concepts shown, decoded once a process
def top_images(index: Exemplars, concept: int) -> list:
    """`index.of(concept)`, kept."""
    return index.of(concept)


def exemplar_images(index: Exemplars, concept: int, run: ModelRun, block: int) -> list[ConceptImage]:
    """Concept `concept`'s top images from `index`, each with where its map lies on the thumbnail (the model's grid
    over the thumbnail's size; an index across models was built on the cells of the region every model saw,
    which is each model's own where all of them read the whole image, as the bundled ones do)."""
    from ...concepts.activations.align import grid_region

    regions: dict[tuple[int, int], Region] = {}
    shown = []
    for exemplar in top_images(index, concept):
        thumbnail = np.asarray(exemplar.image)
        size = thumbnail.shape[:2]
        if size not in regions:
            regions[size] = grid_region(run.trace, block, run.loaded.transform, size)
        shown.append(ConceptImage(thumbnail=thumbnail, map=np.asarray(exemplar.map, np.float32), region=regions[size],
                                  value=float(exemplar.value), label=exemplar.label))
    return shown


def removal(run: ModelRun, photo: PhotoConcepts) -> Removal | None:
    """What `Reader.read` measured of removing the photo's concepts, keyed by concept (None where it measured none:
    `photo.no_removal` says why)."""
    if photo.without is None:
        return None
    return Removal(target=run.label(photo.target), probability=photo.probability,
                   without={int(c): (float(p), run.label(int(top)))
                            for c, p, top in zip(photo.removed, photo.without, photo.top_without)})


def matched(bound: list[Reader]) -> tuple[Matches | None, bool, str]:
    """The match of two separate dictionaries (`concepts.match`), read from the folder `match-<left>-<right>` (or
    `match-<right>-<left>`: then `swapped`) beside their folders: (matches, swapped, ''), or (None, False, why
    not, in words)."""
    from ...concepts import ConceptsError
    from ...concepts.analysis.match import Matches, folder_name

    folders = [dictionary_folder(reader.source) for reader in bound]
    if None in folders:
        return None, False, ("Matched pairs are read from a match folder beside both dictionaries' folders; a "
                             "dictionary from the Hub has none.")
    for (a, b), swapped in (((folders[0], folders[1]), False), ((folders[1], folders[0]), True)):
        folder = a.parent / folder_name(a.name, b.name)
        if not folder.is_dir():
            continue
        try:
            found = Matches.load(folder)
        except ConceptsError as e:
            return None, False, str(e)
        sides = found.sides[::-1] if swapped else found.sides
        if any(side["model"] != reader.model or side["dictionary"]["n_concepts"] != reader.dictionary.n_concepts
               for side, reader in zip(sides, bound)):
            return None, False, (f"{folder} matches dictionaries of {sides[0]['model']} and {sides[1]['model']}, not "
                                 f"these: match the two again.")
        return found, swapped, ""
    return None, False, (f"no match of {bound[0].source} with {bound[1].source} is at hand (`python -m vitviz "
                         f"concepts match {bound[0].source} {bound[1].source} --data DATA --out "
                         f"{folder_name(folders[0].name, folders[1].name)}`, run in the folder that holds both, makes "
                         f"one; "
                         f"then its pairs are shown here).")


def own_concepts(photo: PhotoConcepts) -> np.ndarray:
    """The concepts a column shows for a dictionary of its model alone: the photo's most active on the grid, then
    those most active at the class token that are not among them."""
    at_class = [] if photo.class_top is None else photo.class_top.tolist()
    return np.array(list(dict.fromkeys([*photo.top.tolist(), *at_class])), dtype=np.int64)


def column_reading(run: ModelRun, reader: Reader, photo: PhotoConcepts, shown: np.ndarray,
                   partners: list | None) -> ConceptReading:
    """One model's `ConceptReading` of the concepts `shown`, from its photo's codes."""
    from ...concepts.activations.align import grid_region
    from ...concepts.analysis.names import concept_names

    index, exemplar_words = exemplar_index(reader)
    codes = photo.codes[:, shown]
    class_top = None if photo.class_top is None else [(int(c), float(photo.class_codes[c])) for c in photo.class_top]
    return ConceptReading(
        source=reader.source, model=reader.model, block=reader.block, tokens=reader.tokens,
        n_concepts=reader.dictionary.n_concepts, grid=photo.grid,
        region=grid_region(run.trace, reader.block, run.loaded.transform, (run.image.height, run.image.width)),
        top=photo.top, class_top=class_top, concepts=shown, activation=codes.mean(0), on_photo=(codes > 0).mean(0),
        maps=codes.T.reshape(len(shown), *photo.grid), at_cells=[photo.at(cell) for cell in range(len(photo.codes))],
        exemplars=None if index is None else [exemplar_images(index, int(c), run, reader.block) for c in shown],
        exemplar_words=exemplar_words, frequency=None if index is None else index.frequency[shown].numpy(),
        data=None if index is None else index.data, names=concept_names(index, shown), removal=removal(run, photo),
        removal_words=photo.no_removal or "", partners=partners)


@gpu(duration=CONCEPTS_S)
def concepts(names: list[str], picture: Image.Image, pixels: list[torch.Tensor], sources: list[str],
             prompts: list[str] | None = None, pinned: tuple[str, int] | None = None) -> Concepts:
    """The two models' concepts on their `pixels` of `picture`, through the dictionaries `sources[i]`
    (`dictionary_source`'s; one source for both: one concept space, read as a dictionary across models where it
    is one): a traced forward each, the codes and each top concept removed (`photo.Reader.read`), each shown
    concept's top images from its exemplar index and, for two separate dictionaries, their matched pairs where a
    match is at hand. `pinned` (a source and a concept, as a link to the app names one): that concept's card first in
    each column that reads the source. Plain arrays, CPU."""
    from ...concepts.analysis.photo import Reader, shared_concepts

    loaded = models_of(names, prompts=prompts)
    bound = bound_dictionaries_of(tuple(names), tuple(sources), None if prompts is None else tuple(prompts))
    runs, photos = [], []
    for model, image, reader in zip(loaded, pixels, bound):
        image = image.to(model.device)
        with MODEL_GATE(), torch.inference_mode():
            run = ModelRun(model, picture, pixels=image, trace=model.model.trace(image, attention=False))
            if isinstance(reader, Reader):
                reader.dictionary.to(model.device)
                photos.append(reader.read(run))
            else:
                photos.append(None)
        runs.append(run)
    shown = [None if photo is None else own_concepts(photo) for photo in photos]
    both = only = None
    found, swapped, match_words = None, False, ""
    if None not in photos and len(set(sources)) == 1:   # one concept space: the same concept in both columns
        both, *only = shared_concepts(*photos)
        only = tuple(only)
        shown = [np.array(both + mine, dtype=np.int64) for mine in only]
    elif None not in photos:
        found, swapped, match_words = matched(bound)
    if pinned is not None:
        shown = [mine if photo is None or source != pinned[0] or not 0 <= pinned[1] < reader.dictionary.n_concepts
                 else np.array([pinned[1], *(c for c in mine if c != pinned[1])], dtype=np.int64)
                 for mine, photo, source, reader in zip(shown, photos, sources, bound)]
    columns: list[ConceptReading | str] = []
    for i, (run, reader, photo) in enumerate(zip(runs, bound, photos)):
        if photo is None:
            columns.append(reader)
            continue
        partners = None
        if found is not None:
            other = photos[1 - i].codes
            pairs = [found.partner(int(c), side=i ^ swapped) for c in shown[i]]
            partners = [None if pair is None else (*pair, float(other[:, pair[0]].mean())) for pair in pairs]
        columns.append(column_reading(run, reader, photo, shown[i], partners))
    return Concepts(columns=columns, both=both, only=only, match_words=match_words)
