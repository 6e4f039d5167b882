"""One dictionary across models (Thasarathan et al. 2025, "Universal Sparse Autoencoders: Interpretable
Cross-Model Concept Alignment"): one code space, so that concept i means the same thing in every model.

    across = train_across([vit_tokens, cvt_tokens], models=["vit-cifar10", "cvt-cifar10"], blocks=[-1, -1],
                          tokens=["patch", "patch"], kind="topk", k=32, expansion=8)
    codes = across.encode(vit_tokens, "vit-cifar10")        # ViT's raw tokens -> the shared codes
    as_cvt = across.decode(codes, "cvt-cifar10")            # -> CvT's raw activation space
    across_metrics(across, [vit_held_out, cvt_held_out])    # R² matrix, firing entropy, shared concepts
    save_across(across, "dictionaries/vit+cvt"); read(Path("dictionaries/vit+cvt"))

The dictionary. M models read the same places: row r of every model's activations x^m (t d_m) is the same
cell of the same image (the caller has resampled the models' grids onto common cells). Each model has an
ordinary `Dictionary` of one kind (TopK or BatchTopK) with the same n concepts, its own normalisation
(fitted on its own tokens, `Normalisation.fit`) and its own weights, and all share the codes:

    x̃^m  = (x^m - offset_m) / scale_m                        model m's normalisation
    z    = σ_m((x̃^m - b_dec^m) W_enc^m + b_enc^m)            n codes, the space every model shares
    x̂^j  = (z W_dec^j + b_dec^j) · scale_j + offset_j        model j's reconstruction of the same place


Its parts live with their jobs: training in `train/across.py` (the loss, why it aligns, the algorithm), the
metrics in `analysis/across.py`, the folder it is saved in in `files/across.py`.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from .dictionary import ConceptsError, Dictionary


class Across(nn.Module):
    """One dictionary across models: an ordinary `Dictionary` per model, all of one kind and n concepts,
    sharing one code space (concept i means the same thing in every model). Each one's `origin` names its
    model, which must differ from the others'; `models` keeps their order."""

    def __init__(self, dictionaries: Sequence[Dictionary]):
        super().__init__()
        names = [dictionary.origin.model for dictionary in dictionaries]
        refuse_model_names(names)
        first = dictionaries[0]
        for name, dictionary in zip(names[1:], dictionaries[1:]):
            if dictionary.kind != first.kind:
                raise ConceptsError(f"The dictionaries are of different kinds: {names[0]}'s is {first.kind}, "
                                    f"{name}'s {dictionary.kind}; an across dictionary has one kind.")
            if dictionary.n_concepts != first.n_concepts:
                raise ConceptsError(f"The models' dictionaries have different numbers of concepts: {names[0]}'s "
                                    f"has {first.n_concepts}, {name}'s {dictionary.n_concepts}; an across "
                                    f"dictionary's models share one code space.")
        self.per_model = nn.ModuleList(dictionaries)
        self.training_record: dict | None = None   # how it was trained (`train_across` fills it; files keep it)

    @property
    def models(self) -> tuple[str, ...]:
        """The models' names, in order."""
        return tuple(dictionary.origin.model for dictionary in self.per_model)

    @property
    def dictionaries(self) -> dict[str, Dictionary]:
        """Each model's dictionary, by name, in model order."""
        return dict(zip(self.models, self.per_model))

    @property
    def n_concepts(self) -> int:
        """The size of the shared code space."""
        return self.per_model[0].n_concepts

    @property
    def kind(self) -> str:
        return self.per_model[0].kind

    @property
    def d(self) -> tuple[int, ...]:
        """Each model's activation width, in model order (a `Dictionary`'s d, one per model)."""
        return tuple(dictionary.d for dictionary in self.per_model)

    def dictionary(self, model: str) -> Dictionary:
        """The dictionary of `model`, or a ConceptsError naming the models there are."""
        if model not in self.models:
            raise ConceptsError(f"This dictionary across models has no {model!r}; its models are "
                                f"{', '.join(self.models)}.")
        return self.per_model[self.models.index(model)]

    def encode(self, x: Tensor, model: str) -> Tensor:
        """`model`'s raw activations (..., d_model) -> the shared non-negative codes (..., n)."""
        return self.dictionary(model).encode(x)

    def decode(self, codes: Tensor, model: str) -> Tensor:
        """Shared codes (..., n) -> `model`'s raw activation space (..., d_model)."""
        return self.dictionary(model).decode(codes)


def refuse_model_names(names: Sequence[str | None]) -> None:
    """A ConceptsError unless `names` name two models or more, each once."""
    if len(names) < 2:
        raise ConceptsError(f"A dictionary across models needs two models or more; {len(names)} given.")
    if None in names:
        raise ConceptsError(f"The dictionary at position {list(names).index(None)} does not record its model; each "
                            f"dictionary of an across dictionary is named by its model.")
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConceptsError(f"{twice} is named twice; an across dictionary holds one dictionary per model.")
