"""Do the models see a concept alike? For a concept of a dictionary across models (Thasarathan et al. 2025), how
strongly each model's own picture excites the concept in every one of the models, in units of what photos do there.

    table = alike("across-cifar10", 5)     # Alike: values[m, n], the models, the data's 99th percentiles
    print(table.words())                  # "resnet-cifar10's picture excites concept 5 in vit-cifar10 at 2.3x ..."

Model m's own picture is the one drawn in m alone (shipped beside the dictionary, else drawn with the shipped
settings, `pictures.SETTINGS`). Its value in model n is the concept's objective as pictures are drawn
(`targets.Readout`: the encoder's pre-activation averaged over the cells the dictionary reads), on the whole picture
at n's input size (the shipped pictures' canvas is the models' input, their crops 80-100 % of it). The same readout
on `images` photos of a data set (CIFAR-10's test split by default) gives n's 99th percentile q_n, and

    values[m, n] = value of m's picture in n / q_n

so 1 is as strongly as the 1 % of photos that excite the concept most in n. A row that stays high off its diagonal
says the other models see in m's picture what m put there; a row high only at its own model, that m drew something
the others do not read as the concept. Where q_n is not above 0 (the concept's pre-activation is below 0 on 99 % of
the photos), the ratio says nothing and is NaN, and the words say so.

Every concept at once (`tables`, what `vitviz looks --concepts ACROSS --alike` ships in looks.safetensors and the
cards and the atlas read): each concept's pictures of every set (the shared one, then each model's own) read in every
model, from one pass of the photos and of the pictures per model. The encoder is linear in the normalised tokens, so
every concept's readout of an image is its mean normalised token through the whole encoder (`every_concept`), the
same number `Readout` gives one concept at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..concepts import Across, ConceptsError, load as load_dictionary
from .draw import draw
from .targets import Concept, LooksError, Readout

SHARED = "shared"   # the set of pictures drawn in every model at once, beside each model's own

PERCENTILE = 99
IMAGES = 500      # photos the percentile is taken over
BATCH = 100       # photos traced at once


@dataclass(frozen=True)
class Alike:
    """values[m, n]: model m's own picture's value of the concept in model n over n's 99th percentile on the data;
    `shared` (M, where known): the shared picture's, drawn in every model at once."""
    dictionary: str
    concept: int
    models: tuple[str, ...]
    values: np.ndarray       # M M
    percentiles: np.ndarray  # M: each model's 99th percentile of the concept on the data
    data: str
    shared: np.ndarray | None = None

    def words(self) -> str:
        """The table in sentences: each picture in every other model, then in its own."""
        lines = []
        for m, drawn_in in enumerate(self.models):
            for n, read_in in enumerate(self.models):
                if m == n:
                    continue
                value = self.values[m, n]
                if not np.isfinite(value):
                    lines.append(f"{drawn_in}'s picture: concept {self.concept} is below 0 on {PERCENTILE} % of "
                                 f"{self.data} in {read_in}, so its percentile says nothing")
                else:
                    lines.append(self.reading(value, m, n))
        own = ", ".join(f"{m} {v:.1f}x" for m, v in zip(self.models, np.diag(self.values)))
        lines.append(f"each model's picture in its own model: {own}")
        if self.shared is not None:
            lines.append("the shared picture: " + ", ".join(f"{m} {v:.1f}x" for m, v in zip(self.models, self.shared)))
        return "\n".join(lines)

    def summary(self) -> str:
        """The strongest and the weakest reading of one model's picture by another, in a sentence each."""
        others = [(self.values[m, n], m, n) for m in range(len(self.models)) for n in range(len(self.models))
                  if m != n and np.isfinite(self.values[m, n])]
        if not others:
            return (f"No model's picture can be read in another: concept {self.concept}'s {PERCENTILE}th percentile "
                    f"on {self.data} is not above 0 in the others.")
        strongest, weakest = max(others), min(others)
        if len(others) == 1:
            return self.reading(*strongest) + "."
        return f"Most strongly, {self.reading(*strongest)}; least, {self.reading(*weakest)}."

    def reading(self, value: float, m: int, n: int) -> str:
        """Model m's picture read in model n, in words."""
        ratio = f"{value:.1f}x its {PERCENTILE}th percentile on {self.data}"
        if value > 0:
            return f"{self.models[m]}'s picture excites concept {self.concept} in {self.models[n]} at {ratio}"
        return f"{self.models[m]}'s picture holds concept {self.concept} below 0 in {self.models[n]} ({ratio})"

    def table(self) -> str:
        """The values as a text table: a row per picture, a column per model reading it."""
        width = max(len(m) for m in self.models) + 2
        head = "picture \\ read in".ljust(width) + "".join(m.rjust(width) for m in self.models)
        rows = [m.ljust(width) + "".join(f"{v:.2f}x".rjust(width) for v in row) for m, row in zip(self.models,
                                                                                                  self.values)]
        return "\n".join([head, *rows])


