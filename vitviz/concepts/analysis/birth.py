"""When concepts appear: one dictionary across a training run's checkpoints (the dictionary across models, with the
checkpoints as its models: one architecture, so their grids match), read per concept and checkpoint.

    share[m, c] = Σ_t (z^m_tc)² ‖d^m_c‖² / Σ_t ‖x^m_t - x̄^m‖²

is the share of checkpoint m's variance that concept c's own term of the reconstruction carries (its codes from
checkpoint m's encoder, its direction from m's decoder; x̄ and the float64 sums as `metrics.py`'s FVU). Crosscoders
through time (Bayazit et al. 2025) read a feature's decoder norm per checkpoint; the share also weighs how often and
how strongly the concept fires there, so a direction the decoder keeps but the encoder never uses counts for nothing.

A concept is **born** at the first checkpoint from which its share stays at least `BORN_FROM` (half) of its share at
the last checkpoint, at every later one. A concept whose share at the last checkpoint is below `FLOOR` (1e-4 of the
variance) is not part of the trained model: it has no birth. The concepts that **exist** at a checkpoint are those
born at or before it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..activations.batches import Activations, aligned, aligned_count, batches, refuse_unlike_models
from ..kinds.across import Across
from ..kinds.dictionary import ConceptsError
from .across import _Spread

BORN_FROM = 0.5   # of its share at the end, kept from its birth on
FLOOR = 1e-4      # the share at the end below which a concept is not part of the trained model


def run_steps(models: Sequence[str]) -> list[int] | None:
    """The optimiser steps of a dictionary's models when they are checkpoints of one run (`<model>@<step>`, one
    `<model>`, steps rising), else None."""
    parts = [name.rpartition("@") for name in models]
    if len(parts) < 2 or any(not at or not step.isdigit() for _, at, step in parts):
        return None
    steps = [int(step) for _, _, step in parts]
    if len({base for base, _, _ in parts}) != 1 or steps != sorted(set(steps)):
        return None
    return steps


@torch.no_grad()
def concept_shares(across: Across, activations: Sequence[Activations], *, batch_size: int = 4096) -> Tensor:
    """M n float64: each concept's share of each model's variance (the module docstring), over aligned raw
    `activations` (one per model in `across.models`' order), streamed in batches of `batch_size` rows."""
    models = across.models
    refuse_unlike_models(activations, models)
    aligned_count(activations, models)
    device = across.per_model[0].W_enc.device
    spreads = [_Spread() for _ in models]
    energy = torch.zeros(len(models), across.n_concepts, dtype=torch.float64, device=device)
    if any(d.normalisation.per_token for d in across.per_model):
        raise ConceptsError("A concept's share of a checkpoint's variance needs one scale per checkpoint: this "
                            "dictionary normalises each token by its own statistics.")
    # a concept's term in raw activations is z_c · W_dec[c] · scale (kinds/dictionary.py)
    norms = torch.stack([d.W_dec.norm(dim=1) * d.normalisation.scale for d in across.per_model]).double()   # M n
    for rows in aligned([batches(a, batch_size) for a in activations], models):
        for m, (dictionary, spread, x) in enumerate(zip(across.per_model, spreads, rows)):
            x = x.to(device)
            dictionary.check_width(x.shape[1])
            spread.add(x)
            energy[m] += dictionary.encode(x).double().square().sum(0)
    spread = torch.stack([s.total() for s in spreads])
    for model, value in zip(models, spread.tolist()):
        if not value > 0:
            raise ConceptsError(f"The tokens of {model} evaluated are all the same vector: no share of their "
                                f"variance can be carried.")
    return (energy * norms.square() / spread[:, None]).cpu()


def born_at(shares: Tensor, steps: Sequence[int], *, born_from: float = BORN_FROM,
            floor: float = FLOOR) -> list[int | None]:
    """Per concept, the step of its birth (the module docstring), or None where it is not part of the trained
    model. `shares`: M n, the checkpoints in training order; `steps`: theirs."""
    if len(shares) != len(steps):
        raise ValueError(f"{len(shares)} checkpoints' shares for {len(steps)} steps")
    final = shares[-1]
    kept = shares >= born_from * final   # M n
    # from each checkpoint on, whether every later one keeps it: a reversed running "and"
    stays = kept.flip(0).int().cummin(dim=0).values.flip(0).bool()
    first = torch.where(stays.any(0), stays.int().argmax(0), len(steps) - 1)
    return [None if final[c] < floor else int(steps[first[c]]) for c in range(shares.shape[1])]


def existing(births: Sequence[int | None], steps: Sequence[int]) -> list[int]:
    """How many concepts exist at each step: those born at or before it."""
    return [sum(1 for b in births if b is not None and b <= step) for step in steps]


def births(across: Across, activations: Sequence[Activations], steps: Sequence[int]) -> dict:
    """What `concepts evaluate` writes of a dictionary across a run's checkpoints: the steps, each concept's share
    of each checkpoint's variance (steps x concepts), each concept's birth and how many exist at each step."""
    shares = concept_shares(across, activations)
    born = born_at(shares, steps)
    return {"steps": list(steps), "born_from": BORN_FROM, "floor": FLOOR, "born_at": born,
            "existing": existing(born, steps), "share": [[float(f"{v:.4g}") for v in row] for row in shares.tolist()]}
