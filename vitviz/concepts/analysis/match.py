"""Matching two separately trained dictionaries: which concept of one is which of the other (`concepts match`).

    matches = match(Side(vit, vit_dictionary), Side(cvt, cvt_dictionary), data, indices=range(1000))
    matches.pairs[:10], matches.correlation[:10]      # the best-matched pairs (concept of A, concept of B)
    matches.save("matches/vit-cvt"); Matches.load("matches/vit-cvt")

Each side is a model, a dictionary of one of its blocks, and the same images for both:

1. Each side's grid tokens (patch tokens, or a CNN's positions; a class token has no place on the photo) are
   encoded by its dictionary on the model's own grid: codes, tokens x concepts.
2. The codes are resampled onto the cells the two grids are aligned on (`activations/align.py`): a cell's code is the
   area-weighted mean of the codes of the tokens that cover it. Encoded first, resampled second: each
   dictionary was trained on its model's tokens, and a cell's mean of tokens is a token it never saw (the
   encoder is not linear: the TopK of a mean is not the mean of the TopKs). What is resampled is each
   concept's map over the photo, which the cell mean shows at the cell's place as it shows any map.
3. Over all R (image, cell) rows, with a_ir the code of concept i of A and b_jr that of concept j of B, the
   Pearson correlation of every pair of concepts

       ρ_ij = Σ_r (a_ir - ā_i)(b_jr - b̄_j) / sqrt( Σ_r (a_ir - ā_i)² · Σ_r (b_jr - b̄_j)² )

   streamed (`Correlation`): float64 sums about a shift c (the first batch's means, so that a large mean does
   not cancel away the digits of a small spread), nothing kept but n_a x n_b numbers whatever R is:

       S_a = Σ_r (a_r - c_a),   S_aa = Σ_r (a_r - c_a)²,   S_ab = Σ_r (a_r - c_a)(b_r - c_b)ᵀ   (likewise S_b, S_bb)
       cov_ab = S_ab - S_a S_bᵀ / R,   var_a = S_aa - S_a² / R,   ρ = cov_ab / sqrt(var_a var_b)

   A concept that does not vary over the rows (var_a = 0: one that never fires, mostly, or has one code at
   every cell) has no correlation: its ρ is 0, and it is left out of the assignment.
4. The one-to-one assignment that maximises the sum of ρ over its pairs (the Hungarian algorithm,
   `scipy.optimize.linear_sum_assignment`), among the concepts that vary and fire (code > 0) on at least
   `min_rows` rows, on both sides: min(n_a', n_b') pairs, highest correlation first. The rarer ones keep
   their ρ in the matrix but are left out, since a ρ over a few rows says nothing: two concepts that fire
   once each, at the same cell, have ρ = 1. It pairs every concept it can, so a pair's ρ says whether it is a match:
   near 0, the concept has no counterpart in the other dictionary.

The result's file (`Matches.save`): `matches.json` in a folder (the sides, the counts, every pair with its
correlation, each concept's firing share), and `correlations.safetensors` beside it with the whole n_a x n_b
matrix where it was kept.
"""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor
from tqdm import tqdm

from ...data import Dataset
from ...files import write_atomic
from ...models.trace import Trace
from ..activations.align import Alignment, align, in_photo, token_rectangles
from ..activations.cache import block_index, block_tokens, default_tokens
from ..files.own import checked_format
from ..kinds.dictionary import ConceptsError, Dictionary
from .splice import image_batches

if TYPE_CHECKING:
    from ...hub.loaded import LoadedModel

FORMAT, VERSION = "vitviz-matches", 1
MATCHES_FILE = "matches.json"
MATRIX_FILE = "correlations.safetensors"


@dataclass(frozen=True)
class Side:
    """One side of a match: a loaded model (`vitviz.hub.load`), a dictionary of its block `block`'s tokens
    (default the block the dictionary was trained on)."""
    loaded: LoadedModel
    dictionary: Dictionary
    block: int | None = None


