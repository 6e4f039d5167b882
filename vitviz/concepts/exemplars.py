"""Moved to `vitviz.concepts.analysis.exemplars`.

This module only re-exports what vitviz/ui/gpu.py still imports from here (a file being
edited elsewhere); delete it once that file imports from `vitviz.concepts.analysis.exemplars`."""
from .analysis.exemplars import Exemplars, file_name, load_exemplars

__all__ = ["Exemplars", "file_name", "load_exemplars"]
