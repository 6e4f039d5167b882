"""Where a circuit's dictionaries sit in a model: one `Site` per dictionary, at the block it was trained on.

A site reads rows of its block's output tokens X (b N d, every token of the block, prefix tokens included) as a
linear map and writes changes of them back:

    rows    = R X            R: rows x N    the dictionary's own tokens (a selection: the class token first where it
                                            reads it, then the grid), or for a dictionary across models its cells
                                            (each cell the area-weighted mean of the grid tokens under it)
    X'      = X + W Δrows    W: N x rows    with R W = I, so the rows read back exactly what was written: W = Rᵀ for
                                            a selection, the pseudo-inverse R⁺ for cells

Tokens no row reads (registers, a class token a patch dictionary leaves out) pass through a site unchanged, and
so does whatever of a token a cell's mean does not see. With codes z = encode(rows) and the error
ε = rows - decode(z), a site's rows are exactly decode(z) + ε: the dictionary spliced in changes nothing until a
node is moved.

Sites are read from the trace and the dictionaries alone (`concepts.files.load`: own or across, every family), and
refused in words: a dictionary of another model, block or width, one that does not record its block, blocks not in
depth order, a dictionary across models at a block it was not trained on.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from ..concepts.activations.cache import block_index, default_tokens
from ..concepts.analysis.means import Means, file_name as means_file, load_means
from ..concepts.analysis.photo import cell_weights, cells_of, model_names
from ..concepts.analysis.splice import token_rows
from ..concepts.kinds.dictionary import ConceptsError, Dictionary, block_words
from ..models.trace import Trace


@dataclass(frozen=True)
class Site:
    """One dictionary in one model: its block (from 0), how it reads and writes the block's tokens, the grid of
    its rows on the photo, whether row 0 is the class token, and where it came from."""
    block: int
    dictionary: Dictionary
    read: Tensor          # rows x N
    write: Tensor         # N x rows
    grid: tuple[int, int]
    class_token: bool
    source: str
    across: bool = False
    means: Means | None = None   # each row's mean code and error over a data set: the "mean" baseline
    selected: Tensor | None = None   # the tokens the rows are, where R is a selection (read and written by index)

    @property
    def label(self) -> str:
        return block_words(self.block)

    def rows(self, tokens: Tensor) -> Tensor:
        """b N d block tokens -> b rows d, what the dictionary reads."""
        if self.selected is not None:
            return tokens[:, self.selected]
        return torch.einsum('rn,bnd->brd', self.read.to(tokens), tokens)

    def put(self, tokens: Tensor, change: Tensor) -> Tensor:
        """b N d tokens with a b rows d change of the rows written back."""
        if self.selected is not None:
            return tokens.index_add(1, self.selected, change.to(tokens))
        return tokens + torch.einsum('nr,brd->bnd', self.write.to(change), change)

    def row_gradient(self, grad: Tensor) -> Tensor:
        """b N d gradient at the block's tokens -> b rows d at the rows: Wᵀ g (X' = X + W Δrows)."""
        if self.selected is not None:
            return grad[:, self.selected]
        return torch.einsum('nr,bnd->brd', self.write.to(grad), grad)

    def baseline(self, kind: str, like_codes: Tensor, like_error: Tensor) -> tuple[Tensor, Tensor]:
        """(codes, error) a node is set to when it is taken out: zeros, or each row's mean over a data set."""
        if kind == "zero":
            return torch.zeros_like(like_codes), torch.zeros_like(like_error)
        if self.means is None:
            raise ConceptsError(f"The dictionary at {self.label} ({self.source}) has no mean activations "
                                f"(means.safetensors beside it, written by `vitviz concepts evaluate`): use the zero "
                                f"baseline, or evaluate it on a data set first.")
        codes, error = self.means.codes, self.means.error
        if codes.shape[0] != like_codes.shape[-2]:
            codes, error = (self.resampled(means) for means in (codes, error))
        return codes.to(like_codes).expand_as(like_codes), error.to(like_error).expand_as(like_error)

    def resampled(self, means: Tensor) -> Tensor:
        """Per-row means taken on another grid (square photos: a square grid, the class token first where the site
        reads one) resampled to this photo's grid, bilinearly, the class token's row kept: a photo of another shape
        cuts the tokens or cells into another grid, and a row's mean is a smooth function of where it lies."""
        head, cells = (means[:1], means[1:]) if self.class_token else (means[:0], means)
        side = round(cells.shape[0] ** 0.5)
        if side * side != cells.shape[0]:
            raise ConceptsError(f"The mean activations beside {self.source} have {means.shape[0]} rows, which are no "
                                f"square grid; this photo gives {self.grid[0]} x {self.grid[1]} at {self.label}: use "
                                f"the zero baseline.")
        grid = rearrange(cells, '(h w) c -> 1 c h w', h=side).float()
        moved = torch.nn.functional.interpolate(grid, size=self.grid, mode="bilinear", align_corners=False)
        return torch.cat([head, rearrange(moved, '1 c h w -> (h w) c').to(means)])


