"""Perturbation curves for any map from any method: how the model's output moves as the regions a map
ranks first are removed (or put back first).

- **Deletion and insertion** (Petsiuk et al. 2018, RISE): deletion replaces the most important
  regions first with a baseline and tracks the target-class probability; a map that points at the
  evidence the model uses makes it fall fast (low area under the curve). Insertion starts from the
  baseline and puts the most important regions back first (high area is good). Regions are the map's
  tokens (`unit="token"`, each token's cell of pixels) or single pixels ranked by the map upsampled
  to the input (`unit="pixel"`).
- **The positive and negative perturbation test** (Chefer, Gur & Wolf 2021, their
  `baselines/ViT/pertubation_eval_from_hdf5.py`): the map is upsampled bilinearly to the input
  (their `interpolate(scale_factor=16, mode='bilinear')`, i.e. align_corners=False), then the top
  int(h·w·f) pixels, all channels, are set to black for f = 0.1 .. 0.9: zero in the [0, 1] image
  *before* normalisation (their `scatter_(..., 0)` then `normalize`), which is -mean/std of the
  normalised input, not its zero. Positive removes the most relevant first, negative the least
  relevant first (their `vis = -vis`). The score is whether the model still predicts a reference
  class (their `target == argmax`, with the data set's label as the target); the unperturbed image
  is the 0 % point. vitviz differs only in ties: pixels of equal relevance go in reading order
  (a stable sort), where `torch.topk` leaves their order to the implementation.
- **Region perturbation** (Samek et al. 2017), as Quantus 0.6's `RegionPerturbation` computes it with
  `perturb_baseline="black"`: the most relevant region first, one region (here: one cell of the
  model's last token grid) more per step, each set to the image's own minimum over all pixels and
  channels (Quantus's "black" is `arr.min()` of the normalised input, one value for all channels).
  Quantus returns p(target | x) - p(target | x with k regions removed) for k = 1 .. R; the curve here
  holds p(target | x with k regions removed) for k = 0 .. R, so Quantus's list is scores[0] - scores[1:].

Every curve is a `Perturbation` of k maps of b images: at step s of map k on image i, the counts[s]
units that map ranks first come from `replace`, the rest from `keep`. `score` sends the steps of any
number of perturbations through the model together, `batch_size` images per forward, and builds each
image only when its batch is due. A step whose image does not depend on the map (nothing or
everything replaced) is computed once per image, not once per map. `random_saliency` is the
random-order baseline.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .gradients import Target, resolve_target

UNITS = ("token", "pixel")
PERTURBATION_FRACTIONS = tuple(k / 10 for k in range(10))   # Chefer et al.'s 0.1 .. 0.9, and 0: the image itself


@dataclass(frozen=True)
class Curve:
    """A perturbation curve per image: at each fraction of the regions removed or inserted, the target class's
    probability (the perturbation tests: whether the reference class is still predicted), and the area under it."""
    fractions: Tensor   # t: share of the regions removed (deletion) or inserted (insertion), 0 .. 1
    scores: Tensor      # b t: target-class probability (perturbation test: 1 if the reference class is predicted)
    auc: Tensor         # b: area under scores over fractions (trapezoid rule)


def baseline_image(pixels: Tensor, baseline: str | Tensor) -> Tensor:
    """What removed regions become, in normalised pixel space: 'mean' (the normalisation mean, i.e. 0),
    'blur' (Gaussian, sigma = 1/16 of the longer side) or a tensor broadcastable to the pixels."""
    if isinstance(baseline, Tensor):
        return baseline.to(pixels).expand_as(pixels)
    if baseline == "mean":
        return torch.zeros_like(pixels)
    if baseline == "blur":
        from torchvision.transforms.v2.functional import gaussian_blur  # torchvision costs ~1.5 s to import
        sigma = max(pixels.shape[-2:]) / 16
        kernel = 2 * int(2 * sigma) + 1
        return gaussian_blur(pixels, [kernel, kernel], [sigma, sigma])
    raise ValueError(f"baseline must be 'mean', 'blur' or a tensor, not {baseline!r}")


def random_saliency(saliency: Tensor, *, seed: int = 0) -> Tensor:
    """A map of the same shape with uniform random values: the random-order baseline."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(saliency.shape, generator=generator).to(saliency)


