"""One photo's concepts, as the Concepts tab and the exporter show them: which concepts a model's dictionary
finds in the photo, where each fires, what is active at one token, and what removing one does to the answer.

The codes. The dictionary encodes the block's tokens of its kind (`activations.cache.block_tokens`). A dictionary
of one model reads the model's own grid; a dictionary across models (`kinds/across.py`) was trained on cells that
every model shares, so its model's tokens are first resampled onto those cells (`activations/align.py`: the grid it was
trained on, `Across.training_record["cells"]`, over the photo; a ViT's 8 x 8 patches averaged 2 x 2 onto a
4 x 4 CvT's). `codes` is then cells x n, and a concept's map is its column on the grid.

Most active. A concept's activation on the photo is its mean code over the grid (the share of the photo it
covers times how strongly it fires there); the `top` largest, of the concepts that fire at all, in order. A
dictionary that reads the class token too gives that token's codes apart (`class_codes`): it has no place
on the photo, and a ViT's or CvT's classifier reads it alone, so its concepts are the ones that decide.

Shared or one model's. With one dictionary across two models the concept ids mean the same thing in both:
`shared_concepts` splits the photo's active concepts into those both models fire and those only one does.

Removing a concept. The block's output minus that concept's part, x - scale · z_i W_dec[i] at every token
(the reconstruction error and every other concept kept: the true output changed by one concept alone),
then the rest of the model (`splice.concept_effects`); the prediction moves by what that concept carried. Measured
for the photo's top concepts and its class token's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ...models.trace import Trace
from ..activations.align import align, in_photo, token_rectangles
from ..activations.cache import block_index, block_tokens, default_tokens
from ..kinds.dictionary import ConceptsError, Dictionary

TOP = 8         # concepts listed per photo, most active on its grid
CLASS_TOP = 4   # and at the class token, for a dictionary that reads it
ACROSS_REMOVAL = ("A dictionary across models reads cells the models share, not the block's own tokens, so a concept "
                  "cannot be taken out of them; pick the model's own dictionary to remove one.")


@dataclass(frozen=True)
class PhotoConcepts:
    """A dictionary's reading of one photo through one model: codes per cell, the most active concepts and, for a
    classifier, the top class's probability with each of them removed."""
    model: str
    block: int
    grid: tuple[int, int]          # the codes' grid: the model's own, or the cells of a dictionary across models
    codes: np.ndarray              # cells n, float32
    top: np.ndarray                # C concept ids, most active first
    activation: np.ndarray         # C: each one's mean code over the grid
    frequency: np.ndarray          # C: the share of the grid's cells it fires on
    class_codes: np.ndarray | None = None  # n: the class token's codes, for a dictionary that reads it
    class_top: np.ndarray | None = None    # the concepts most active at the class token, strongest first
    target: int | None = None      # the class removal is measured on (the model's top class); None: no classifier
    probability: float | None = None       # its probability on the photo
    removed: np.ndarray | None = None      # R concept ids whose removal was measured: `top`, then `class_top`'s others
    without: np.ndarray | None = None      # R: the target's probability with each of `removed` taken out
    top_without: np.ndarray | None = None  # R: the top class with each taken out
    no_removal: str | None = None          # why there is no removal effect, in words (None where there is)

    def concept_map(self, concept: int) -> np.ndarray:
        """gh gw: concept `concept`'s code at each cell."""
        return self.codes[:, concept].reshape(self.grid)

    def at(self, cell: int, count: int = TOP) -> list[tuple[int, float]]:
        """The concepts active at one cell (row-major on `grid`), strongest first: (concept, code) pairs."""
        row = self.codes[cell]
        order = np.argsort(-row, kind="stable")[:count]
        return [(int(c), float(row[c])) for c in order if row[c] > 0]