class Correlation:
    """Pearson's correlation of every column of x (rows n_x) with every column of y (rows n_y) over rows given
    in batches: float64 sums about the first batch's means (the module docstring)."""

    def __init__(self, n_x: int, n_y: int, *, device: torch.device | str = "cpu"):
        zeros = functools.partial(torch.zeros, dtype=torch.float64, device=device)
        self.rows = 0
        self.shift_x = self.shift_y = None
        self.sum_x, self.sum_y = zeros(n_x), zeros(n_y)
        self.squares_x, self.squares_y = zeros(n_x), zeros(n_y)   # Σ (x - c)², about the shift
        self.products = zeros(n_x, n_y)

    def add(self, x: Tensor, y: Tensor) -> None:
        """One batch: x (rows n_x) and y (rows n_y), row r of each the same place of the same image."""
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows and y {len(y)}: each row must be one place in both")
        if not len(x):
            return
        x, y = x.to(self.products.device, torch.float64), y.to(self.products.device, torch.float64)
        if self.shift_x is None:
            self.shift_x, self.shift_y = x.mean(0), y.mean(0)
        dx, dy = x - self.shift_x, y - self.shift_y
        self.rows += len(x)
        self.sum_x += dx.sum(0)
        self.sum_y += dy.sum(0)
        self.squares_x += dx.square().sum(0)
        self.squares_y += dy.square().sum(0)
        self.products += dx.T @ dy

    def variances(self) -> tuple[Tensor, Tensor]:
        """(n_x, n_y) float64: each column's variance times the rows, Σ_r (x_r - x̄)²."""
        return (self.squares_x - self.sum_x.square() / self.rows, self.squares_y - self.sum_y.square() / self.rows)

    def varies(self) -> tuple[Tensor, Tensor]:
        """(n_x, n_y) bool: the columns that vary over the rows."""
        var_x, var_y = self.variances()
        return var_x > 0, var_y > 0

    def matrix(self) -> Tensor:
        """n_x n_y float64: ρ of every pair of columns; 0 where either does not vary."""
        if not self.rows:
            raise ValueError("no rows were added")
        var_x, var_y = self.variances()
        varies_x, varies_y = self.varies()
        covariance = self.products - torch.outer(self.sum_x, self.sum_y) / self.rows
        spread = torch.outer(var_x.clamp(min=0), var_y.clamp(min=0)).sqrt()
        both = varies_x[:, None] & varies_y[None, :]
        return torch.where(both, covariance / torch.where(both, spread, 1.0), 0.0).clamp(-1, 1)


