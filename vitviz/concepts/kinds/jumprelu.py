"""JumpReLU dictionaries (Rajamanoharan et al. 2024, "Jumping Ahead: Improving Reconstruction Fidelity with JumpReLU
Sparse Autoencoders"): a ReLU times a step at each concept's own threshold.

    z_i = ReLU(pre_i) · 1[pre_i > θ_i]        θ n: one threshold per concept, a buffer

which is pre_i · 1[pre_i > θ_i] wherever θ_i >= 0, as learned thresholds are; the ReLU keeps the codes
non-negative whatever θ holds. These are SAELens's `jumprelu` codes (`JumpReLUSAE.encode`: the ReLU, then the mask
of pre > threshold), and SAELens writes a trained BatchTopK as one, every θ_i its learned threshold.

vitviz reads these dictionaries from other tools' files and keeps them in its own; it does not train them (the
threshold's straight-through gradient is not implemented), so `KINDS` (`__init__.py`), the kinds `train` takes,
leaves it out.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .dictionary import UNKNOWN, Dictionary, Origin


class JumpReLU(Dictionary):
    """ReLU codes kept where they pass their concept's threshold."""

    kind = "jumprelu"

    def __init__(self, d: int, n_concepts: int, *, origin: Origin = UNKNOWN):
        super().__init__(d, n_concepts, origin=origin)
        self.register_buffer("threshold", torch.zeros(n_concepts))

    def activation(self, pre: Tensor) -> Tensor:
        return torch.relu(pre) * (pre > self.threshold.to(pre.dtype))
