"""What two model families share, written once: the MLP block (fc1, GELU, fc2; ConvNeXt's and Swin's) and the
renaming of a transformers state dict's keys (CvT's and ResNet's `convert_transformers_state_dict`)."""
from __future__ import annotations

import re

from torch import Tensor, nn

from .relevance import GELU, GammaLinear
from .trace import kept_units


class Mlp(nn.Module):
    """The block's two-layer MLP: `fc1`, GELU, `fc2`."""
    def __init__(self, *, dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = GammaLinear(dim, hidden_dim)
        self.act = GELU()
        self.fc2 = GammaLinear(hidden_dim, dim)

    def forward(self, x: Tensor, units: list[Tensor] | None = None) -> Tensor:
        """x -> fc2(GELU(fc1(x))); `units`: where a list is given, GELU(fc1(x)) is appended to it, the hidden units
        a feature picture maximises (Ghiasi et al. 2022), for `trace(units=True)`."""
        return self.fc2(kept_units(self.act(self.fc1(x)), units))


def renamed_state_dict(state_dict: dict[str, Tensor], renames: list[tuple[str, str]]) -> dict[str, Tensor]:
    """Another checkpoint's state dict under a family's names: each key renamed by `renames` ((pattern, replacement)
    pairs of `re.sub`, applied in order), BatchNorm's counters (num_batches_tracked) dropped. What the families'
    `convert_transformers_state_dict` share."""
    out = {}
    for key, value in state_dict.items():
        if key.endswith("num_batches_tracked"):
            continue
        for pattern, repl in renames:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out
