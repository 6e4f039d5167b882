"""The metrics of one dictionary across models (`across_metrics`; the dictionary itself: `kinds/across.py`), over T
aligned rows:

    R²[i, j]  = 1 - FVU(x^j, decode_j(encode_i(x^i)))     FVU as `metrics.py`: Σ_t ‖x - x̂‖² / Σ_t ‖x - x̄‖²,
                                                           x̄ model j's per-dimension mean, float64
    f[m, c]   = (1/T) #{t : z^m_tc > 0}                    the share of model m's tokens concept c fires on
    p[m, c]   = f[m, c] / Σ_m' f[m', c]                    where concept c fires over all models
    H[c]      = -Σ_m p[m, c] log p[m, c] / log M           (0 log 0 = 0); NaN for a concept that fires on no
                                                           model's tokens (it has no share to spread)
    co[c]     = mean over the model pairs (a, b) of         its co-firing: for each pair of models, of the rows
                #{t : z^a_tc > 0 and z^b_tc > 0}           where it fires in either, the share where it fires
              / #{t : z^a_tc > 0 or z^b_tc > 0}            in both (their Jaccard index); NaN: fires nowhere
    shared    = #{c : H[c] >= SHARED_FROM and co[c] >= COFIRING_FROM} / n
    specific_m = #{c : H[c] <= SPECIFIC_TO and m = argmax_m' p[m', c]} / n

with L0 and the dead share of each model's codes as `metrics.py` defines them. The shares are of all n
concepts: shared + Σ_m specific_m + the in-between (paired concepts among them) + `unused` (firing on no
model) = 1. The thresholds, for two models: H >= 0.9 when the less-used model has at least 32 % of the
firing (H(0.32, 0.68) = 0.904), and H <= 0.3 when one model has at least 95 % of it (H(0.05, 0.95) =
0.286); for four models, a concept used by one model 90 % of the time and by the other three equally has
H = 0.31. Co-firing >= 0.25: a shared concept's encoders agree on where it is at least a quarter of the
time (on the planted pair of the tests they agree 0.6-0.9 of the time; a paired concept's, whose two
firings are independent, 0-0.1: about the product of its two firing rates over their sum). Averaged over
pairs, so that with four models a concept three of them share at the same places still counts (the share
of rows where all M fire at once falls fast with M: under 0.19 for every concept of the bundled four-way
dictionary); for two models it is that share.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..activations.batches import Activations, aligned, aligned_count, batches, refuse_unlike_models
from ..kinds.across import Across
from ..kinds.dictionary import ConceptsError

SHARED_FROM = 0.9    # firing entropy from which a concept is shared by the models (module docstring)
SPECIFIC_TO = 0.3    # firing entropy up to which a concept is its most-firing model's own
COFIRING_FROM = 0.25   # co-firing from which a concept of high firing entropy is shared (not paired)


@dataclass(frozen=True)
class AcrossMetrics:
    """`across_metrics`' numbers, each defined in the module docstring."""
    models: tuple[str, ...]
    r2: Tensor                          # M M float64: entry i, j = 1 - FVU of model j's tokens from model i's codes
    firing: Tensor                      # M n float64: the share of model m's tokens each concept fires on
    entropy: Tensor                     # n float64: each concept's firing entropy over the models; NaN: fires on none
    cofiring: Tensor                    # n float64: per model pair, of the rows where it fires in either, the share
                                        # where it fires in both, averaged over the pairs; NaN: fires nowhere
    shared_concepts: Tensor             # the shared concepts (int64 indices): high entropy and co-firing
    specific_concepts: dict[str, Tensor]   # each model's own concepts: entropy <= specific_to, firing most on it
    shared_from: float
    specific_to: float
    cofiring_from: float
    tokens: int                         # how many aligned rows were evaluated

    @property
    def fvu(self) -> Tensor:
        """The matrix of FVUs, 1 - R²."""
        return 1 - self.r2

    @property
    def shared(self) -> float:
        """The share of the n concepts the models share."""
        return len(self.shared_concepts) / self.firing.shape[1]

    @property
    def specific(self) -> dict[str, float]:
        """Each model's share of the n concepts that are its own."""
        return {model: len(own_concepts) / self.firing.shape[1] for model, own_concepts in
                self.specific_concepts.items()}

    @property
    def unused(self) -> float:
        """The share of the concepts that fire on no model's tokens (their entropy is NaN)."""
        return (self.firing.sum(0) == 0).double().mean().item()

    @property
    def l0(self) -> dict[str, float]:
        """Each model's concepts firing per token, on average (Σ_c f[m, c])."""
        return {model: firing.sum().item() for model, firing in zip(self.models, self.firing)}

    @property
    def dead(self) -> dict[str, float]:
        """Each model's share of the concepts that never fire on its tokens."""
        return {model: (firing == 0).double().mean().item() for model, firing in zip(self.models, self.firing)}

    def to_dict(self) -> dict:
        """The numbers, for a log line or a model card."""
        return {"models": list(self.models), "r2": self.r2.tolist(), "shared": self.shared,
                "shared_concepts": self.shared_concepts.tolist(),
                "specific_concepts": {model: ids.tolist() for model, ids in self.specific_concepts.items()},
                "specific": self.specific, "unused": self.unused, "l0": self.l0, "dead": self.dead,
                "shared_from": self.shared_from, "specific_to": self.specific_to, "cofiring_from": self.cofiring_from,
                "tokens": self.tokens}


