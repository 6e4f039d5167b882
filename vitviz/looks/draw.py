"""The optimisation: B pictures at once, one per target, in one model or in several at once.

Each step makes the canvases (`images.py`: MACO's phase or the pixels), shows every model K augmented copies of
each at its input size (normalised by its own preprocessing, noise added), traces them with the graph from the
pixels (`trace(grad=True, attention=False)`, the hidden units kept where a target is a unit), reads each image's
target (`targets.Readout`), and takes one optimiser step on

    objective_b = mean over models m of ( mean over the K copies of target_b in m ) / typical_m(target_b)
    loss = - Σ_b (objective_b - penalty_b)

(`typical` is 1 in one model; across several, each target's typical activation in that model: `targets.py`).
The gradient comes back by reverse mode (`torch.autograd.grad` on the phase or pixels and on the canvases alone,
so the models' weights get none and keep no .grad). Horama's transparency map is the sum over the steps of the
absolute gradient on the canvas, summed over the colours and scaled to a maximum of 1 per picture: where on the
canvas the objective cared. The paper's figures show it applied to the picture (Horama's `plot_maco`): clipped at
its 80th percentile and scaled to 1 there, as the picture's opacity (`transparent`), so what the objective cared
little about fades and the rest shows whole. The curve is each picture's objective at each step (before that step's
update), kept on the device and read once at the end.

On a GPU the models run under bfloat16 autocast (the parametrisation, the crops and the objective stay float32);
on the CPU in float32. Seeded per picture (`images.Randomness`, from `targets.Readout.start`: a concept's dictionary
and number, a unit's, channel's or class's place and models): the same seed, target and settings give the same
picture on the same device, whatever else is drawn beside it; two concepts of one number in two dictionaries start
apart; a concept of a dictionary across models starts alike in each of its models.

Variants (Olah et al. 2017, "Feature Visualization", Distill: "Diversity"). N pictures of each target are drawn
together, variant v from its own start (variant 0's the target's, so without the term it is the ordinary picture;
variant v's the target's start and v), and the loss gains their diversity term, Lucid's `objectives.diversity`:

    G_v = X_vᵀ X_v      X_v: variant v's grid tokens at the block its target reads, over its K copies (Kn x c)
    D_b = 1/N Σ_v Σ_{w≠v} <G_v, G_w> / (|G_v| |G_w|)
    loss = - Σ (objective - penalty) + diversity · Σ_b D_b

so the variants are pushed toward different styles (which channels fire together: Gatys et al.'s Gram matrix),
wherever on the picture. The block is the target's own (a class: the last), where every family's trace has the
tokens. Its weight, `DIVERSITY`, is measured on a bundled dictionary's concepts (docs/looks.md): at 0.5 their
Gram matrices' cosine falls from 0.89 to 0.73 and as many variants excite their concept as without it; at 2 they
fire less. The negative is the same optimisation with the objective's sign turned: the picture that lowers it most
(its curve, the objective, falls). Neither changes the ordinary drawing: without them the loss is the one above.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor
from tqdm import tqdm

from ..models.trace import Trace
from .images import METHODS, Maco, Pixels, Randomness
from .targets import LooksError, Readout, Target

Progress = Callable[[int, int], None]   # (steps done, steps in all)
MAX_VARIANTS = 8       # pictures of one target drawn together at most
DIVERSITY = 0.5        # the diversity term's weight against the objective (docs/looks.md, "Variants": measured)
DRAWING = 2            # the drawing's revision, recorded with shipped pictures: 2, the random phase offset and seeds
                       # from the target's identity (issue 56); 1, the standardised phase alone and seeds by number
ALPHA_PERCENTILE = 80  # the transparency map is clipped here before it is applied (Horama's `plot_maco`)


@dataclass(frozen=True)
class Settings:
    """How pictures are drawn: the method ('maco', 'pixels', or one's settings: `images.Maco`, `images.Pixels`),
    the steps, the augmented copies each model sees of each picture per step, the seed, and the canvas's side in px
    (None: the method's, in model inputs)."""
    method: Maco | Pixels = field(default_factory=Maco)
    steps: int = 64
    copies: int = 4
    seed: int = 0
    canvas: int | None = None

    def __post_init__(self):
        if isinstance(self.method, str):
            if self.method not in METHODS:
                raise LooksError(f"There is no method {self.method!r}; there are {', '.join(METHODS)}.")
            object.__setattr__(self, "method", METHODS[self.method]())
        for name, least in (("steps", 1), ("copies", 1), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise LooksError(f"{name} must be a whole number of at least {least}, not {value!r}.")
        if self.canvas is not None and (not isinstance(self.canvas, int) or not 8 <= self.canvas <= 2048):
            raise LooksError(f"The canvas must be from 8 to 2048 px, not {self.canvas!r}.")

    def side(self, inputs: Sequence[tuple[int, int]]) -> int:
        """The canvas's side in px for models of these input sizes."""
        return self.canvas or round(self.method.canvas * max(max(size) for size in inputs))


@dataclass(frozen=True)
class Drawing:
    """B pictures (B targets x their N variants, target-major), their canvases, transparency maps and objective
    curves, as plain arrays."""
    images: np.ndarray        # B S S 3 float32 in [0, 1]
    alpha: np.ndarray         # B S S float32 in [0, 1]: where the optimisation's gradient went (1: most)
    curve: np.ndarray         # B steps float32: the objective before each step
    models: tuple[str, ...]   # the models it was drawn in
    method: str
    seed: int
    variants: int = 1         # N: picture b * N + v is target b's variant v
    negative: bool = False    # whether each picture lowers its target (the objective minimised)


def transparent(image: np.ndarray, alpha: np.ndarray, *, percentile: float = ALPHA_PERCENTILE) -> np.ndarray:
    """A picture (h w 3) with its transparency map (h w) applied as the paper shows it: h w 4 uint8 RGBA, the
    opacity the map clipped at its `percentile`-th percentile and scaled to 1 there. Either may be floats in [0, 1]
    or uint8 (as shipped); the map's own scale does not matter."""
    image, alpha = np.asarray(image), np.asarray(alpha, dtype=np.float64)
    if image.ndim != 3 or image.shape[-1] != 3 or alpha.shape != image.shape[:2]:
        raise LooksError(f"A picture is h w 3 and its transparency map h w; got {image.shape} and {alpha.shape}.")
    if not 0 < percentile <= 100:
        raise LooksError(f"The percentile the map is clipped at must be in (0, 100], not {percentile!r}.")
    pixels = image if image.dtype == np.uint8 else np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
    opacity = np.clip(alpha / max(float(np.percentile(alpha, percentile)), 1e-12), 0, 1)
    return np.concatenate([pixels, np.round(opacity * 255).astype(np.uint8)[..., None]], axis=-1)


def device_for(device: str | torch.device | None) -> torch.device:
    """The device asked for, else the GPU where there is one, else the CPU."""
    return torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")


def gram_cosines(tokens: Tensor, *, variants: int, copies: int) -> Tensor:
    """(B N K) n c grid tokens of B targets' N variants, each seen in K copies -> B N N: the cosine similarity of each
    two variants' Gram matrices G = Xᵀ X (X: a variant's K n tokens, c wide), the style of a picture: which channels
    fire together, wherever they do (Gatys et al. 2015)."""
    x = rearrange(tokens.float(), '(b v k) n c -> b v (k n) c', v=variants, k=copies)
    grams = F.normalize(torch.einsum('bvtc,bvtd->bvcd', x, x).flatten(2), dim=-1, eps=1e-10)
    return torch.einsum('bvg,bwg->bvw', grams, grams)


def diversity_term(trace: Trace, groups: dict[int, Tensor], *, targets: int, variants: int, copies: int) -> Tensor:
    """B: each target's diversity term (Olah et al. 2017; Lucid's `objectives.diversity`): the summed cosine
    similarity of each variant's Gram matrix with its N - 1 others', averaged over the N, at the block the target
    reads (`groups`: block -> the targets that read it, from `Readout.blocks`). 0 for variants of unrelated styles,
    N - 1 for variants alike."""
    out = trace.logits.new_zeros(targets, dtype=torch.float32)
    for index, chosen in groups.items():
        block = trace.blocks[index]
        tokens = rearrange(block.tokens[:, block.prefix:], '(b r) n c -> b r n c', b=targets)[chosen]
        cosines = gram_cosines(rearrange(tokens, 'b r n c -> (b r) n c'), variants=variants, copies=copies)
        out = out.index_copy(0, chosen, (cosines.sum((1, 2)) - cosines.diagonal(dim1=1, dim2=2).sum(-1)) / variants)
    return out


def style_groups(readout: Readout, variants: int) -> dict[int, Tensor]:
    """The block each target of `readout` (its N variants each) reads -> those targets' numbers, on its device."""
    blocks = readout.blocks[::variants]
    return {index: torch.tensor([b for b, block in enumerate(blocks) if block == index], device=readout.loaded.device)
            for index in dict.fromkeys(blocks)}


def draw(models, targets: Target | Sequence[Target], *, settings: Settings = Settings(), variants: int = 1,
         diversity: float = DIVERSITY, negative: bool = False, device: str | torch.device | None = None,
         progress: Progress | None = None, bar: bool = True) -> Drawing:
    """One picture per target (B targets, drawn together), maximising it in every model of `models` at once (a
    model's name or a `hub.LoadedModel`, or several: the same concept of a dictionary across them, or the same
    class). `variants` N > 1: N pictures of each target drawn together from N starts (variant 0's the target's own,
    variant v's the target's and v), pushed apart by Olah et al.'s diversity term (`diversity_term`) weighted
    `diversity`. `negative`: the pictures that lower each target most (the objective minimised; the curve is still
    the objective). `progress(step, steps)` hears every step; `bar` shows tqdm's. Every target is checked against
    every model before the first step, and refused in words (`LooksError`)."""
    from .. import hub

    targets = [targets] if isinstance(targets, Target) else list(targets)
    models = [models] if isinstance(models, (str, hub.LoadedModel)) else list(models)
    if not targets or not models:
        raise LooksError("Give at least one model and one target to draw.")
    if not isinstance(variants, int) or isinstance(variants, bool) or not 1 <= variants <= MAX_VARIANTS:
        raise LooksError(f"The variants must be a whole number from 1 to {MAX_VARIANTS}, not {variants!r}.")
    if not isinstance(diversity, (int, float)) or isinstance(diversity, bool) or not 0 <= diversity < float("inf"):
        raise LooksError(f"The diversity term's weight must be a number of at least 0, not {diversity!r}.")
    device = device_for(device if device is not None or isinstance(models[0], str) else models[0].device)
    models = [hub.load(m, device=device) if isinstance(m, str) else m for m in models]
    if any(m.device != device for m in models):
        raise LooksError(f"The models must be on one device ({device}): load them there.")
    dictionaries: dict = {}
    pictured = [target for target in targets for _ in range(variants)]   # target-major: b * N + v
    readouts = [Readout(m, pictured, dictionaries=dictionaries, normalised=len(models) > 1) for m in models]
    method, steps, copies = settings.method, settings.steps, settings.copies
    names = [m.name for m in models]
    starts = [readouts[0].start(t, names) for t in targets]
    randomness = Randomness([start if v == 0 else f"{start}, variant {v}" for start in starts for v in range(variants)],
                            seed=settings.seed, device=device)
    styles = [style_groups(readout, variants) for readout in readouts] if variants > 1 else []
    image, optimiser, schedule = method.parametrise(randomness, side=settings.side([m.transform.crop for m in models]),
                                                    steps=steps)
    parameter = next(image.parameters())
    curve = torch.zeros(steps, len(pictured), device=device)
    alpha = None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for step in tqdm(range(steps), desc=f"drawing {len(pictured)} with {method.name}", unit="step", disable=not bar,
                     leave=False):
        canvas = image()
        objective = alike = 0
        for m, (loaded, readout) in enumerate(zip(models, readouts)):
            cut, noise = method.augment(canvas, randomness, copies=copies, size=loaded.transform.crop,
                                        progress=step / steps)
            with autocast:
                trace = loaded.model.trace(loaded.transform.normalize(cut) + noise, grad=True, attention=False,
                                           units=readout.units)
            objective = objective + readout(trace, copies).mean(1) / readout.typical
            if styles:
                alike = alike + diversity_term(trace, styles[m], targets=len(targets), variants=variants,
                                               copies=copies)
        objective = objective / len(models)
        curve[step] = objective.detach()
        gain = -objective if negative else objective
        loss = -(gain - method.penalty(canvas)).sum()
        if styles:
            loss = loss + diversity * alike.sum() / len(models)
        parameter.grad, canvas_grad = torch.autograd.grad(loss, [parameter, canvas])
        alpha = canvas_grad.abs().sum(1) if alpha is None else alpha + canvas_grad.abs().sum(1)
        optimiser.step()
        if schedule is not None:
            schedule.step()
        method.project(image)
        if progress is not None:
            progress(step + 1, steps)
    with torch.no_grad():
        final = image().permute(0, 2, 3, 1).float().cpu().numpy()
        alpha = alpha / alpha.flatten(1).max(1).values.clamp(min=1e-12)[:, None, None]
    return Drawing(images=final, alpha=alpha.float().cpu().numpy(), curve=curve.T.float().cpu().numpy(),
                   models=tuple(m.name for m in models), method=method.name, seed=settings.seed, variants=variants,
                   negative=negative)
