"""The dictionary kinds: what every kind shares (`dictionary.py`), one module per kind (`standard`, `topk`,
`batchtopk`, `jumprelu`) and the dictionary across models (`across.py`, a `Dictionary` per model over one code
space); here, the kinds by name, as files and `train(kind=...)` name them. A new kind is a module over
`Dictionary` and a line in `KINDS` (or `FILE_KINDS`, for a kind vitviz only reads)."""
from __future__ import annotations

from .batchtopk import BatchTopK
from .dictionary import ConceptsError, Dictionary
from .jumprelu import JumpReLU
from .standard import Standard
from .topk import TopK

KINDS: dict[str, type[Dictionary]] = {cls.kind: cls for cls in (Standard, TopK, BatchTopK)}   # those `train` makes
FILE_KINDS: dict[str, type[Dictionary]] = {**KINDS, JumpReLU.kind: JumpReLU}   # and those read from other tools


def kind_named(kind: str, *, reading: bool = False) -> type[Dictionary]:
    """The class of a kind's name, or a ConceptsError naming the kinds there are: those `train` makes, and when
    `reading` a file also those vitviz only reads (JumpReLU, from SAELens)."""
    kinds = FILE_KINDS if reading else KINDS
    if kind not in kinds:
        raise ConceptsError(f"There is no dictionary kind {kind!r}; the kinds are {', '.join(kinds)}.")
    return kinds[kind]