def concept_values(loaded, readouts: dict, dictionaries: dict, source, concept: int, pixels: torch.Tensor
                   ) -> torch.Tensor:
    """The concept's objective (`Readout`, one value per image) on images in [0, 1] (b 3 h w) in `loaded`, resized
    to its input; `readouts` keeps one readout per batch size, `dictionaries` the dictionary they share."""
    size = tuple(loaded.transform.crop)
    if tuple(pixels.shape[-2:]) != size:
        pixels = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False, antialias=True)
    if len(pixels) not in readouts:
        readouts[len(pixels)] = Readout(loaded, [Concept(source, concept)] * len(pixels), dictionaries=dictionaries)
    with torch.no_grad():
        trace = loaded.model.trace(loaded.transform.normalize(pixels.to(loaded.device)), attention=False)
        return readouts[len(pixels)](trace, 1)[:, 0].float().cpu()


def every_concept(loaded, state: dict, source, pixels: torch.Tensor) -> torch.Tensor:
    """Every concept's objective (b C, as `concept_values` reads one) on images in [0, 1] (b 3 h w) in `loaded`:
    the mean of the normalised tokens the dictionary reads, through its whole encoder. `state` keeps the dictionary and
    the reading of the trace between calls."""
    size = tuple(loaded.transform.crop)
    if tuple(pixels.shape[-2:]) != size:
        pixels = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False, antialias=True)
    if "tokens" not in state:
        readout = Readout(loaded, [Concept(source, 0)], dictionaries=state.setdefault("dictionaries", {}))
        (group,) = readout.groups.values()
        dictionary, _ = readout.dictionary(Concept(source, 0))
        state["tokens"], state["encoder"] = group.tokens, dictionary
    dictionary = state["encoder"]
    with torch.no_grad():
        trace = loaded.model.trace(loaded.transform.normalize(pixels.to(loaded.device)), attention=False)
        mean = state["tokens"](trace).float().mean(1)   # b d: the uniform weights `Readout` gives a concept
        return (mean @ dictionary.W_enc + dictionary.b_enc - dictionary.b_dec @ dictionary.W_enc).float().cpu()


def read_every(loaded, state: dict, source, pixels: torch.Tensor) -> np.ndarray:
    """`every_concept` on images in [0, 1] (b 3 h w), `BATCH` at a time: b C float64."""
    return torch.cat([every_concept(loaded, state, source, pixels[first:first + BATCH])
                      for first in range(0, len(pixels), BATCH)]).double().numpy()


def read_in(loaded, dictionaries: dict, source, concept: int, photos, count: int, drawn: torch.Tensor
            ) -> tuple[float, np.ndarray]:
    """In one model: (the concept's 99th percentile over the first `count` photos, its value on each picture)."""
    readouts: dict = {}
    read = lambda pixels: concept_values(loaded, readouts, dictionaries, source, concept, pixels)
    decoded = lambda i: torch.from_numpy(np.asarray(photos.image(i, target_size=loaded.transform.crop),
                                                    dtype=np.float32) / 255).permute(2, 0, 1)
    on_data = torch.cat([read(torch.stack([decoded(i) for i in range(first, min(first + BATCH, count))]))
                         for first in range(0, count, BATCH)])
    return float(np.percentile(on_data.double().numpy(), PERCENTILE)), read(drawn).double().numpy()


def across_dictionary(source) -> Across:
    """The dictionary across models `source` names (a bundled name or a folder), or a LooksError in words."""
    try:
        dictionary = load_dictionary(source)
    except ConceptsError as e:
        raise LooksError(str(e)) from None
    if not isinstance(dictionary, Across):
        raise LooksError(f"{source} is a dictionary of one model: whether models see a concept alike needs a "
                         f"dictionary across models (e.g. across-cifar10).")
    return dictionary


