"""Moved to `vitviz.concepts.activations.align`.

This module only re-exports what vitviz/ui/gpu.py still imports from here (a file being
edited elsewhere); delete it once that file imports from `vitviz.concepts.activations.align`."""
from .activations.align import in_photo, token_rectangles

__all__ = ["in_photo", "token_rectangles"]