def assignment(matrix: Tensor, *, rows: Tensor | None = None, columns: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The one-to-one pairs (i, j) that maximise the sum of matrix[i, j] (Hungarian), among the `rows` and
    `columns` allowed (bool masks; default all): (P 2 long pairs, P values), the highest value first."""
    from scipy.optimize import linear_sum_assignment  # here: scipy takes most of a second to import

    rows = torch.ones(matrix.shape[0], dtype=torch.bool) if rows is None else rows.cpu()
    columns = torch.ones(matrix.shape[1], dtype=torch.bool) if columns is None else columns.cpu()
    row_ids, column_ids = rows.nonzero()[:, 0], columns.nonzero()[:, 0]
    values = matrix.detach().cpu().double()[row_ids][:, column_ids].numpy()
    chosen_rows, chosen_columns = linear_sum_assignment(values, maximize=True)
    order = np.argsort(-values[chosen_rows, chosen_columns], kind="stable")
    chosen_rows, chosen_columns = chosen_rows[order], chosen_columns[order]
    pairs = torch.stack([row_ids[chosen_rows], column_ids[chosen_columns]], dim=1).reshape(-1, 2)
    return pairs, torch.from_numpy(values[chosen_rows, chosen_columns].copy())


@dataclass(frozen=True)
class Matches:
    """`match`'s result: the one-to-one pairs of concepts with their correlations, highest first (the module
    docstring), and what they were measured on."""
    sides: tuple[dict, dict]    # each: model, block, tokens, and the dictionary's kind, n_concepts, d, origin
    pairs: Tensor               # P 2 long: (concept of A, concept of B)
    correlation: Tensor         # P float64: each pair's ρ
    firing: tuple[Tensor, Tensor]   # per side, n float64: the share of rows each concept fires on (code > 0)
    rows: int                   # (image, cell) rows the correlations are over
    images: int
    skipped: int                # images that did not decode
    min_rows: int               # the fewest rows a concept fired on to be paired
    matrix: Tensor | None = field(default=None, repr=False)   # n_a n_b float64: every ρ, where it was kept

    def partner(self, concept: int, *, side: int = 0) -> tuple[int, float] | None:
        """The concept of the other side matched to `concept` of side `side` (0: A, 1: B), with its correlation;
        None when it has no pair (it does not vary, or the other side ran out of concepts)."""
        found = (self.pairs[:, side] == concept).nonzero()[:, 0]
        if not len(found):
            return None
        return int(self.pairs[found[0], 1 - side]), float(self.correlation[found[0]])

    def to_dict(self) -> dict:
        """Everything but the matrix, as `matches.json` holds it."""
        return {"format": FORMAT, "version": VERSION, "sides": list(self.sides), "rows": self.rows,
                "images": self.images, "skipped": self.skipped, "min_rows": self.min_rows,
                "pairs": [[int(a), int(b), float(r)] for (a, b), r in zip(self.pairs.tolist(), self.correlation)],
                "firing": [f.tolist() for f in self.firing]}

    def save(self, folder: str | Path) -> Path:
        """`matches.json` (and `correlations.safetensors` where the matrix was kept) written into `folder`,
        each atomically; -> the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.matrix is not None:
            write_atomic(folder / MATRIX_FILE, save_tensors({"correlation": self.matrix.cpu().contiguous()}))
        write_atomic(folder / MATCHES_FILE, json.dumps(self.to_dict(), indent=1).encode())
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> Matches:
        """What `save` wrote into `folder`, or a ConceptsError saying what is wrong with it."""
        folder = Path(folder)
        path = folder / MATCHES_FILE
        if not path.is_file():
            raise ConceptsError(f"{folder} holds no {MATCHES_FILE}: give the folder `concepts match` wrote.")
        try:
            saved = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConceptsError(f"{path} is damaged: it is not JSON ({e}).") from None
        checked_format(saved, path, format=FORMAT, version=VERSION, what="file")
        try:
            pairs = torch.tensor([[a, b] for a, b, _ in saved["pairs"]], dtype=torch.long).reshape(-1, 2)
            correlation = torch.tensor([r for _, _, r in saved["pairs"]], dtype=torch.float64)
            firing = tuple(torch.tensor(f, dtype=torch.float64) for f in saved["firing"])
            sides = tuple(saved["sides"])
            shape = tuple(int(side["dictionary"]["n_concepts"]) for side in sides)
            matches = cls(sides=sides, pairs=pairs, correlation=correlation, firing=firing, rows=int(saved["rows"]),
                          images=int(saved["images"]), skipped=int(saved["skipped"]),
                          min_rows=int(saved["min_rows"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConceptsError(f"{path} is damaged or not in the layout vitviz writes ({e!r}).") from None
        if len(firing) != 2 or tuple(len(f) for f in firing) != shape:
            raise ConceptsError(f"{path} is damaged: its firing shares do not have one entry per concept.")
        if (folder / MATRIX_FILE).is_file():
            try:
                matrix = load_tensors((folder / MATRIX_FILE).read_bytes())["correlation"]
            except (SafetensorError, KeyError) as e:
                raise ConceptsError(f"{folder / MATRIX_FILE} is damaged ({e}): match again to make it.") from None
            if tuple(matrix.shape) != shape:
                raise ConceptsError(f"{folder / MATRIX_FILE} is {tuple(matrix.shape)}, not the {shape} of the "
                                    f"dictionaries {path} names: it belongs to another match.")
            matches = replace(matches, matrix=matrix)
        return matches


@dataclass(frozen=True)
class _Resolved:
    """A side checked against a trace of its model: its block index, grid token kind and token rectangles."""
    index: int
    tokens: str
    rectangles: Tensor   # (h w) 4, input pixels


def _resolve(side: Side, trace: Trace) -> _Resolved:
    dictionary, loaded = side.dictionary, side.loaded
    block = dictionary.block if side.block is None else side.block
    if block is None:
        raise ConceptsError(f"The dictionary for {loaded.name} does not record the block it was trained on: say "
                            f"which block it reads.")
    index = block_index(trace, block)
    if dictionary.origin.tokens == "cls":
        raise ConceptsError(f"The dictionary for {loaded.name} reads the class token alone, which has no place on "
                            f"the photo: matching compares concept maps, so it needs a dictionary of grid tokens.")
    dictionary.check_applies(model=loaded.name, block=index, width=trace.blocks[index].tokens.shape[-1],
                             names=(loaded.source.location,))
    return _Resolved(index=index, tokens=default_tokens(trace.blocks[index]),
                     rectangles=token_rectangles(trace, index))


def folder_name(a: str, b: str) -> str:
    """The folder `concepts match` results are kept in beside the folders `a` and `b` of the two dictionaries it
    matched, where the Concepts tab finds them: 'match-<a>-<b>'."""
    return f"match-{a}-{b}"


@torch.inference_mode()
def match(a: Side, b: Side, data: Dataset, *, indices: Sequence[int] | None = None, batch_size: int = 64,
          min_rows: int = 10, keep_matrix: bool = True, progress: bool = True) -> Matches:
    """The one-to-one matching of side `a`'s concepts with side `b`'s by the correlation of their maps at the
    aligned cells of the images `indices` of `data` (default all), in batches of `batch_size` images (the module
    docstring; concepts firing on fewer than `min_rows` cells are left unpaired). Images that do not decode are
    skipped and counted; a progress bar (stderr) counts the images."""
    indices = list(range(len(data))) if indices is None else list(indices)
    if not indices:
        raise ConceptsError("There are no images to match the dictionaries on.")
    sides = (a, b)
    resolved: list[_Resolved] | None = None
    alignments: dict[tuple[int, int], Alignment] = {}   # per photo size: the crops, and so the cells, depend on it
    device = a.dictionary.W_enc.device
    correlation = Correlation(a.dictionary.n_concepts, b.dictionary.n_concepts, device=device)
    fires = [torch.zeros(side.dictionary.n_concepts, dtype=torch.int64, device=device) for side in sides]
    images = skipped = 0
    with tqdm(total=len(indices), desc="matching concepts", unit="image", file=sys.stderr, disable=not progress,
              mininterval=1) as bar:
        for kept, decoded, failed in image_batches(data, indices, batch_size):
            skipped += failed
            by_size: dict[tuple[int, int], list] = {}
            for image in decoded:
                by_size.setdefault((image.height, image.width), []).append(image)
            for size, group in by_size.items():
                traces = {}   # one trace per model, where both sides read the same one
                for side in sides:
                    if id(side.loaded) not in traces:
                        pixels = torch.cat([side.loaded.preprocess(image) for image in group])
                        traces[id(side.loaded)] = side.loaded.model.trace(pixels, attention=False)
                if resolved is None:
                    resolved = [_resolve(side, traces[id(side.loaded)]) for side in sides]
                if size not in alignments:
                    alignments[size] = align([in_photo(r.rectangles, side.loaded.transform, size)
                                              for side, r in zip(sides, resolved)])
                cells = []
                for number, (side, r) in enumerate(zip(sides, resolved)):
                    codes = side.dictionary.encode(block_tokens(traces[id(side.loaded)], r.index, r.tokens))
                    cells.append(alignments[size].resample(number, codes).flatten(0, 1))
                    fires[number] += (cells[-1] > 0).sum(0).to(device)
                correlation.add(*cells)
            images += len(kept)
            bar.update(len(kept) + failed)
    if not images:
        raise ConceptsError(f"None of the {len(indices)} images of {data.name} could be read.")
    matrix = correlation.matrix()
    allowed = [varies & (fired >= min_rows) for varies, fired in zip(correlation.varies(), fires)]
    pairs, values = assignment(matrix, rows=allowed[0], columns=allowed[1])
    described = tuple({"model": side.loaded.name, "block": r.index, "tokens": r.tokens,
                       "dictionary": {"kind": side.dictionary.kind, "n_concepts": side.dictionary.n_concepts,
                                      "d": side.dictionary.d, "origin": side.dictionary.origin.to_dict()}}
                      for side, r in zip(sides, resolved))
    return Matches(sides=described, pairs=pairs, correlation=values,
                   firing=tuple(f.double().cpu() / correlation.rows for f in fires), rows=correlation.rows,
                   images=images, skipped=skipped, min_rows=min_rows, matrix=matrix.cpu() if keep_matrix else None)
