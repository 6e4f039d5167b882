"""Moved to `vitviz.concepts.train.across`.

This module only re-exports what tests/test_host_syncs.py still imports from here (a file being
edited elsewhere); delete it once that file imports from `vitviz.concepts.train.across`."""
from .train.across import train_across

__all__ = ["train_across"]