def _ranks(saliency: Tensor) -> Tensor:
    """... n -> ... n: 0 for the most important unit (ties: in reading order)."""
    order = saliency.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    return ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))


def unit_ranks(saliency: Tensor, size: tuple[int, int], unit: str) -> tuple[Tensor, tuple[int, int]]:
    """... gh gw maps -> (ranks ... n, the units' grid): tokens as they are, or pixels of the map
    upsampled bilinearly (align_corners=False) to the input `size`."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, not {unit!r}")
    if unit == "pixel":
        flat = rearrange(saliency.float(), '... h w -> (...) 1 h w')
        upsampled = F.interpolate(flat, size=size, mode="bilinear", align_corners=False)
        saliency = upsampled.reshape(*saliency.shape[:-2], *size)
    grid = tuple(saliency.shape[-2:])
    return _ranks(rearrange(saliency, '... h w -> ... (h w)')), grid


@dataclass(frozen=True)
class Perturbation:
    """The images of one kind of curve for k maps of b images: at step s of map k on image i, the
    `counts[s]` units `ranks[k, i]` puts first come from `replace`, the others from `keep`."""
    keep: Tensor                 # b c h w
    replace: Tensor              # b c h w
    ranks: Tensor                # k b n: 0 for the unit replaced first
    grid: tuple[int, int]        # the units' grid; each unit is a cell of the image (nearest upsampling)
    counts: tuple[int, ...]      # t: units replaced at each step, 0 .. n (the schedule: host numbers, never read back)

    @property
    def varying(self) -> tuple[int, ...]:
        """The steps whose image depends on the map (some but not all units replaced)."""
        return tuple(step for step, count in enumerate(self.counts) if 0 < count < self.ranks.shape[-1])

    @property
    def shared(self) -> tuple[int, ...]:
        """The counts of the steps whose image does not depend on the map, in the order `score` sends them: 0
        (nothing replaced) and n (everything), where the schedule has them."""
        return tuple(count for count in (0, self.ranks.shape[-1]) if count in self.counts)

    @property
    def images_needed(self) -> int:
        """How many images this perturbation sends through the model."""
        k, b, _ = self.ranks.shape
        return b * (len(self.shared) + k * len(self.varying))

    @cached_property
    def varying_counts(self) -> Tensor:
        """s: the map-dependent steps' counts on the images' device, copied there once."""
        return torch.tensor([self.counts[step] for step in self.varying], device=self.keep.device)

    def varying_images(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """rows of the (k b s) map-dependent steps -> (r c h w images, r image indices)."""
        b, steps = self.ranks.shape[1], len(self.varying)
        which, image, step = rows // (b * steps), rows // steps % b, rows % steps
        masks = self.ranks[which, image] < self.varying_counts[step][:, None]              # r n
        masks = rearrange(masks, 'r (gh gw) -> r 1 gh gw', gh=self.grid[0], gw=self.grid[1])
        if self.grid != tuple(self.keep.shape[-2:]):   # each unit is a cell of pixels
            masks = F.interpolate(masks.float(), size=self.keep.shape[-2:], mode="nearest").bool()
        return torch.where(masks, self.replace[image], self.keep[image]), image


def _maps(saliency: Tensor, pixels: Tensor) -> Tensor:
    """b gh gw or k b gh gw -> k b gh gw, checked against the pixels."""
    maps = saliency.detach().to(pixels.device)
    maps = maps[None] if maps.ndim == 3 else maps
    if pixels.ndim != 4 or maps.ndim != 4 or maps.shape[1] != pixels.shape[0]:
        raise ValueError(f"expected pixels b 3 h w and maps b h w (or k b h w) for the same b, "
                         f"got {tuple(pixels.shape)} and {tuple(saliency.shape)}")
    return maps


def _fraction_counts(steps: int, units: int) -> tuple[Tensor, tuple[int, ...]]:
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    fractions = torch.linspace(0, 1, steps + 1)   # on the host: the schedule is known before any map
    return fractions, tuple((fractions * units).round().long().tolist())


def deletion(pixels: Tensor, saliency: Tensor, *, steps: int = 16, unit: str = "token",
             baseline: str | Tensor = "mean") -> tuple[Tensor, Perturbation]:
    """Petsiuk et al.'s deletion: (fractions, the perturbation) replacing the top units with `baseline`."""
    ranks, grid = unit_ranks(_maps(saliency, pixels), tuple(pixels.shape[-2:]), unit)
    fractions, counts = _fraction_counts(steps, ranks.shape[-1])
    return fractions, Perturbation(pixels, baseline_image(pixels, baseline), ranks, grid, counts)