def sites_of(loaded, trace: Trace, dictionaries: Sequence[tuple[str, object]], *,
             image_size: tuple[int, int] | None = None, folders: Sequence[str | Path | None] | None = None,
             blocks: Sequence[int | None] | None = None) -> list[Site]:
    """The sites of `dictionaries` ((source, own or across dictionary) pairs, in depth order) in a loaded model, from
    a `trace` of it (any image of the model's input size); `image_size` (h, w): the photo's, which places a dictionary
    across models' cells on it; `folders`: where to find each one's means (None: none); `blocks`: where each is asked
    to go (None: the block it was trained on, the only one it is accepted at)."""
    from ..concepts.kinds.across import Across

    names = model_names(loaded)
    sites = []
    for position, (source, dictionary) in enumerate(dictionaries):
        across = isinstance(dictionary, Across)
        if across:
            part = next((dictionary.dictionaries[n] for n in dictionary.models if n in names), None)
            if part is None:
                raise ConceptsError(f"{source} is a dictionary across {', '.join(dictionary.models)}, not "
                                    f"{loaded.name}.")
        else:
            part = dictionary
        if part.block is None:
            raise ConceptsError(f"{source} does not record which block it was trained on, so a circuit cannot place "
                                f"it in {loaded.name}.")
        part.check_applies(model=loaded.name, block=part.block, width=part.d, names=names)   # the model first
        index = block_index(trace, part.block)
        asked = None if blocks is None or blocks[position] is None else block_index(trace, blocks[position])
        if across and asked is not None and asked != index:
            raise ConceptsError(f"{source} was trained across {', '.join(dictionary.models)} on {loaded.name}'s "
                                f"{block_words(index)}; its concepts mean nothing at {block_words(asked)}.")
        index = index if asked is None else asked
        part.check_applies(model=loaded.name, block=index, width=trace.blocks[index].tokens.shape[-1], names=names)
        out = trace.blocks[index]
        n = out.tokens.shape[1]
        if across:
            cells = cells_of(dictionary.training_record)
            if cells is None or image_size is None:
                raise ConceptsError(f"{source} does not record the cells it was trained on, so its rows cannot be "
                                    f"placed on the photo.")
            weights, grid = cell_weights(trace, index, cells=cells, transform=loaded.transform,
                                         image_size=image_size)
            read = torch.zeros(weights.shape[0], n, dtype=torch.float32)
            read[:, out.prefix:] = weights.float()
            write, class_token, selected = torch.linalg.pinv(read.double()).float(), False, None
        else:
            tokens = part.origin.tokens or default_tokens(out)
            rows = token_rows(out, tokens).cpu()
            read = torch.zeros(len(rows), n, dtype=torch.float32)
            read[torch.arange(len(rows)), rows] = 1.0
            write, class_token, grid, selected = read.T.clone(), "cls" in tokens, out.query_grid, rows
        folder = folders[position] if folders else None
        means = None
        if folder is not None:
            path = Path(folder) / means_file(loaded.name if across else None)
            means = load_means(path, part) if path.exists() else None
        part.to(loaded.device)
        sites.append(Site(block=index, dictionary=part, read=read.to(loaded.device), write=write.to(loaded.device),
                          grid=tuple(grid), class_token=class_token, source=str(source), across=across, means=means,
                          selected=None if selected is None else selected.to(loaded.device)))
    blocks = [site.block for site in sites]
    if any(later <= earlier for earlier, later in zip(blocks, blocks[1:])):
        raise ConceptsError(f"A circuit's dictionaries go from the first block to the last, each at its own block; "
                            f"these are at blocks {', '.join(map(str, blocks))}: give them in depth order, one a "
                            f"block.")
    return sites


def image_sites(loaded, image, sites_for) -> tuple[Tensor, Trace, list[Site]]:
    """An image's pixels for `loaded`, its trace (no attention maps) and its sites (`sites_for(trace, image)`): what
    work over many images starts each image with."""
    pixels = loaded.preprocess(image).to(loaded.device)
    with torch.inference_mode():
        trace = loaded.model.trace(pixels, attention=False)
    return pixels, trace, sites_for(trace, image)
