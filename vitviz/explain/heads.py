"""DINO's display of an attention map: the smallest set of tokens that holds a chosen fraction of its mass.

Caron et al. 2021 (`visualize_attention.py`) show each head's class-token attention over the patches
as the region holding 60 % of it. For a non-negative map m over n tokens with total M = Σ m:

    sort m descending: m_(1) >= m_(2) >= ... >= m_(n)
    k = the smallest count with  m_(1) + ... + m_(k) >= fraction · M
    keep the tokens of m_(1) .. m_(k)

No smaller set holds the fraction (any k - 1 tokens hold at most the k - 1 largest values, which fall
short), and the kept tokens are the largest ones, so the set is also the one a reader expects. DINO
writes the same set as `cumsum(sort ascending) > 1 - fraction` of the normalised map. Ties at the cut
go in reading order (a stable sort); an all-zero map keeps nothing. The cumulative sums run in float64,
so a 1,370-token map's rounding cannot move the cut.
"""
from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_MASS = 0.6   # DINO's threshold


def mass_threshold(values: Tensor, fraction: float = DEFAULT_MASS) -> Tensor:
    """... h w non-negative maps -> ... h w bool: per map, the smallest set of tokens holding `fraction` of its mass."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    flat = values.detach().flatten(-2).double()
    if (flat < 0).any():
        raise ValueError("mass_threshold needs a non-negative map (attention, or a relevance map clipped at 0)")
    order = flat.argsort(dim=-1, descending=True, stable=True)
    ranked = flat.gather(-1, order)
    running = ranked.cumsum(dim=-1)
    before = running - ranked   # mass of the larger tokens alone
    keep = before < fraction * running[..., -1:]   # the total summed in the same order: zeros past it stay out
    return torch.zeros_like(keep).scatter(-1, order, keep).view(values.shape)
