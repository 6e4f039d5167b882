"""Moved to `vitviz.concepts.analysis.match`.

This module only re-exports what vitviz/ui/gpu.py still imports from here (a file being
edited elsewhere); delete it once that file imports from `vitviz.concepts.analysis.match`."""
from .analysis.match import Matches, folder_name

__all__ = ["Matches", "folder_name"]
