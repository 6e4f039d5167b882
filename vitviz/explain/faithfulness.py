"""Deletion and insertion curves (Petsiuk et al. 2018, RISE) for any map from any method.

Deletion replaces the most important regions first with a baseline and tracks the target-class
probability: a map that points at evidence the model uses makes it fall fast (low area under the
curve). Insertion starts from the baseline and puts the most important regions back first (high
area is good). Regions are the map's tokens (`unit="token"`, each token's block of pixels) or
single pixels ranked by the map upsampled to the input (`unit="pixel"`). Every step of every curve
is one image in a batch, so a curve costs a few forward passes. Compare with `random_saliency`,
the random-order baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torchvision.transforms.v2.functional import gaussian_blur

from .gradients import Target, resolve_target

UNITS = ("token", "pixel")


@dataclass(frozen=True)
class Curve:
    fractions: Tensor   # t: share of the regions removed (deletion) or inserted (insertion), 0 .. 1
    scores: Tensor      # b t: target-class probability at each step
    auc: Tensor         # b: area under scores over fractions (trapezoid rule)


def baseline_image(pixels: Tensor, baseline: str | Tensor) -> Tensor:
    """What removed regions become, in normalised pixel space: 'mean' (the normalisation mean, i.e. 0),
    'blur' (Gaussian, sigma = 1/16 of the longer side) or a tensor broadcastable to the pixels."""
    if isinstance(baseline, Tensor):
        return baseline.to(pixels).expand_as(pixels)
    if baseline == "mean":
        return torch.zeros_like(pixels)
    if baseline == "blur":
        sigma = max(pixels.shape[-2:]) / 16
        kernel = 2 * int(2 * sigma) + 1
        return gaussian_blur(pixels, [kernel, kernel], [sigma, sigma])
    raise ValueError(f"baseline must be 'mean', 'blur' or a tensor, not {baseline!r}")


def random_saliency(saliency: Tensor, *, seed: int = 0) -> Tensor:
    """A map of the same shape with uniform random values: the random-order baseline."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(saliency.shape, generator=generator).to(saliency)


def _ranks(saliency: Tensor) -> Tensor:
    """b n -> b n: 0 for the most important unit (ties: in reading order)."""
    order = saliency.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    return ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))


def _step_masks(saliency: Tensor, size: tuple[int, int], steps: int, unit: str) -> tuple[Tensor, Tensor]:
    """-> (t fractions, b t h w bool: the pixels among the top fraction of units at each step)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, not {unit!r}")
    if unit == "pixel":
        saliency = F.interpolate(saliency[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
    grid = saliency.shape[-2:]
    ranks = _ranks(rearrange(saliency, 'b h w -> b (h w)'))
    fractions = torch.linspace(0, 1, steps + 1)
    counts = (fractions * ranks.shape[-1]).round().long()
    masks = ranks[:, None, :] < counts[None, :, None].to(ranks.device)          # b t n
    masks = rearrange(masks, 'b t (h w) -> b t h w', h=grid[0], w=grid[1])
    if unit == "token":   # each token's region: nearest-neighbour upsampling of the token grid
        masks = F.interpolate(masks.float(), size=size, mode="nearest").bool()
    return fractions, masks


@torch.inference_mode()
def _curve(model: nn.Module, pixels: Tensor, saliency: Tensor, *, insert: bool, target: Target, steps: int,
           unit: str, baseline: str | Tensor, batch_size: int) -> Curve:
    if pixels.ndim != 4 or saliency.ndim != 3 or saliency.shape[0] != pixels.shape[0]:
        raise ValueError(f"expected pixels b 3 h w and a map b h w for the same b, "
                         f"got {tuple(pixels.shape)} and {tuple(saliency.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    target = resolve_target(model(pixels), target)
    fractions, masks = _step_masks(saliency.detach().to(pixels.device), tuple(pixels.shape[-2:]), steps, unit)
    base = baseline_image(pixels, baseline)
    keep, replace = (base, pixels) if insert else (pixels, base)   # where the mask is set: `replace`
    masks = rearrange(masks, 'b t h w -> (b t) 1 h w')
    image_of = torch.arange(pixels.shape[0], device=pixels.device).repeat_interleave(steps + 1)
    probs = []
    for chunk in torch.arange(len(masks), device=pixels.device).split(batch_size):
        images = torch.where(masks[chunk], replace[image_of[chunk]], keep[image_of[chunk]])
        logits = model(images).float()
        probs.append(logits.softmax(dim=-1).gather(1, target[image_of[chunk], None])[:, 0])
    scores = rearrange(torch.cat(probs), '(b t) -> b t', t=steps + 1).cpu()
    return Curve(fractions=fractions, scores=scores, auc=torch.trapezoid(scores, fractions, dim=-1))


def deletion_curve(model: nn.Module, pixels: Tensor, saliency: Tensor, *, target: Target = None, steps: int = 16,
                   unit: str = "token", baseline: str | Tensor = "mean", batch_size: int = 64) -> Curve:
    """Remove the map's most important regions first (replace them with `baseline`); lower AUC is better."""
    return _curve(model, pixels, saliency, insert=False, target=target, steps=steps, unit=unit, baseline=baseline,
                  batch_size=batch_size)


def insertion_curve(model: nn.Module, pixels: Tensor, saliency: Tensor, *, target: Target = None, steps: int = 16,
                    unit: str = "token", baseline: str | Tensor = "blur", batch_size: int = 64) -> Curve:
    """Start from `baseline` and put the most important regions back first; higher AUC is better."""
    return _curve(model, pixels, saliency, insert=True, target=target, steps=steps, unit=unit, baseline=baseline,
                  batch_size=batch_size)