def photo_codes(trace: Trace, dictionary: Dictionary, *, block: int, tokens: str,
                cells: tuple[int, int] | None = None, transform=None, image_size: tuple[int, int] | None = None
                ) -> tuple[Tensor, tuple[int, int]]:
    """(cells n codes, grid) of the first image of `trace`: its grid tokens of block `block`, resampled onto `cells`
    over the photo (h, w = `image_size`, through the model's `transform`) for a dictionary across models."""
    index = block_index(trace, block)
    grid_tokens = block_tokens(trace, index, "position" if tokens == "position" else "patch")[0]
    grid = trace.blocks[index].query_grid
    if cells is not None:
        weights, grid = cell_weights(trace, index, cells=cells, transform=transform, image_size=image_size)
        grid_tokens = torch.einsum('ct,td->cd', weights.to(grid_tokens), grid_tokens)
    return dictionary.encode(grid_tokens), grid


def cell_weights(trace: Trace, block: int, *, cells: tuple[int, int], transform, image_size: tuple[int, int]
                 ) -> tuple[Tensor, tuple[int, int]]:
    """(cells x grid tokens area weights, the cells' grid): how block `block`'s grid tokens are resampled onto the
    `cells` a dictionary across models was trained on, over the photo (h, w = `image_size`, through the model's
    `transform`)."""
    rectangles = in_photo(token_rectangles(trace, block), transform, image_size)
    h, w = cells
    tiles = torch.tensor([[i / h, j / w, (i + 1) / h, (j + 1) / w] for i in range(h) for j in range(w)],
                         dtype=torch.float64)
    alignment = align([rectangles, tiles])
    return alignment.weights[0], alignment.grid


def read_photo(trace: Trace, dictionary: Dictionary, *, model: str, block: int, tokens: str, top: int = TOP,
               cells: tuple[int, int] | None = None, transform=None, image_size: tuple[int, int] | None = None
               ) -> PhotoConcepts:
    """The photo's concepts through one model (the first image of its `trace`); `cells`, `transform` and
    `image_size` for a dictionary across models (see `photo_codes`); a dictionary that reads the class token also
    gives its codes there (`class_codes`, `class_top`). Removal is `Reader.read`'s."""
    index = block_index(trace, block)
    codes, grid = photo_codes(trace, dictionary, block=index, tokens=tokens, cells=cells, transform=transform,
                              image_size=image_size)
    codes = codes.detach().float().cpu()
    mean = codes.mean(0)
    firing = (codes > 0).float().mean(0)
    order = _strongest(mean, top)
    class_codes = class_top = None
    if "cls" in tokens:
        class_codes = dictionary.encode(block_tokens(trace, index, "cls")[0, 0]).detach().float().cpu()
        class_top = _strongest(class_codes, min(top, CLASS_TOP)).numpy()
        class_codes = class_codes.numpy()
    return PhotoConcepts(model=model, block=index, grid=tuple(grid), codes=codes.numpy(), top=order.numpy(),
                         activation=mean[order].numpy(), frequency=firing[order].numpy(), class_codes=class_codes,
                         class_top=class_top)


def _strongest(values: Tensor, top: int) -> Tensor:
    """The ids of the `top` largest positive values, largest first (ties: the smaller id first)."""
    order = torch.argsort(values, descending=True, stable=True)
    return order[values[order] > 0][:top]


def shared_concepts(a: PhotoConcepts, b: PhotoConcepts) -> tuple[list[int], list[int], list[int]]:
    """For one dictionary across two models: the photo's active concepts (in either's top) that both fire
    somewhere on the photo, those only `a` fires, those only `b` does."""
    fires_a, fires_b = (a.codes > 0).any(0), (b.codes > 0).any(0)
    listed = list(dict.fromkeys([*a.top.tolist(), *b.top.tolist()]))
    both = [c for c in listed if fires_a[c] and fires_b[c]]
    only_a = [c for c in listed if fires_a[c] and not fires_b[c]]
    only_b = [c for c in listed if fires_b[c] and not fires_a[c]]
    return both, only_a, only_b


def cells_of(record: dict | None) -> tuple[int, int] | None:
    """The cells a dictionary across models was trained on, from its training record."""
    cells = (record or {}).get("cells")
    return tuple(cells) if cells else None



