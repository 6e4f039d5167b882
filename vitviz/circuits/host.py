"""A circuit's numbers on the host: read from the device at once (one wait), for the graph to be built from."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .effects import SiteState


@dataclass(frozen=True)
class OnHost:
    """A site's numbers the graph is built from, read from the device at once with every other site's: the graph
    is built node by node, and each number read alone would make the host wait for the device again."""
    effects: np.ndarray        # n: each concept node's effect
    estimates: np.ndarray      # n: attribution patching's (integrated gradients refine `effects`, not these)
    activations: np.ndarray    # n: each concept's codes summed over the site's rows
    error_effect: float
    error_map: np.ndarray      # rows: the error's effect at each row
    error_activation: float    # the error's norm summed over the rows


def to_host(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """`tensors` as float64 arrays of their shapes, in one transfer (one wait for the device)."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors]).cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return [part.reshape(t.shape) for part, t in zip(np.split(flat, ends[:-1]), tensors)]


def read_states(states: Sequence[SiteState], estimates: Sequence[Tensor]) -> list[OnHost]:
    """Every site's numbers the graph is built from (`OnHost`; `estimates`: attribution patching's effects, kept
    apart where integrated gradients refined `effects`), in one transfer."""
    parts = [(state.effects, estimate, state.codes[0].sum(0), state.error_effects, state.error_effect,
              state.error[0].norm(dim=-1).sum()) for state, estimate in zip(states, estimates)]
    values = to_host([tensor for site in parts for tensor in site])
    return [OnHost(effects=effects, estimates=estimated, activations=activations, error_effect=float(error_effect),
                   error_map=error_map, error_activation=float(error_activation))
            for effects, estimated, activations, error_map, error_effect, error_activation
            in zip(*[iter(values)] * 6)]
