"""Concepts: sparse dictionaries (sparse autoencoders) of a layer's activations, for every family vitviz loads.

    from vitviz import concepts
    dictionary = concepts.train(activations, kind="topk", k=32, expansion=8, model="vit-cifar10", block=6,
                                tokens="patch", checkpoint="runs/vit.ckpt")
    concepts.save(dictionary, "dictionaries/vit-cifar10")
    dictionary = concepts.load("dictionaries/vit-cifar10")   # or a catalog name, or a Hub id (SAELens, saev, Prisma)
    codes = dictionary.encode(tokens)          # raw activations (..., d) -> non-negative codes (..., n)
    tokens_back = dictionary.decode(codes)     # codes -> raw activation space (beside the tokens, tokens=,
                                               # for a published one that normalises each token by its own)
    concepts.metrics(dictionary, held_out)     # FVU, L0, dead and dense shares

A sparse autoencoder splits each token's activation vector into a few of n learned directions, its
concepts (Bricken et al. 2023; Gao et al. 2024), so that what a layer represents can be read one
concept at a time. The rooms, in the order the work flows:

- `kinds/`: `standard` (ReLU + L1, SAELens's name), `topk` (Gao et al. 2024), `batchtopk` (Bussmann et al.
  2024) and `jumprelu` (read from published files), one module each over `dictionary.py`'s base, whose
  docstring has the formulas and the normalisation every file carries; `across.py` (one dictionary across
  models, Thasarathan et al. 2025); the kinds by name in `__init__.py`;
- `activations/`: `cache.py`, which tokens of which block a dictionary reads, from the trace of any family, and
  the on-disk cache of them; `align.py`, two or more models' grids resampled onto the cells they share;
  `batches.py`, `stream.py` (a cached layer streamed shard by shard) and `parallel.py` (torchrun's reductions);
- `train/`: `single.py` (`train`: the loss, AuxK, unit-norm decoder rows, data-parallel under torchrun) and
  `across.py` (`train_across`), through one loop, `loop.py` (the schedule, checkpoints that resume exactly);
- `analysis/`: `metrics.py` (`across.py`: an across dictionary's), `splice.py` (spliced-in agreement and KL,
  removing a concept), `match.py` (pairing two dictionaries' concepts), `exemplars.py` (each concept's top
  images), `names.py` (a name for each concept from its top images' classes, or CLIP's nearest words) and
  `photo.py` (one photo's concepts);
- `files/`: `load` (`__init__.py`, through the reader of each layout: `layout.Reader`), `own.py` (vitviz's
  format), `across.py` (an across dictionary's folder), one reader per published layout (`saelens.py`,
  `saev.py`, `prisma.py`, sharing `layout.py`) and the Hub (`hub.py`);
- `build.py`: what `python -m vitviz concepts train / exemplars / evaluate` do.
"""
from .analysis.metrics import Metrics, metrics
from .files import load
from .files.own import save
from .kinds import KINDS
from .kinds.across import Across
from .kinds.batchtopk import BatchTopK
from .kinds.dictionary import ConceptsError, Dictionary, Normalisation, Origin, TokenNormalisation
from .kinds.jumprelu import JumpReLU
from .kinds.standard import Standard
from .kinds.topk import TopK
from .train import train

__all__ = ["KINDS", "Across", "BatchTopK", "ConceptsError", "Dictionary", "JumpReLU", "Metrics", "Normalisation",
           "Origin", "Standard", "TokenNormalisation", "TopK", "load", "metrics", "save", "train"]