@dataclass(frozen=True)
class Reader:
    """A dictionary bound to one model it applies to: what to read of the trace, and how (`read`)."""
    dictionary: Dictionary
    model: str
    block: int
    tokens: str
    source: str                          # as the dictionary was asked for (a folder, a file, a Hub id)
    cells: tuple[int, int] | None = None  # a dictionary across models: the cells it was trained on

    def read(self, run, *, top: int = TOP, remove: bool = True) -> PhotoConcepts:
        """The photo's concepts through `run` (a `session.ModelRun`: its trace, its model's preprocessing) and,
        with `remove` and the model's weights at hand, the top class's probability with each top concept removed
        (`splice.concept_effects`), or in `no_removal` why not."""
        reading = read_photo(run.trace, self.dictionary, model=self.model, block=self.block, tokens=self.tokens,
                             top=top, cells=self.cells, transform=run.loaded.transform,
                             image_size=(run.image.height, run.image.width))
        if not remove:
            return reading
        if self.cells is not None:
            return replace(reading, no_removal=ACROSS_REMOVAL)
        if not run.has_classifier:
            return replace(reading, no_removal=f"{self.model} has no classifier: there is no prediction to move.")
        removed = list(dict.fromkeys([*reading.top.tolist(), *([] if reading.class_top is None else
                                                                  reading.class_top.tolist())]))
        if not removed:
            return replace(reading, no_removal="No concept of this dictionary fires on the photo.")
        from .splice import concept_effects

        try:
            effects = concept_effects(run.loaded, run.trace, self.dictionary, concepts=removed, block=self.block,
                                      tokens=self.tokens)
        except ConceptsError as e:
            return replace(reading, no_removal=str(e))
        return replace(reading, target=effects.target, probability=effects.probability,
                       removed=np.asarray(removed, dtype=np.int64), without=effects.probabilities.numpy(),
                       top_without=effects.predictions.numpy())


def model_names(loaded) -> tuple[str, ...]:
    """Every name a loaded model goes by: as asked for, and its Hub repo or folder."""
    return tuple(dict.fromkeys([loaded.name, loaded.source.location]))


def readers(models: Sequence, sources: Sequence[str]) -> list[Reader | None]:
    """Each loaded model's dictionary among `sources` (loaded with `concepts.load`; a dictionary across models
    serves each of its models), None for a model none of them is for. A source that is for none of the models,
    or whose block or width does not fit the model, is refused in words."""
    from ..files import load
    from ..kinds.across import Across

    bound: list[Reader | None] = [None] * len(models)
    for source in sources:
        loaded = load(source)
        per_model = loaded.dictionaries if isinstance(loaded, Across) else {loaded.model: loaded}
        cells = cells_of(loaded.training_record) if isinstance(loaded, Across) else None
        used = False
        for i, model in enumerate(models):
            names = model_names(model)
            # a dictionary that does not record its model (None) is taken for the one model there is
            name = next((n for n in per_model if n in names or n is None and len(models) == 1), False)
            if name is False:
                continue
            dictionary = per_model[name]
            with torch.inference_mode():
                trace = model.model.trace(torch.zeros(1, 3, *model.transform.crop, device=model.device),
                                          attention=False)
            if dictionary.block is None:
                raise ConceptsError(f"{source} does not record which block it was trained on, so it cannot be applied "
                                    f"to {model.name}.")
            index = block_index(trace, dictionary.block)
            dictionary.check_applies(model=model.name, block=index, width=trace.blocks[index].tokens.shape[-1],
                                     names=names)
            tokens = dictionary.origin.tokens or default_tokens(trace.blocks[index])
            bound[i] = Reader(dictionary=dictionary, model=model.name, block=index, tokens=tokens, source=str(source),
                              cells=cells)
            used = True
        if not used:
            trained_on = ", ".join(str(n) for n in per_model)
            raise ConceptsError(f"{source} was trained on {trained_on}, which is none of the models asked for "
                                f"({', '.join(m.name for m in models)}).")
    return bound
