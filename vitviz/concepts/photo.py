"""Moved to `vitviz.concepts.analysis.photo`.

This module only re-exports what vitviz/ui/gpu.py still imports from here (a file being
edited elsewhere); delete it once that file imports from `vitviz.concepts.analysis.photo`."""
from .analysis.photo import PhotoConcepts, Reader, readers, shared_concepts

__all__ = ["PhotoConcepts", "Reader", "readers", "shared_concepts"]
