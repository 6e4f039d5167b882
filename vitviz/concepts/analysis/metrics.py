"""How well a dictionary explains activations, and how it uses its concepts: `metrics(dictionary, activations)`.

Over the T evaluated tokens x_t (raw activations, d wide) with reconstructions x̂_t = decode(encode(x_t))
and codes z_t (n wide):

    FVU  = Σ_t ‖x_t - x̂_t‖² / Σ_t ‖x_t - x̄‖²       x̄ the per-dimension mean over the T tokens
    explained variance = 1 - FVU
    L0   = (1/T) Σ_t #{i : z_ti > 0}                 concepts firing per token, on average
    firing_i = (1/T) #{t : z_ti > 0}                 the share of tokens concept i fires on
    dead  = #{i : firing_i = 0} / n                  concepts that never fire on these tokens
    dense = #{i : firing_i > 1 %} / n                concepts that fire on more than 1 % of them

The same words mean other numbers elsewhere, so these are written out: saev's normalised MSE is this
FVU; Overcomplete's `r2_score` subtracts one scalar mean over all entries instead of x̄ (for
x = [[0, 10], [2, 10]], x̂ = [[1, 10], [1, 10]] it gives 1 - 2/83 = 0.976 where the FVU is 2/2 = 1:
the reconstruction explains none of the variation within the dimensions); ViT-Prisma's explained
variance is computed per token and averaged.

Streaming. The activations come in batches and nothing grows with T but counts: the sums are kept in
float64, the spread about a shift c (the first batch's mean) so that a large common offset does not
cancel away the digits of a small variance,

    Σ_t ‖x_t - x̄‖² = Σ_t ‖x_t - c‖² - T ‖x̄ - c‖²,     x̄ = c + (1/T) Σ_t (x_t - c)

and the errors x_t - x̂_t are squared and summed in float64 too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..activations.batches import Activations, batches
from ..kinds.dictionary import ConceptsError, Dictionary

DENSE_ABOVE = 0.01   # a concept firing on more than this share of tokens is dense


@dataclass(frozen=True)
class Metrics:
    """`metrics`' numbers, each defined in the module docstring."""
    fvu: float             # fraction of variance unexplained
    l0: float              # concepts firing per token, on average
    dead: float            # share of concepts that never fire
    dense: float           # share of concepts firing on more than `dense_above` of the tokens
    tokens: int            # how many tokens were evaluated
    firing: Tensor         # n: the share of tokens each concept fires on (float64)

    @property
    def explained_variance(self) -> float:
        return 1.0 - self.fvu

    def to_dict(self) -> dict:
        """The scalars, for a log line or a model card."""
        return {"fvu": self.fvu, "explained_variance": self.explained_variance, "l0": self.l0,
                "dead": self.dead, "dense": self.dense, "tokens": self.tokens}


@torch.no_grad()
def metrics(dictionary: Dictionary, activations: Activations, *, batch_size: int = 4096,
            dense_above: float = DENSE_ABOVE) -> Metrics:
    """FVU, L0, dead and dense shares of `dictionary` over `activations` (raw, as `encode` takes them: a
    tensor (..., d) or an iterable of batches), streamed in batches of `batch_size` tokens. Refused when the
    tokens do not vary (the FVU's denominator is 0)."""
    device = dictionary.W_enc.device
    tokens, shift = 0, None
    error_sum, spread_sum = (torch.zeros((), dtype=torch.float64, device=device) for _ in range(2))
    offset_sum = torch.zeros(dictionary.d, dtype=torch.float64, device=device)
    fires = torch.zeros(dictionary.n_concepts, dtype=torch.int64, device=device)
    for x in batches(activations, batch_size):   # sums kept on the device: read once, after the last batch
        dictionary.check_width(x.shape[1])
        x = x.to(device)
        codes = dictionary.encode(x)
        error_sum += (x.double() - dictionary.decode(codes, x).double()).square().sum()
        x = x.double()
        if shift is None:
            shift = x.mean(0)
        centred = x - shift
        spread_sum += centred.square().sum()
        offset_sum += centred.sum(0)
        fires += (codes > 0).sum(0)
        tokens += len(x)
    totals = torch.cat([torch.stack([error_sum, spread_sum, offset_sum.square().sum()]), fires.double()]).tolist()
    errors, spread = totals[0], totals[1] - totals[2] / tokens
    if not spread > 0:
        raise ConceptsError(f"The {tokens} tokens evaluated are all the same vector, so no fraction of their "
                            f"variance can be explained.")
    firing = np.array(totals[3:]) / tokens
    n = dictionary.n_concepts
    return Metrics(fvu=errors / spread, l0=sum(totals[3:]) / tokens, dead=np.count_nonzero(firing == 0) / n,
                   dense=np.count_nonzero(firing > dense_above) / n, tokens=tokens, firing=torch.from_numpy(firing))
