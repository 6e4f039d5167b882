"""High-norm artefact tokens (Darcet et al. 2023, "Vision Transformers Need Registers").

Large ViTs trained long enough (DINOv2, OpenCLIP, DeiT-III) repurpose a few patches of little
information, often background, as scratch space for global information: those tokens leave the later
blocks with norms many times the others', keep little of their patch, and draw the class token's
attention (the spikes in DINOv2's attention maps). Register tokens, extra learned tokens in front
of the patches, give the model that space elsewhere, and the artefacts go away.

Which tokens count is decided per layer and image by one model-agnostic rule: a grid token is an
artefact when its output norm lies more than `z` robust standard deviations above the median of
that layer's grid-token norms,

    (|x_t| - median) / (1.4826 · MAD) > z,     MAD = median_t | |x_t| - median |

(1.4826 · MAD estimates a normal distribution's standard deviation; unlike the mean and standard
deviation, neither the median nor the MAD moves when a few tokens are huge). Under a normal
distribution a token passes z = 5 with probability 3e-7, so a few hundred ordinary tokens flag none.
A layer whose MAD is 0 falls back to the standard deviation (and to 1 when that is 0 too).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..models.trace import Trace
from .norms import token_norms

OUTLIER_Z = 5.0
MAD_TO_SD = 1.4826   # 1 / Φ⁻¹(3/4): the MAD of a normal distribution times this is its standard deviation


def outliers(norms: Tensor, *, z: float = OUTLIER_Z) -> Tensor:
    """One map of norms (any shape) -> bool of that shape: the values more than `z` robust SDs above the median."""
    values = torch.as_tensor(norms).double()
    median = values.flatten().quantile(0.5)   # interpolated, as numpy's median
    mad = (values - median).abs().flatten().quantile(0.5)
    if mad > 0:
        scale = MAD_TO_SD * mad
    else:
        sd = values.std(correction=0)
        scale = sd if sd > 0 else 1.0
    return (values - median) / scale > z


def artefact_tokens(trace: Trace, *, layer: int = -1, z: float = OUTLIER_Z) -> Tensor:
    """b gh gw bool: the grid tokens of block `layer` whose output norm is an outlier (the rule above), per image."""
    if not -len(trace.blocks) <= layer < len(trace.blocks):
        raise ValueError(f"layer must index one of the model's {len(trace.blocks)} blocks, not {layer}")
    grids, _ = token_norms(trace)
    return torch.stack([outliers(grid, z=z) for grid in grids[layer]])
