"""TopK dictionaries (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"): each token keeps its k
largest pre-activations, through a ReLU, and nothing else.

    z = ReLU(TopK_k(pre))        TopK_k keeps the k largest entries of the token's pre, zeroes the rest

So L0 <= k by construction, and no penalty is needed. A concept that stops winning a place in any
token's top k gets no gradient and dies; training's AuxK loss (Gao et al., section A.2) revives it.
Overcomplete's `TopKSAE` and SAELens's `topk` compute the same codes (ReLU before or after the top k
gives the same values: a negative pre-activation that is kept becomes 0 either way).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .dictionary import UNKNOWN, ConceptsError, Dictionary, Origin


def top_k_relu(values: Tensor, k: int) -> Tensor:
    """The k largest of `values`' last dimension through a ReLU, the rest 0 (the ReLU on the k kept alone)."""
    top = values.topk(k, dim=-1)
    return torch.zeros_like(values).scatter(-1, top.indices, torch.relu(top.values))


class TopK(Dictionary):
    """The k largest pre-activations of each token, through a ReLU."""

    kind = "topk"

    def __init__(self, d: int, n_concepts: int, *, k: int, origin: Origin = UNKNOWN):
        super().__init__(d, n_concepts, origin=origin)
        if not 0 < k <= n_concepts:
            raise ConceptsError(f"k = {k} concepts per token is not possible in a dictionary of {n_concepts}: "
                                f"k must be between 1 and the number of concepts.")
        self.k = k

    def settings(self) -> dict:
        return {"k": self.k}

    def activation(self, pre: Tensor) -> Tensor:
        return top_k_relu(pre, self.k)