@torch.no_grad()
def across_metrics(across: Across, activations: Sequence[Activations], *, batch_size: int = 4096,
                   shared_from: float = SHARED_FROM, specific_to: float = SPECIFIC_TO,
                   cofiring_from: float = COFIRING_FROM) -> AcrossMetrics:
    """The R² matrix, each concept's firing entropy over the models and its co-firing, the shares of shared
    and model-specific concepts, and each model's L0 and dead share, of `across` over aligned `activations`
    (raw, one per model in `across.models`' order: tensors or iterables of batches), streamed in batches of
    `batch_size` rows; the module docstring defines each. Refused when a model's tokens do not vary (its
    FVU's denominator is 0) or the models' rows differ in number."""
    models = across.models
    refuse_unlike_models(activations, models)
    aligned_count(activations, models)
    device = across.per_model[0].W_enc.device
    spreads = [_Spread() for _ in models]
    errors = torch.zeros(len(models), len(models), dtype=torch.float64, device=device)   # read once, at the end
    fires = torch.zeros(len(models), across.n_concepts, dtype=torch.int64, device=device)
    pairs = math.comb(len(models), 2)
    fires_in_both = torch.zeros(pairs, across.n_concepts, dtype=torch.int64, device=device)
    fires_in_either = torch.zeros_like(fires_in_both)
    streams = [batches(model_activations, batch_size) for model_activations in activations]
    for rows in aligned(streams, models):
        rows = [x.to(device) for x in rows]
        for dictionary, spread, x in zip(across.per_model, spreads, rows):
            dictionary.check_width(x.shape[1])
            spread.add(x)
        firings = []
        for i, (encoder, x) in enumerate(zip(across.per_model, rows)):
            codes = encoder.encode(x)
            firings.append(codes > 0)
            fires[i] += firings[-1].sum(0)
            for j, (decoder, target) in enumerate(zip(across.per_model, rows)):
                errors[i, j] += (target.double() - decoder.decode(codes).double()).square().sum()
        for pair, (a, b) in enumerate(itertools.combinations(firings, 2)):
            fires_in_both[pair] += (a & b).sum(0)
            fires_in_either[pair] += (a | b).sum(0)
    spread, errors = torch.stack([spread.total() for spread in spreads]).cpu(), errors.cpu()
    for model, value in zip(models, spread):
        if not value > 0:
            raise ConceptsError(f"The {spreads[0].tokens} tokens of {model} evaluated are all the same vector, so "
                                f"no fraction of their variance can be explained.")
    tokens = spreads[0].tokens
    firing = fires.double().cpu() / tokens
    entropy = firing_entropy(firing)
    owner = firing.argmax(0)
    specific = {model: ((entropy <= specific_to) & (owner == m)).nonzero().flatten() for m, model in
                enumerate(models)}
    either = fires_in_either.double().cpu()
    cofiring = (fires_in_both.double().cpu() / either.clamp(min=1)).mean(0)
    cofiring[(either == 0).all(0)] = math.nan   # a concept that never fires
    shared = ((entropy >= shared_from) & (cofiring >= cofiring_from)).nonzero().flatten()
    return AcrossMetrics(models=models, r2=1 - errors / spread, firing=firing, entropy=entropy, cofiring=cofiring,
                         shared_concepts=shared, specific_concepts=specific, shared_from=shared_from,
                         specific_to=specific_to, cofiring_from=cofiring_from, tokens=tokens)


def firing_entropy(firing: Tensor) -> Tensor:
    """Each concept's firing entropy over the M models, from `firing` (M n, the share of each model's tokens a
    concept fires on): H(p) / log M with p the firing normalised over the models; NaN where it fires on none."""
    total = firing.sum(0)
    p = firing / total
    entropy = torch.where(p > 0, -p * p.log(), 0.0).sum(0) / math.log(len(firing))
    return entropy.masked_fill(total == 0, math.nan)


class _Spread:
    """Σ_t ‖x_t - x̄‖² over streamed batches, in float64 about the first batch's mean (`metrics.py`'s formula:
    Σ ‖x - c‖² - T ‖x̄ - c‖²), so that a large common offset does not cancel a small variance's digits."""

    def __init__(self):
        self.tokens, self.shift, self.squares, self.offset = 0, None, None, None

    def add(self, x: Tensor) -> None:
        x = x.double()
        if self.shift is None:
            self.shift, self.offset, self.squares = x.mean(0), torch.zeros_like(x[0]), x.new_zeros(())
        centred = x - self.shift
        self.squares += centred.square().sum()   # on the device: read once, by `total`'s caller
        self.offset += centred.sum(0)
        self.tokens += len(x)

    def total(self) -> Tensor:
        return self.squares - self.offset.square().sum() / self.tokens