def insertion(pixels: Tensor, saliency: Tensor, *, steps: int = 16, unit: str = "token",
              baseline: str | Tensor = "blur") -> tuple[Tensor, Perturbation]:
    """Petsiuk et al.'s insertion: (fractions, the perturbation) putting the top units back on `baseline`."""
    ranks, grid = unit_ranks(_maps(saliency, pixels), tuple(pixels.shape[-2:]), unit)
    fractions, counts = _fraction_counts(steps, ranks.shape[-1])
    return fractions, Perturbation(baseline_image(pixels, baseline), pixels, ranks, grid, counts)


def pixel_removal(pixels: Tensor, saliency: Tensor, *, black: Tensor,
                  negative: bool = False) -> tuple[Tensor, Perturbation]:
    """Chefer et al.'s positive (most relevant first) or negative (least relevant first) test:
    (fractions 0 .. 0.9, the perturbation) setting the top int(h·w·f) pixels to `black`, the
    normalised value of a black pixel (-mean/std, shaped to broadcast: 1 3 1 1)."""
    maps = _maps(saliency, pixels)
    ranks, grid = unit_ranks(-maps if negative else maps, tuple(pixels.shape[-2:]), "pixel")
    counts = tuple(int(ranks.shape[-1] * f) for f in PERTURBATION_FRACTIONS)
    perturbation = Perturbation(pixels, baseline_image(pixels, black), ranks, grid, counts)
    return torch.tensor(PERTURBATION_FRACTIONS), perturbation


def region_removal(pixels: Tensor, saliency: Tensor, *, regions: int | None = None) -> tuple[Tensor, Perturbation]:
    """Samek et al.'s region perturbation as Quantus computes it: (fractions k/n, the perturbation)
    setting the top k token cells, k = 0 .. min(regions, n), to each image's minimum value."""
    ranks, grid = unit_ranks(_maps(saliency, pixels), tuple(pixels.shape[-2:]), "token")
    units = ranks.shape[-1]
    last = units if regions is None else min(regions, units)
    if last < 1:
        raise ValueError(f"regions must be at least 1, not {regions}")
    minimum = pixels.amin(dim=(1, 2, 3), keepdim=True).expand_as(pixels)
    return torch.arange(last + 1) / units, Perturbation(pixels, minimum, ranks, grid, tuple(range(last + 1)))


@dataclass(frozen=True)
class Scores:
    """What the model answered at each perturbation step, for k maps of b images: the target class's
    probability and the class it predicts."""
    probs: Tensor     # k b t: the target class's probability at each step
    classes: Tensor   # k b t: the class the model predicts at each step


Piece = tuple[int, Callable[[int, int], tuple[Tensor, Tensor]]]   # (rows, (start, stop) -> (images, image indices))


def _pieces(p: Perturbation) -> list[Piece]:
    """The images of a perturbation in the order `score` sends them: the map-independent ones, then (k b s)."""
    k, b, _ = p.ranks.shape
    index = torch.arange(b, device=p.keep.device)
    pieces: list[Piece] = [(b, lambda start, stop, source=source: (source[start:stop], index[start:stop]))
                           for source in (p.replace if count else p.keep for count in p.shared)]
    rows = k * b * len(p.varying)
    if rows:
        pieces.append((rows, lambda start, stop: p.varying_images(torch.arange(start, stop, device=p.keep.device))))
    return pieces