def alike(source, concept: int, *, data="cifar10", images: int = IMAGES, device: str | torch.device = "cpu",
          pictures: dict[str, np.ndarray] | None = None) -> Alike:
    """The table (the module docstring) for `concept` of the dictionary across models `source` (a bundled name or a
    folder), its percentiles over the first `images` photos of `data` (a `vitviz.data` spec, or a `Dataset`).
    `pictures` (model -> h w 3, uint8 or floats in [0, 1]) stand in for the models' own."""
    from .. import hub
    from .pictures import SETTINGS, pictures_of

    dictionary = across_dictionary(source)
    if not isinstance(concept, int) or not 0 <= concept < dictionary.n_concepts:
        raise LooksError(f"{source} has {dictionary.n_concepts} concepts (0 to {dictionary.n_concepts - 1}); no "
                         f"concept {concept!r}.")
    if not isinstance(images, int) or images < 100:
        raise LooksError(f"A 99th percentile needs at least 100 photos, not {images!r}.")
    models = dictionary.models
    loaded = {m: hub.load(m, device=device) for m in models}
    if pictures is None:
        shipped = pictures_of(source)
        if shipped is not None and all(m in shipped.sets for m in models):
            pictures = {m: shipped.picture(concept, m)[0] for m in models}
        else:
            pictures = {m: draw(loaded[m], Concept(source, concept), settings=SETTINGS, device=device,
                                bar=False).images[0] for m in models}
    missing = [m for m in models if m not in pictures]
    if missing:
        raise LooksError(f"No picture of {', '.join(missing)} was given: give one per model of {source}.")
    as_float = lambda p: torch.from_numpy(np.asarray(p, dtype=np.float32) / (255 if np.asarray(p).dtype == np.uint8
                                                                             else 1)).permute(2, 0, 1)
    drawn = torch.stack([as_float(pictures[m]) for m in models])
    photos, named = photos_of(data)
    count = min(images, len(photos))
    if count < 100:
        raise LooksError(f"{named} has {len(photos)} images; a 99th percentile needs at least 100.")
    values, percentiles, dictionaries = np.zeros((len(models), len(models))), np.zeros(len(models)), {}
    for n, name in enumerate(models):
        percentiles[n], on_pictures = read_in(loaded[name], dictionaries, source, concept, photos, count, drawn)
        values[:, n] = on_pictures / percentiles[n] if percentiles[n] > 0 else np.nan
    return Alike(dictionary=str(source), concept=concept, models=models, values=values, percentiles=percentiles,
                 data=f"{count} test images of {named}")


def photos_of(data):
    """(the test split of `data`, a `vitviz.data` spec or a `Dataset`; its name as the tables say it), or LooksError."""
    from ..data import DataError, Dataset, open_data

    if isinstance(data, Dataset):
        return data, data.name
    try:
        return open_data(data, split="test"), str(data)
    except DataError as e:
        raise LooksError(str(e)) from None


@dataclass(frozen=True)
class Tables:
    """Every concept's table (`tables`): values[i, s, n], concept i's picture of set s (`sets`: 'shared', then each
    model's own) read in model n over n's 99th percentile (NaN where that is not above 0); percentiles[i, n]."""
    sets: tuple[str, ...]
    models: tuple[str, ...]
    values: np.ndarray        # n S M
    percentiles: np.ndarray   # n M
    data: str

    def of(self, dictionary: str, concept: int) -> Alike:
        """Concept `concept`'s table (`Alike`), the shared picture's row with it where there is one."""
        own = [self.sets.index(m) for m in self.models]
        shared = self.values[concept, self.sets.index(SHARED)] if SHARED in self.sets else None
        return Alike(dictionary=str(dictionary), concept=concept, models=self.models, values=self.values[concept, own],
                     percentiles=self.percentiles[concept], data=self.data, shared=shared)


def tables(source, pictures, *, data="cifar10", images: int = IMAGES, device: str | torch.device = "cpu",
           progress=None) -> Tables:
    """Every concept's table (the module docstring) of the dictionary across models `source` from its `pictures`
    (`looks.Pictures`, each model's own and the shared ones), the percentiles over the first `images` photos of
    `data`; `progress(done, all)` counts the models read."""
    from .. import hub

    dictionary = across_dictionary(source)
    models = dictionary.models
    missing = [m for m in models if m not in pictures.sets]
    if missing:
        raise LooksError(f"The pictures of {source} hold none of {', '.join(missing)}'s own: draw them first "
                         f"(vitviz looks --concepts {source} --pictures).")
    if not isinstance(images, int) or images < 100:
        raise LooksError(f"A 99th percentile needs at least 100 photos, not {images!r}.")
    photos, named = photos_of(data)
    count = min(images, len(photos))
    if count < 100:
        raise LooksError(f"{named} has {len(photos)} images; a 99th percentile needs at least 100.")
    n, sets = pictures.n_concepts, tuple(pictures.sets)
    drawn = {name: torch.from_numpy(np.stack([pictures.picture(c, name)[0] for c in range(n)]).astype(np.float32)
                                    / 255).permute(0, 3, 1, 2) for name in sets}
    values, percentiles = np.zeros((n, len(sets), len(models))), np.zeros((n, len(models)))
    for m, model in enumerate(models):
        loaded, state = hub.load(model, device=device), {}
        size = loaded.transform.crop
        on_data = read_every(loaded, state, source, torch.stack([
            torch.from_numpy(np.asarray(photos.image(i, target_size=size), dtype=np.float32) / 255).permute(2, 0, 1)
            for i in range(count)]))[:, :n]
        percentiles[:, m] = np.percentile(on_data, PERCENTILE, axis=0)
        above = percentiles[:, m] > 0
        for s, name in enumerate(sets):
            own = np.diagonal(read_every(loaded, state, source, drawn[name]))   # concept i on its own picture
            values[:, s, m] = np.where(above, own / np.where(above, percentiles[:, m], 1), np.nan)
        if progress is not None:
            progress(m + 1, len(models))
    return Tables(sets=sets, models=models, values=values, percentiles=percentiles,
                  data=f"{count} test images of {named}")
