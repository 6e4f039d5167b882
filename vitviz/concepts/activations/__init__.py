"""Activations, what dictionaries are trained and read on: which tokens of which block, from the trace of any family,
and their cache on disk (`cache.py`, `cache_activations`); two or more models' grids resampled onto the cells they
share (`align.py`); tensors or iterables cut into batches of tokens, and several models' aligned batches side by
side (`batches.py`); a cached layer streamed shard by shard (`stream.py`); the reductions over torchrun's ranks that
make a data-parallel training step one process's (`parallel.py`)."""
from .cache import cache_activations, cache_blocks

__all__ = ["cache_activations", "cache_blocks"]
