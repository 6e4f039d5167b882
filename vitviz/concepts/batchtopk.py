"""BatchTopK dictionaries (Bussmann, Leask & Nanda 2024, "BatchTopK Sparse Autoencoders"): k concepts per
token on average over a batch while training, a JumpReLU at inference.

Training. The codes of a batch of t tokens keep its k·t largest ReLU'd pre-activations, wherever they are:

    Z = TopK_{k t}(ReLU(PRE))        over all t·n entries of the batch at once

so a busy token may use more than k concepts and a plain one fewer. The same as Overcomplete's
`BatchTopKSAE` in training mode (there `top_k` counts the whole batch's kept entries) and SAELens's
`batchtopk`.

Inference. A token's codes must not depend on which tokens share its batch, so the top k·t becomes a
threshold θ, one for every concept: the codes are a JumpReLU (Rajamanoharan et al. 2024)

    z_i = pre_i · 1[pre_i > θ]

with θ estimated during training as SAELens does: after each batch, θ moves a share `rate` (0.01) of
the way towards the smallest code the batch kept, θ ← θ + rate (min_kept − θ) (the first batch sets
it). Bussmann et al. average the same minimum over batches; Overcomplete keeps a moving average of the
k·t-th value. A saved BatchTopK is SAELens's JumpReLU with every concept's threshold θ.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .dictionary import UNKNOWN, ConceptsError, Origin
from .topk import TopK, top_k_relu

UNSET = -1.0   # the threshold before the first training batch
THRESHOLD_RATE = 0.01   # SAELens's `topk_threshold_lr`


class BatchTopK(TopK):
    """k concepts per token on average over a training batch; a JumpReLU at the learned threshold after."""

    kind = "batchtopk"

    def __init__(self, d: int, n_concepts: int, *, k: int, threshold_rate: float = THRESHOLD_RATE,
                 origin: Origin = UNKNOWN):
        super().__init__(d, n_concepts, k=k, origin=origin)
        self.threshold_rate = threshold_rate
        self.register_buffer("threshold", torch.tensor(UNSET, dtype=torch.float64))

    def settings(self) -> dict:
        return {"k": self.k, "threshold_rate": self.threshold_rate}

    def activation(self, pre: Tensor) -> Tensor:
        if self.threshold.item() == UNSET:
            raise ConceptsError("This BatchTopK dictionary has no inference threshold yet: it was never trained, "
                                "and its threshold is estimated while training.")
        return pre * (pre > self.threshold.to(pre.dtype))

    def training_activation(self, pre: Tensor) -> Tensor:
        kept = min(self.k * len(pre), pre.numel())
        return top_k_relu(pre.flatten(), kept).view_as(pre)

    @torch.no_grad()
    def observe(self, codes: Tensor) -> None:
        kept = codes[codes > 0]
        if kept.numel() == 0:
            return
        smallest = kept.min().double()
        if self.threshold.item() == UNSET:
            self.threshold.copy_(smallest)
        else:
            self.threshold.add_(self.threshold_rate * (smallest - self.threshold))
