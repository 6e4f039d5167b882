"""SAELens's "standard" dictionary: a ReLU, made sparse by an L1 penalty on the codes while training.

    z = ReLU(pre)

The penalty (training's `l1`) is on Σ_i z_i ‖W_dec[i]‖ (Bricken et al. 2023, SAELens); with the rows of
W_dec at unit norm it is the codes' sum. Nothing caps how many concepts fire: vision dictionaries of this
kind often have an L0 in the hundreds.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .dictionary import Dictionary


class Standard(Dictionary):
    """ReLU codes; sparse by the L1 penalty of training (`penalised`)."""

    kind = "standard"
    penalised = True

    def activation(self, pre: Tensor) -> Tensor:
        return torch.relu(pre)
