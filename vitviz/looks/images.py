"""How a feature picture is made and shown to the models: its parametrisation and the copies each step sees.

Two methods, each a frozen dataclass of its settings with the two things a drawing needs of it: `parametrise`
(the trainable tensor, a module whose output is the canvas, B 3 S S in [0, 1]; the optimiser) and `augment` (the
canvas -> K copies per image at the model's input size, in [0, 1] pixels, and the noise added after the model's own
normalisation). Randomness comes from one generator per image (`Randomness`), so an image's picture does not depend
on which others were drawn with it.

MACO (Fel et al. 2023; Horama's `maco_fv.py`). The trainable tensor is a phase φ (B 3 S S/2+1). With M the natural
magnitude template (`natural.magnitude(S)`), C the colour matrix (`natural.colour_matrix()`) and θ a fixed random
offset, uniform in (-π, π) at every frequency and drawn with the picture's own randomness:

    y = standardise(irfft2(M · exp(i · (standardise(φ) + θ))))    per image: mean 0, standard deviation 1
    canvas = sigmoid(y Cᵀ)                                          per pixel: decorrelated colours -> the photos'

so every picture keeps the magnitude spectrum of natural photographs and only where its edges and colours fall (the
phase) is optimised: no high-frequency noise can win. NAdam at lr 1.0, φ drawn Gaussian and standardised, as Horama.
Why θ. A standardised phase stays within a few radians of 0, so without θ every frequency adds up nearly in step
at pixel (0, 0): every picture started from a spot at the canvas's corner (11 standard deviations at 32 px) and
kept a dark or bright corner (the shipped pictures drawn before it: luma 3.1 standard deviations from the mean,
docs/looks.md). With θ the start's phase is uniform, as the paper draws it, and no pixel is special; θ is a
constant, so the optimisation (its gradient, the standardisation's step size, which reaches further in as many
steps than an unstandardised phase) is Horama's.

Each step shows the models K crops of the canvas: centres at 0.5 + 0.15 N(0, 1) of the side, sides uniform in
`box` of the side, resized to the model's input (`roi_align`), with Gaussian and uniform noise of `noise` added in
the model's normalised units.
Horama's canvas is 1,280 px for 224 px models with crops of 25-30 % of its side (1.4 to 1.7 times the model's
input); the defaults here scale that to a 32 px model as a canvas of twice the input with crops of half to 60 %
of it (1.0 to 1.2 times the input), so the concept is drawn a few times over rather than dozens.

Pixels (Ghiasi et al. 2022, "What do vision transformers learn?"; their code's `vis38.py`). The trainable tensor is
the canvas itself, initialised uniform in [0, 1] and clamped to it after each step; Adam (lr 0.1, betas 0.5 and
0.99) with a cosine schedule to 0, and a total-variation penalty `tv` · TV(canvas), TV the L2 norms of the
horizontal, vertical and both diagonal differences of each channel, averaged over the channels and summed. Each of
the K copies a step is the canvas rolled by up to `jitter` of its side (their 32 px of 224, wrapping round), zoomed
by a factor uniform in `scale`, its colours jittered, (x - m) / exp(s) with m and s uniform in ±`colour` per
channel, and shifted by a Gaussian per channel of standard deviation `shift` that falls linearly to 0 over the
steps.

Both read the crops with `roi_align` from the canvas padded round by a quarter of its side (circularly: an inverse
FFT is periodic, and Ghiasi et al.'s jitter is a roll), so a box may leave the canvas.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torchvision.ops import roi_align

from . import natural

PAD = 0.25   # of the canvas's side, read round it by the crops (circularly)
Optimiser = torch.optim.Optimizer
Schedule = torch.optim.lr_scheduler.LRScheduler


class Randomness:
    """One generator per image, seeded by a hash of (the image's start: what it draws, `targets.start`; the seed):
    the same seed and target give the same draws whatever else shares the batch, and two targets' draws are
    unrelated whatever their numbers."""

    def __init__(self, starts: list[str], *, seed: int, device: torch.device):
        self.device = device
        self.generators = []
        for start in starts:
            digest = hashlib.blake2b(f"{start}|seed {seed}".encode(), digest_size=4).digest()
            generator = torch.Generator(device=device)
            generator.manual_seed(int.from_bytes(digest, "little"))   # 32 bits: all a CPU generator keeps
            self.generators.append(generator)

    def draw(self, kind: str, shape: tuple[int, ...]) -> Tensor:
        """B x shape draws ('normal' or 'uniform' in [0, 1)), each image's from its own generator."""
        sample = torch.randn if kind == "normal" else torch.rand
        return torch.stack([sample(shape, generator=g, device=self.device) for g in self.generators])


def standardise(x: Tensor) -> Tensor:
    """Each image (dim 0) to mean 0 and standard deviation 1 over its other dims (Horama's `standardize`)."""
    dims = tuple(range(1, x.dim()))
    return (x - x.mean(dims, keepdim=True)) / (x.std(dims, keepdim=True) + 1e-4)


def crops(canvas: Tensor, boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """B 3 S S canvases, B K 4 boxes (y0, x0, y1, x1 in fractions of the side, possibly beyond [0, 1]) -> (B K) 3
    h w crops, bilinear (`roi_align`, two samples a bin), read from the canvas padded circularly."""
    b, k, _ = boxes.shape
    side = canvas.shape[-1]
    pad = math.ceil(PAD * side)
    padded = F.pad(canvas, (pad, pad, pad, pad), mode="circular")
    y0, x0, y1, x1 = (boxes * side + pad).unbind(-1)
    index = torch.arange(b, device=canvas.device, dtype=canvas.dtype)[:, None].expand(b, k)
    rois = rearrange(torch.stack([index, x0, y0, x1, y1], dim=-1), 'b k five -> (b k) five')
    return roi_align(padded, rois, output_size=size, sampling_ratio=2, aligned=True)


class Phase(nn.Module):
    """MACO's parametrisation: the phase, under a fixed magnitude, colour matrix and phase offset -> B 3 S S in
    [0, 1]."""

    def __init__(self, phase: Tensor, magnitude: Tensor, colour: Tensor, offset: Tensor):
        super().__init__()
        self.phase = nn.Parameter(phase)
        self.register_buffer("magnitude", magnitude)
        self.register_buffer("colour", colour)
        self.register_buffer("offset", offset)

    def decorrelated(self) -> Tensor:
        """y, B 3 S S: the standardised image of decorrelated colours, whose spectrum's magnitude is the template's."""
        angle = standardise(self.phase) + self.offset
        side = self.phase.shape[-2]
        return standardise(torch.fft.irfft2(torch.polar(self.magnitude.expand_as(angle), angle), s=(side, side)))

    def forward(self) -> Tensor:
        y = self.decorrelated()
        return torch.sigmoid(torch.einsum('bchw,dc->bdhw', y, self.colour))


class Canvas(nn.Module):
    """The pixel parametrisation: the canvas itself, B 3 S S, kept in [0, 1]."""

    def __init__(self, pixels: Tensor):
        super().__init__()
        self.pixels = nn.Parameter(pixels)

    def forward(self) -> Tensor:
        return self.pixels


@dataclass(frozen=True)
class Maco:
    """MACO's settings (the module docstring): the canvas side in model inputs, crop sides, noise, NAdam's lr."""
    name: ClassVar[str] = "maco"
    canvas: float = 2.0                      # the canvas's side in model inputs
    box: tuple[float, float] = (0.5, 0.6)    # crop sides, fractions of the canvas's
    noise: float = 0.05                      # Gaussian and uniform, in the model's normalised units
    lr: float = 1.0

    def parametrise(self, randomness: Randomness, *, side: int, steps: int) -> tuple[nn.Module, Optimiser, None]:
        """-> (the parametrisation, its optimiser, no schedule): a random phase and offset under the template."""
        device = randomness.device
        shape = (3, side, side // 2 + 1)
        phase = randomness.draw("normal", shape)
        offset = math.pi * (2 * randomness.draw("uniform", shape) - 1)
        image = Phase(phase, natural.magnitude(side).to(device), natural.colour_matrix().to(device), offset)
        return image, torch.optim.NAdam(image.parameters(), lr=self.lr), None

    def augment(self, canvas: Tensor, randomness: Randomness, *, copies: int, size: tuple[int, int],
                progress: float) -> tuple[Tensor, Tensor]:
        """-> ((B K) 3 h w crops in [0, 1], the (B K) 3 h w noise to add once they are normalised)."""
        centre = 0.5 + 0.15 * randomness.draw("normal", (copies, 2))
        lo, hi = self.box
        half = (lo + (hi - lo) * randomness.draw("uniform", (copies, 1))) / 2
        cut = crops(canvas, torch.cat([centre - half, centre + half], dim=-1), size)
        shape = (copies, 3, *size)
        noise = self.noise * (randomness.draw("normal", shape) + randomness.draw("uniform", shape) - 0.5)
        return cut, rearrange(noise, 'b k c h w -> (b k) c h w')

    def penalty(self, canvas: Tensor) -> Tensor:
        """B: none (the magnitude is the regulariser)."""
        return canvas.new_zeros(canvas.shape[0])

    def project(self, image: nn.Module) -> None:
        """Nothing after a step: any phase is a picture."""


@dataclass(frozen=True)
class Pixels:
    """Ghiasi et al.'s settings (the module docstring): augmentations, the TV weight, Adam's lr."""
    name: ClassVar[str] = "pixels"
    canvas: float = 1.0                        # the canvas's side in model inputs
    jitter: float = 1 / 7                      # the roll, a fraction of the side (32 px of 224)
    scale: tuple[float, float] = (1.0, 1.1)    # the zoom
    colour: float = 1.0                        # colour jitter: m and s uniform in ±colour
    shift: float = 0.5                         # the per-channel Gaussian shift at the first step
    tv: float = 0.0005
    lr: float = 0.1

    def parametrise(self, randomness: Randomness, *, side: int, steps: int) -> tuple[nn.Module, Optimiser, Schedule]:
        """-> (the canvas, Adam, its cosine schedule to 0 over `steps`)."""
        image = Canvas(randomness.draw("uniform", (3, side, side)))
        optimiser = torch.optim.Adam(image.parameters(), lr=self.lr, betas=(0.5, 0.99))
        return image, optimiser, torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)

    def augment(self, canvas: Tensor, randomness: Randomness, *, copies: int, size: tuple[int, int],
                progress: float) -> tuple[Tensor, Tensor]:
        """-> ((B K) 3 h w jittered, zoomed, colour-jittered and shifted copies in [0, 1] units, no added noise)."""
        shift = self.jitter * (2 * randomness.draw("uniform", (copies, 2)) - 1)
        lo, hi = self.scale
        half = 0.5 / (lo + (hi - lo) * randomness.draw("uniform", (copies, 1)))
        centre = 0.5 + shift
        cut = crops(canvas, torch.cat([centre - half, centre + half], dim=-1), size)
        m = self.colour * (2 * randomness.draw("uniform", (copies, 3, 1, 1)) - 1)
        s = torch.exp(self.colour * (2 * randomness.draw("uniform", (copies, 3, 1, 1)) - 1))
        offset = self.shift * (1 - progress) * randomness.draw("normal", (copies, 3, 1, 1))
        flat = lambda t: rearrange(t, 'b k c h w -> (b k) c h w')
        return (cut - flat(m)) / flat(s) + flat(offset), torch.zeros_like(cut)

    def penalty(self, canvas: Tensor) -> Tensor:
        """B: `tv` times the total variation of each canvas."""
        return self.tv * total_variation(canvas)

    def project(self, image: nn.Module) -> None:
        """The canvas back into [0, 1] after a step (their `Clip`)."""
        with torch.no_grad():
            image.pixels.clamp_(0, 1)


def total_variation(x: Tensor) -> Tensor:
    """B: Ghiasi et al.'s TV, the L2 norms (over h, w) of each channel's horizontal, vertical and diagonal
    differences, each averaged over the channels, summed."""
    differences = (x[..., :, 1:] - x[..., :, :-1], x[..., 1:, :] - x[..., :-1, :],
                   x[..., 1:, 1:] - x[..., :-1, :-1], x[..., 1:, :-1] - x[..., :-1, 1:])
    return sum(d.flatten(-2).norm(dim=-1).mean(-1) for d in differences)


METHODS = {method.name: method for method in (Maco, Pixels)}
