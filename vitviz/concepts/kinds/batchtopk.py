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

Under torchrun each rank holds a share of the batch (`activations/parallel.py`). The codes keep the entries at or above
the cut c, the k·t-th largest pre-activation of the whole batch, found among the ranks' gathered top k·t:
Z = ReLU(PRE) · 1[PRE >= c], the same entries one process keeps (pre-activations bitwise equal at the cut
are all kept, where one process keeps as many of them as fill k·t). The smallest kept code is taken over
the ranks, so θ moves the same everywhere.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..activations import parallel
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
        self._threshold_checked: tuple[Tensor, int] | None = None   # (the buffer, its version) last seen set

    def settings(self) -> dict:
        return {"k": self.k, "threshold_rate": self.threshold_rate}

    def activation(self, pre: Tensor) -> Tensor:
        # whether the threshold was ever set is read from the device once, not at every batch: again only after the
        # buffer was changed (a training step, a load) or replaced (a move to another device)
        seen = (self.threshold, self.threshold._version)
        if self._threshold_checked is None or self._threshold_checked[0] is not seen[0] or \
                self._threshold_checked[1] != seen[1]:
            if self.threshold.item() == UNSET:
                raise ConceptsError("This BatchTopK dictionary has no inference threshold yet: it was never trained, "
                                    "and its threshold is estimated while training.")
            self._threshold_checked = seen
        return pre * (pre > self.threshold.to(pre.dtype))

    def training_activation(self, pre: Tensor) -> Tensor:
        if not parallel.active():
            kept = min(self.k * len(pre), pre.numel())
            return top_k_relu(pre.flatten(), kept).view_as(pre)
        tokens = int(parallel.total(torch.tensor(len(pre), device=pre.device)))
        cut = parallel.kth_largest(pre.detach().flatten(), self.k * tokens)
        return torch.relu(pre) * (pre >= cut)

    @torch.no_grad()
    def observe(self, codes: Tensor) -> None:
        # the smallest kept code, over the ranks' shares of the batch (inf: nothing kept anywhere), folded into the
        # threshold on the device: a branch on it would wait for the device every step
        own = codes.masked_fill(codes <= 0, torch.inf).amin().double() if codes.numel() else \
            codes.new_full((), torch.inf, dtype=torch.float64)   # a rank's share can be empty
        smallest = parallel.smallest(own)
        moved = torch.where(self.threshold == UNSET, smallest,
                            self.threshold + self.threshold_rate * (smallest - self.threshold))
        self.threshold.copy_(torch.where(smallest.isinf(), self.threshold, moved))