def _batches(pieces: list[Piece], batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """The pieces' images, concatenated, in batches of `batch_size` (the last one shorter)."""
    pending, size = [], 0
    for rows, fetch in pieces:
        start = 0
        while start < rows:
            stop = min(rows, start + batch_size - size)
            pending.append(fetch(start, stop))
            size, start = size + stop - start, stop
            if size == batch_size:
                yield torch.cat([x for x, _ in pending]), torch.cat([i for _, i in pending])
                pending, size = [], 0
    if pending:
        yield torch.cat([x for x, _ in pending]), torch.cat([i for _, i in pending])


@torch.inference_mode()
def score(model: nn.Module, perturbations: Sequence[Perturbation], target: Tensor, *,
          batch_size: int = 64) -> list[Scores]:
    """Every step of every perturbation through the model, `batch_size` images per forward, in a fixed
    order (so the same perturbations always meet the same batches): each image's target-class
    probability (`target`: b class indices) and the predicted class, on the host. The answers stay on the
    device until every forward is queued, and come back in one read."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    pieces = [_pieces(p) for p in perturbations]
    probs, classes = [], []
    for images, image in _batches([piece for ps in pieces for piece in ps], batch_size):
        logits = model(images).float()
        probs.append(logits.softmax(dim=-1).gather(1, target[image, None])[:, 0])
        classes.append(logits.argmax(dim=-1))
    # float64 holds every float32 probability and class index exactly: one copy to the host for both
    answers = torch.stack([torch.cat(probs).double(), torch.cat(classes).double()]).cpu()
    probs, classes = answers[0].float(), answers[1].long()
    results, at = [], 0
    for p in perturbations:
        k, b, _ = p.ranks.shape
        columns = [{}, {}]   # step -> k b, for probs and classes
        for count in p.shared:   # one image per image: broadcast to every map
            for column, v in zip(columns, (probs, classes)):
                column.update({step: v[at:at + b].expand(k, b) for step, c in enumerate(p.counts) if c == count})
            at += b
        if p.varying:
            rows = k * b * len(p.varying)
            for column, v in zip(columns, (probs, classes)):
                varying = rearrange(v[at:at + rows], '(k b s) -> k b s', k=k, b=b)
                column.update({step: varying[:, :, j] for j, step in enumerate(p.varying)})
            at += rows
        results.append(Scores(*(torch.stack([column[step] for step in range(len(p.counts))], dim=-1)
                                for column in columns)))
    return results


def _probability_curve(model: nn.Module, pixels: Tensor, built: tuple[Tensor, Perturbation], *, target: Target,
                       batch_size: int) -> Curve:
    with torch.inference_mode():
        target = resolve_target(model(pixels), target)
    fractions, perturbation = built
    scores = score(model, [perturbation], target, batch_size=batch_size)[0].probs[0]
    return Curve(fractions=fractions, scores=scores, auc=torch.trapezoid(scores, fractions, dim=-1))


def deletion_curve(model: nn.Module, pixels: Tensor, saliency: Tensor, *, target: Target = None, steps: int = 16,
                   unit: str = "token", baseline: str | Tensor = "mean", batch_size: int = 64) -> Curve:
    """Remove the map's most important regions first (replace them with `baseline`); lower AUC is better."""
    return _probability_curve(model, pixels, deletion(pixels, saliency, steps=steps, unit=unit, baseline=baseline),
                              target=target, batch_size=batch_size)


def insertion_curve(model: nn.Module, pixels: Tensor, saliency: Tensor, *, target: Target = None, steps: int = 16,
                    unit: str = "token", baseline: str | Tensor = "blur", batch_size: int = 64) -> Curve:
    """Start from `baseline` and put the most important regions back first; higher AUC is better."""
    return _probability_curve(model, pixels, insertion(pixels, saliency, steps=steps, unit=unit, baseline=baseline),
                              target=target, batch_size=batch_size)
