"""The dictionary kinds by name, as files and `train(kind=...)` name them."""
from __future__ import annotations

from .batchtopk import BatchTopK
from .dictionary import ConceptsError, Dictionary
from .standard import Standard
from .topk import TopK

KINDS: dict[str, type[Dictionary]] = {cls.kind: cls for cls in (Standard, TopK, BatchTopK)}


def kind_named(kind: str) -> type[Dictionary]:
    """The class of a kind's name, or a ConceptsError naming the kinds there are."""
    if kind not in KINDS:
        raise ConceptsError(f"There is no dictionary kind {kind!r}; the kinds are {', '.join(KINDS)}.")
    return KINDS[kind]
