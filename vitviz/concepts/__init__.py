"""Concepts: sparse dictionaries (sparse autoencoders) of a layer's activations, for every family vitviz loads.

    from vitviz import concepts
    dictionary = concepts.train(activations, kind="topk", k=32, expansion=8, model="vit-cifar10", block=-1,
                                tokens="patch", checkpoint="runs/vit.ckpt")
    concepts.save(dictionary, "dictionaries/vit-cifar10")
    dictionary = concepts.load("dictionaries/vit-cifar10")
    codes = dictionary.encode(tokens)          # raw activations (..., d) -> non-negative codes (..., n)
    tokens_back = dictionary.decode(codes)     # codes -> raw activation space
    concepts.metrics(dictionary, held_out)     # FVU, L0, dead and dense shares

A sparse autoencoder splits each token's activation vector into a few of n learned directions, its
concepts (Bricken et al. 2023; Gao et al. 2024), so that what a layer represents can be read one
concept at a time. The kinds: `standard` (ReLU + L1, SAELens's name), `topk` (Gao et al. 2024) and
`batchtopk` (Bussmann et al. 2024), one module each over `dictionary.py`'s base, whose docstring has
the formulas and the normalisation every file carries. `train.py` trains (AuxK for dead concepts,
unit-norm decoder rows, checkpoints that resume exactly), `metrics.py` measures, `own.py` is vitviz's
file and `source.py` loads a file or folder through the reader of its layout.
"""
from .batchtopk import BatchTopK
from .dictionary import ConceptsError, Dictionary, Normalisation, Origin
from .kinds import KINDS
from .metrics import Metrics, metrics
from .own import save
from .source import load
from .standard import Standard
from .topk import TopK
from .train import train

__all__ = ["KINDS", "BatchTopK", "ConceptsError", "Dictionary", "Metrics", "Normalisation", "Origin", "Standard",
           "TopK", "load", "metrics", "save", "train"]
