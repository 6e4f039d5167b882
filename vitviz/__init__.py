"""vitviz: see inside vision transformers."""
__version__ = "0.1.0"

from .hub import LoadedModel, LoadError, load

__all__ = ["LoadError", "LoadedModel", "load", "__version__"]
