"""Activation patching (causal tracing; Meng et al. 2022, Heimersheim & Nanda 2024's "how to use and
interpret activation patching"): which activations carry the answer from one image to another.

Two images, clean and corrupted, and a metric m = logit[target] - logit[foil]. One activation of the
corrupted run is replaced by the clean run's, the forward goes on from there, and the effect is

    effect = (m_patched - m_corrupted) / (m_clean - m_corrupted)

0: that activation alone carries none of the difference; 1: all of it. Default foil: the corrupted run's
top class, or the clean run's second when that is the target.

Sites (TransformerLens' names):
- `resid`: the residual stream entering block l (`resid_pre`), at one position set: each prefix token
  alone, and the grid tokens in `group` x `group` squares. Patching every token of a block gives 1 (the
  rest of the clean run), patching none 0. CvT: every block of every stage, on its own grid; a ResNet
  block that halves the grid: on the grid it reads (the previous stage's).
- `head`: each head's output before the output projection (`z`), at every position of block l. The
  output projection is linear, so replacing z_h adds (z_h^clean - z_h^corrupted) W_O_h^T to the
  attention's output, and the forward goes on from there (`attn_delta` of the models' `forward_from`).

Batched: the position sets of one block go through the rest of the network together, `batch_size`
per forward, starting at block l (`model.forward_from`): the blocks before l are never recomputed, and
block l's input is the corrupted run's, kept by its trace. `patching_plan` says beforehand how many
forwards and patched images a run takes.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.trace import BlockTrace, Trace
from .gradients import Target, resolve_target
from .rollout import needs_attention
from .windows import head_outputs

SITES = ("resid", "head")
CORRUPTIONS = ("blur", "noise")
Progress = Callable[[int, int], None]   # (batched forwards done, forwards in all)


@dataclass(frozen=True)
class Metric:
    """m = logit[target] - logit[foil] on the clean and corrupted runs, and the effect of a patched run."""

    target: int
    foil: int
    clean: float
    corrupted: float

    def of(self, logits: Tensor) -> Tensor:
        return logits[:, self.target] - logits[:, self.foil]

    def effect(self, logits: Tensor) -> Tensor:
        """b classes -> b normalised effects."""
        return (self.of(logits) - self.corrupted) / (self.clean - self.corrupted)


@dataclass
class Patching:
    """What patching found; `resid`: grid and prefix per block, `head`: heads."""

    site: str
    metric: Metric
    group: int
    grid: list[Tensor]      # resid: per block of trace.blocks, a ceil(gh / group) x ceil(gw / group) map
    prefix: list[Tensor]    # resid: per block, one value per prefix token (in `prefix_kinds` order)
    heads: Tensor | None    # head: L x H, NaN where a block has fewer heads (CvT's stages differ)


@dataclass(frozen=True)
class Plan:
    """What an activation patching will cost before it runs: its batched forwards and patched images."""
    forwards: int   # batched forwards (each from the patched block on), besides the two traced runs
    images: int     # patched images sent through them


def metric(clean: Trace, corrupted: Trace, target: Target = None, foil: Target = None) -> Metric:
    """The metric for one image's two runs (default target: the clean run's top class); refuses equal m. Two reads
    of the device: the classes it may need, then m on both runs."""
    classes = torch.cat([resolve_target(clean.logits, target)[:1], corrupted.logits[0].argmax()[None],
                         clean.logits[0].topk(min(2, clean.logits.shape[1])).indices[-1:]])
    target, corrupted_top, clean_second = classes.tolist()
    if foil is None:
        foil = clean_second if corrupted_top == target else corrupted_top
    else:
        foil = int(resolve_target(clean.logits, foil)[0])
    if foil == target:
        raise ValueError("the foil class is the target class: their logit difference is always 0")
    m = Metric(target, foil, 0.0, 0.0)
    m_clean, m_corrupted = torch.cat([m.of(clean.logits), m.of(corrupted.logits)]).tolist()
    if abs(m_clean - m_corrupted) <= 1e-5 * max(1.0, abs(m_clean), abs(m_corrupted)):
        raise ValueError(f"the two images give the model the same answer (logit[{target}] - logit[{foil}] = "
                         f"{m_clean:.4g} on both), so there is no difference for patching to carry: take a "
                         "corrupted image the model sees differently")
    return Metric(target, foil, m_clean, m_corrupted)


def position_masks(block: BlockTrace, group: int) -> Tensor:
    """P n bool: each prefix token alone, then the grid's `group` x `group` squares, row-major."""
    if group < 1:
        raise ValueError(f"group must be at least 1, not {group}")
    h, w = block.stream_grid
    p, cols = block.prefix, math.ceil(w / group)
    rows = torch.arange(h, device=block.tokens.device)[:, None] // group
    labels = p + (rows * cols + torch.arange(w, device=block.tokens.device)[None, :] // group).reshape(-1)
    labels = torch.cat([torch.arange(p, device=labels.device), labels])   # token -> its position set
    return labels[None, :] == torch.arange(p + math.ceil(h / group) * cols, device=labels.device)[:, None]


def patching_plan(trace: Trace, *, site: str = "resid", group: int = 1, batch_size: int = 64) -> Plan:
    """How many batched forwards and patched images `patch_activations` will take for this model and size."""
    _check(site, batch_size)
    if site == "head":
        needs_attention(trace, "head patching")
    sizes = [len(position_masks(b, group)) if site == "resid" else b.attn.shape[-3] for b in trace.blocks]
    return Plan(forwards=sum(math.ceil(n / batch_size) for n in sizes), images=sum(sizes))


def _check(site: str, batch_size: int) -> None:
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, not {site!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")


@torch.no_grad()
def patched_residual(model: nn.Module, clean: Trace, corrupted: Trace, index: int, masks: Tensor, metric: Metric, *,
                     batch_size: int = 64, step: Callable[[], None] = lambda: None) -> Tensor:
    """P effects: the residual stream entering block `index`, clean at each mask's tokens (P n), corrupted elsewhere."""
    clean_in, corrupted_in = clean.blocks[index].inputs[0], corrupted.blocks[index].inputs[0]
    grid = clean.blocks[index].stream_grid
    effects = []
    for start in range(0, len(masks), batch_size):
        patched = torch.where(masks[start:start + batch_size, :, None], clean_in, corrupted_in)
        effects.append(metric.effect(model.forward_from(index, patched, grid)))
        step()
    return torch.cat(effects) if effects else masks.new_zeros(0, dtype=clean_in.dtype)


@torch.no_grad()
def patched_heads(model: nn.Module, clean: Trace, corrupted: Trace, index: int, metric: Metric, *,
                  batch_size: int = 64, step: Callable[[], None] = lambda: None) -> Tensor:
    """H effects: each head's output z of block `index` clean at every position, the rest corrupted."""
    blocks = clean.blocks[index], corrupted.blocks[index]
    if any(b.parts is None for b in blocks):
        raise ValueError("head patching needs traces made with model.trace(pixels, decompose=True)")
    z_clean, z_corrupted = (head_outputs(b)[0] for b in blocks)   # h nq d
    heads, _, d = z_clean.shape
    weight = blocks[0].parts.weight.reshape(-1, heads, d)                  # c h d
    deltas = torch.einsum('hnd,chd->hnc', z_clean - z_corrupted, weight)   # what each head's patch adds
    corrupted_in = blocks[1].inputs
    effects = []
    for start in range(0, heads, batch_size):
        delta = deltas[start:start + batch_size]
        logits = model.forward_from(index, corrupted_in.expand(len(delta), -1, -1), blocks[0].query_grid,
                                    attn_delta=delta)
        effects.append(metric.effect(logits))
        step()
    return torch.cat(effects)


def patch_activations(model: nn.Module, clean: Tensor, corrupted: Tensor, target: Target = None, *,
                      foil: Target = None, site: str = "resid", group: int = 1, batch_size: int = 64,
                      progress: Progress | None = None) -> Patching:
    """Activation patching of every block, from the corrupted image (1 3 h w) towards the clean one (1 3 h w).

    target: default the clean run's top class; foil: see the module docstring. progress(done, total) is
    called after each batched forward.
    """
    _check(site, batch_size)
    if model.training:
        raise ValueError("call model.eval() first: in training mode BatchNorm mixes the patched images of a batch")
    if clean.dim() != 4 or clean.shape[0] != 1 or clean.shape != corrupted.shape:
        raise ValueError(f"clean and corrupted must be one image each of the same size (1 3 h w), not "
                         f"{tuple(clean.shape)} and {tuple(corrupted.shape)}")
    with torch.no_grad():
        runs = [model.trace(pixels, decompose=site == "head") for pixels in (clean, corrupted)]
        m = metric(*runs, target, foil)
        total, done = patching_plan(runs[0], site=site, group=group, batch_size=batch_size).forwards, 0

        def step() -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, total)

        grid, prefix, heads = [], [], []
        for index, block in enumerate(runs[0].blocks):
            if site == "head":
                heads.append(patched_heads(model, *runs, index, m, batch_size=batch_size, step=step))
                continue
            effects = patched_residual(model, *runs, index, position_masks(block, group), m, batch_size=batch_size,
                                       step=step)
            h, w = block.stream_grid
            prefix.append(effects[:block.prefix])
            grid.append(effects[block.prefix:].reshape(math.ceil(h / group), math.ceil(w / group)))
    table = None
    if heads:
        table = torch.full((len(heads), max(len(h) for h in heads)), math.nan, device=heads[0].device)
        for i, values in enumerate(heads):
            table[i, :len(values)] = values
    return Patching(site=site, metric=m, group=group, grid=grid, prefix=prefix, heads=table)


def corrupt(pixels: Tensor, kind: str, *, strength: float | None = None, seed: int = 0) -> Tensor:
    """A corrupted copy of model-ready pixels (b 3 h w) for patching: `blur`, a Gaussian blur of standard
    deviation `strength` input pixels (default 1/16 of the shorter side); `noise`, Gaussian noise of standard
    deviation `strength` in the normalised pixels' units (default 1), reproducible by `seed`."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"kind must be one of {CORRUPTIONS}, not {kind!r}")
    if strength is not None and strength <= 0:
        raise ValueError(f"strength must be above 0, not {strength}")
    if kind == "noise":
        g = torch.Generator(device=pixels.device).manual_seed(seed)
        return pixels + (strength or 1.0) * torch.randn(pixels.shape, generator=g, device=pixels.device,
                                                        dtype=pixels.dtype)
    sigma = strength or min(pixels.shape[-2:]) / 16
    radius = min(int(3 * sigma), min(pixels.shape[-2:]) - 1)
    x = torch.arange(-radius, radius + 1, device=pixels.device, dtype=pixels.dtype)
    kernel = (-(x ** 2) / (2 * sigma ** 2)).exp()
    kernel = kernel / kernel.sum()
    c = pixels.shape[1]
    padded = F.pad(pixels, (radius,) * 4, mode="reflect")
    across = F.conv2d(padded, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)   # separable: rows, then columns
    return F.conv2d(across, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
