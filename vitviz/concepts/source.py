"""`load(source)`: a dictionary file or folder -> a `Dictionary`, through the reader of its layout.

A reader is a module with `matches(path) -> bool` and `read(path) -> Dictionary` for one layout, as
`vitviz.hub` has one per checkpoint layout; `READERS` lists them in the order they are tried, and the
first that matches reads. None runs code from the file: no layout is unpickled.
"""
from __future__ import annotations

from pathlib import Path

from . import own
from .dictionary import ConceptsError, Dictionary

READERS = (own,)
WHAT_LOADS = (f"vitviz reads its own dictionaries: a .safetensors file written by vitviz.concepts.save, or a folder "
              f"holding {own.FILE}")


def load(source: str | Path) -> Dictionary:
    """A dictionary file or a folder holding one -> the dictionary, in eval mode on the CPU. Raises
    `ConceptsError` for anything a person can fix or should know: a missing, damaged or foreign file."""
    path = Path(source).expanduser()
    if not path.exists():
        raise ConceptsError(f"There is no file or folder {str(source)!r}.")
    for reader in READERS:
        if reader.matches(path):
            try:
                return reader.read(path)
            except OSError as e:
                raise ConceptsError(f"{path} could not be read ({e.strerror or e}).") from None
    raise ConceptsError(f"{path} is not a dictionary vitviz reads; {WHAT_LOADS}.")
