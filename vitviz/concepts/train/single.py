"""Training a dictionary on activations: `train(activations, kind="topk", k=32, expansion=8)`.

The loss of a batch of t tokens, in normalised space (x̃ = (x - offset) / scale, `kinds/dictionary.py`):

    L = mean over the t·d entries of (x̃ - x̂)²                   x̂ = z W_dec + b_dec
      + l1 · (1/t) Σ_t Σ_i z_ti / d                              standard (ReLU) dictionaries
      + auxk_alpha · AuxK                                        TopK and BatchTopK

As the normalised entries have variance about 1, the first term is about the batch's FVU. The L1 term
(Σ_i z_i ‖W_dec[i]‖, the rows being unit) is divided by d like the squared error, so L is SAELens's
standard loss (squared error summed over the d entries + l1 · Σ_i z_i) divided by d: `l1` is its
`l1_coefficient`, and keeps its meaning whatever d is.

AuxK (Gao et al. 2024, A.2). A concept is dead once it has not fired for `dead_after` tokens (Gao et
al.: 10 M; here at most half an epoch of a tensor, so that short runs see it). With e = x̃ - x̂ the
batch's residual (no gradient through it), the k_aux = min(512, #dead) largest pre-activations among
the dead concepts reconstruct it, ê = ReLU(TopK_kaux(pre_dead)) W_dec (no bias), and

    AuxK = Σ_t ‖e_t - ê_t‖² / Σ_t ‖e_t‖²

normalised by the residual's own size so that its weight (1/32) keeps its meaning as x̂ improves. The
dead concepts get gradients again and come back towards directions the others miss.

The decoder. Its rows start as random unit vectors, the encoder as their transpose and both biases at 0
(Gao et al.; the normalisation has already centred the data, so b_dec = 0 is the mean). After each
backward pass the part of each row's gradient along the row is removed, g_i ← g_i - (g_i · W_dec[i])
W_dec[i], and after each Adam step the rows are scaled back to unit norm (Gao et al.; Bricken et al.),
so a concept cannot shrink its direction to cheat the L1 penalty or grow it to outbid others.

Data-parallel (torchrun). In a process group of W ranks (as `vitviz.distributed.ranks` opens one) every
rank reads the same activations in the same order, so the normalisation, estimated from the same first
tokens, is the same everywhere, and trains on its share of each batch of t tokens, rows [⌊r t / W⌋,
⌊(r + 1) t / W⌋) (`activations/parallel.py`: the reductions, and why they make the step one process's). The loss's
means are sums over the share divided by the whole batch's count (t·d entries, t tokens), so the ranks'
gradients, summed before the decoder's parallel part is removed, are the whole batch's; AuxK's
denominator Σ‖e‖² is the whole batch's, summed over the ranks before the division; a concept fired if it
fired on any rank; BatchTopK's cut and smallest kept code are the whole batch's (`kinds/batchtopk.py`); the
progress numbers are the whole batch's. Every rank ends with the same dictionary, one process's but for
the order of the sums (within 1e-5 after dozens of steps). Only rank 0 shows the progress and writes the
checkpoint; every rank resumes from it, so its path must be one they all read (ranks that would resume
from different steps, or whose activations differ, are refused).

The loop itself (the schedule, the progress read every PROGRESS_EVERY steps, the checkpoints) is `loop.py`'s,
which the dictionary across models (`across.py`) trains through too, with these defaults, AuxK and the decoder's
constraint.
"""
from __future__ import annotations

import itertools
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from ..activations import parallel
from ..activations.batches import Activations, epoch_order, head_of, is_one_pass, token_count
from ..kinds import kind_named
from ..kinds.batchtopk import THRESHOLD_RATE, BatchTopK
from ..kinds.dictionary import ConceptsError, Dictionary, Origin
from ..kinds.topk import top_k_relu
from .loop import Schedule, TrainingProgress, check_schedule, read_checkpoint, run_schedule, write_checkpoint

K = 32               # concepts per token, TopK and BatchTopK
L1 = 1.0            # the standard dictionary's L1 coefficient: SAELens's l1_coefficient (see the loss above)
K_AUX = 512          # Gao et al.'s k_aux
AUXK_ALPHA = 1 / 32  # Gao et al.'s weight of AuxK
DEAD_AFTER = 10_000_000   # tokens without firing after which a concept is dead (Gao et al.)
WARMUP = 100         # warm-up steps, at most (the command line's default: a tenth of the run below that)
TRAINING_TOKENS = 2_000_000   # the command line's default run: tokens trained on, at least one pass (see default_steps)
FIT_TOKENS = 65_536  # tokens the finished dictionary's FVU is measured on (the first of its data, in training order)
BATCH_SIZE = 4096    # tokens a step
POOR_FIT = 0.5       # a finished dictionary at or above this FVU is reported as explaining too little


def default_steps(tokens: int, batch_size: int) -> int:
    """The command line's schedule for `tokens` training tokens: at least one pass, and at least TRAINING_TOKENS
    tokens in all. A few thousand photos are a few hundred thousand tokens: one pass is tens of steps, too few
    for a dictionary to settle (3,000 CIFAR-10 images, one pass of 4,096-token steps: FVU 0.75; 2 M tokens: 0.2)."""
    return max(math.ceil(tokens / batch_size), math.ceil(TRAINING_TOKENS / batch_size))


def default_warmup(steps: int) -> int:
    """The learning rate's warm-up: a tenth of the run, and at most WARMUP steps."""
    return max(1, min(WARMUP, steps // 10))


def fit_warning(fvu: float, *, what: str = "The dictionary") -> str | None:
    """In words, what is wrong with a finished dictionary whose FVU is POOR_FIT or more, and what to change;
    None for one that explains most of its layer."""
    if not fvu >= POOR_FIT:   # NaN (no variance) is refused elsewhere
        return None
    how = (f"explains less of its layer than the layer's mean does (FVU {fvu:.2f}, at least 1)" if fvu >= 1 else
           f"explains only {1 - fvu:.0%} of its layer's variance (FVU {fvu:.2f}; a usable one is below {POOR_FIT})")
    return (f"{what} {how}. Train on more images, for more steps (--steps, or steps=...), or with a smaller k "
            f"(fewer concepts per token are easier to learn, but rebuild less).")


def train(activations: Activations, *, kind: str = "topk", k: int | None = None, expansion: int = 8,
          l1: float | None = None, epochs: int = 1, steps: int | None = None, batch_size: int = BATCH_SIZE,
          lr: float = 4e-4, warmup: int = WARMUP,
          auxk_alpha: float = AUXK_ALPHA, k_aux: int = K_AUX, dead_after: int | None = None,
          threshold_rate: float = THRESHOLD_RATE, norm_tokens: int = 100_000, seed: int = 0,
          model: str | None = None, revision: str | None = None, block: int | None = None,
          tokens: str | None = None, checkpoint: str | Path | None = None, checkpoint_every: int = 500,
          device: str | torch.device | None = None, progress: bool = True) -> Dictionary:
    """A dictionary of `expansion` x d concepts trained on `activations` (raw: a tensor (..., d), or an
    iterable of (..., d) batches; a one-pass iterator only for one epoch), in eval mode on `device`, for `epochs`
    passes or, given `steps`, that many steps (`default_steps` gives a run long enough to settle).

    `kind`: 'standard' (ReLU + `l1`, default 1.0), 'topk' or 'batchtopk' (`k` concepts per token, default
    32). `model`, `revision`, `block` and `tokens` say what the activations are; the dictionary and its file
    keep them. A progress bar (stderr, unless `progress=False`) shows the epoch's running FVU and L0. The
    module docstring has the loss, AuxK, the decoder's constraint, how `checkpoint` resumes and how ranks of a
    process group (torchrun's) share each batch: then every rank is given the same activations, and returns the
    same dictionary. Its `training_record` keeps how it was trained and its FVU when done, measured on the
    first FIT_TOKENS tokens of its data, with a warning in words (also raised as a `UserWarning`) if that is
    POOR_FIT or more.
    Raises `ConceptsError` for settings or activations that can't be trained on, said in words.
    """
    cls = kind_named(kind)
    if cls.penalised and k is not None:
        raise ConceptsError(f"k is for TopK and BatchTopK dictionaries; a {kind} dictionary is made sparse by its "
                            f"L1 penalty (l1=...).")
    if not cls.penalised and l1 is not None:
        raise ConceptsError(f"l1 is for standard dictionaries; a {kind} dictionary keeps k concepts per token "
                            f"(k=...).")
    check_schedule([activations], expansion=expansion, epochs=epochs, steps=steps, batch_size=batch_size,
                   checkpoint_every=checkpoint_every, warmup=warmup)
    count = token_count(activations)
    settings = {"kind": kind, "expansion": expansion, "batch_size": batch_size, "lr": lr, "warmup": warmup,
                "norm_tokens": norm_tokens, "seed": seed,
                **({"l1": L1 if l1 is None else l1} if cls.penalised else
                   {"k": K if k is None else k, "auxk_alpha": auxk_alpha, "k_aux": k_aux,
                    "dead_after": dead_after or (min(DEAD_AFTER, max(1, count // 2)) if count else DEAD_AFTER)}),
                **({"threshold_rate": threshold_rate} if cls is BatchTopK else {}),
                "origin": Origin(model, revision, block, tokens).to_dict()}
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checkpoint = Path(checkpoint) if checkpoint is not None else None

    state = read_checkpoint(checkpoint, settings, device) if checkpoint and checkpoint.exists() else None
    first_epoch = None
    if state is None:
        head, rest = head_of(epoch_order(activations, 0, batch_size, seed), norm_tokens)
        first_epoch = itertools.chain(head, rest)
        dictionary = _initialised(cls, head, settings)
        dictionary.normalisation.fit(torch.cat(head)[:norm_tokens])
        dictionary.to(device)
    else:
        dictionary = _initialised(cls, None, settings, d=state["d"]).to(device)
        dictionary.load_state_dict(state["dictionary"])
    position, numbers = TrainingProgress.started(state, dictionary.n_concepts,
                                                 None if cls.penalised else settings["dead_after"], device)
    if parallel.active():
        _check_ranks_agree(dictionary, position["step"])
    dictionary.train()
    optimizer = torch.optim.Adam(dictionary.parameters(), lr=lr)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    leader = parallel.rank() == 0
    schedule = Schedule(epochs=None if steps is not None else epochs, steps=steps, warmup=warmup, lr=lr)

    def epoch_batches(epoch: int) -> Iterator[Tensor]:
        if epoch == 0 and first_epoch is not None:
            return first_epoch
        return epoch_order(activations, epoch, batch_size, seed)

    def train_step(x: Tensor, step: int) -> int:
        _step(dictionary, optimizer, parallel.share(x).to(device), numbers, settings, step, tokens=len(x))
        return len(x)

    def save(last_epoch: dict | None) -> None:
        write_checkpoint(checkpoint, dictionary, optimizer, settings, position, numbers.running, numbers.since_fired,
                          last_epoch=last_epoch)

    total = schedule.total(math.ceil(count / batch_size) if count else None)
    with tqdm(total=total, initial=position["step"], desc=f"{kind} dictionary", unit="step", file=sys.stderr,
              disable=not (progress and leader), mininterval=1) as bar:
        last_epoch = run_schedule(epoch_batches, train_step, schedule=schedule, position=position, numbers=numbers,
                                  optimizer=optimizer, bar=bar, save=save if checkpoint and leader else None,
                                  checkpoint_every=checkpoint_every)
    if last_epoch is None:   # it had already finished: nothing trained now
        last_epoch = state["last_epoch"]
    dictionary.eval()
    how = {key: value for key, value in settings.items() if key != "origin"}   # the origin has its own place
    fvu = fitted_fvu(dictionary, activations, batch_size, seed)
    passes = epochs if steps is None else round(position["tokens"] / count, 3) if count else None
    dictionary.training_record = {**how, "epochs": passes, "steps": position["step"], "tokens": position["tokens"],
                                  "last_epoch": last_epoch, "fvu": fvu,
                                  **({"warning": warning} if (warning := fit_warning(fvu)) else {})}
    if warning and leader:   # said once, like the progress
        warnings.warn(warning, stacklevel=2)
    return dictionary


def fitted_fvu(dictionary: Dictionary, activations: Activations, batch_size: int, seed: int) -> float:
    """The finished dictionary's FVU on the first FIT_TOKENS tokens of its data in training order (a one-pass
    iterator, read already: NaN)."""
    from ..analysis.metrics import metrics

    if is_one_pass(activations):
        return math.nan
    head, _ = head_of(epoch_order(activations, 0, batch_size, seed), FIT_TOKENS)
    return metrics(dictionary, torch.cat(head)[:FIT_TOKENS]).fvu


def _step(dictionary: Dictionary, optimizer: torch.optim.Optimizer, x: Tensor, numbers: TrainingProgress,
          settings: dict, step: int, *, tokens: int) -> None:
    """One optimisation step on x (t d), this rank's share of a raw batch of `tokens` tokens (all of it in one
    process), adding the whole batch's squared errors, spread (about its mean), codes > 0 and tokens to `numbers`
    and updating its tokens since each concept fired; nothing read back from the device."""
    normalised = dictionary.normalisation(x)
    pre = dictionary.pre_activations(normalised)
    codes = dictionary.training_activation(pre)
    reconstruction = dictionary.decode_normalised(codes)
    error = normalised - reconstruction
    squared_error = error.square().sum()
    with torch.no_grad():   # the whole batch's sums: AuxK's denominator, the fired concepts, the progress numbers
        exact = normalised.double()
        sums = parallel.total(torch.cat([squared_error.double()[None], exact.square().sum()[None],
                                         (~x.isfinite()).sum().double()[None], exact.sum(0),
                                         (codes > 0).sum(0).double()]))
    whole_squared_error, squares, not_finite = sums[0], sums[1], sums[2]
    moments, fired = sums[3:3 + dictionary.d], sums[3 + dictionary.d:]   # fired: tokens each concept fired on
    loss = squared_error / (tokens * dictionary.d)
    if dictionary.penalised:
        loss = loss + settings["l1"] * codes.sum() / (tokens * dictionary.d)
    elif settings["auxk_alpha"] and (dead_at_most := numbers.may_be_dead()):
        dead = numbers.since_fired >= settings["dead_after"]
        loss = loss + settings["auxk_alpha"] * auxk(pre, error.detach(), dead, dictionary.W_dec,
                                                    min(settings["k_aux"], dead_at_most),
                                                    residual_total=whole_squared_error)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    parallel.sum_gradients(dictionary.parameters())   # each rank's share of the loss: summed, the whole batch's
    remove_parallel_gradient(dictionary.W_dec)
    optimizer.step()
    with torch.no_grad():
        dictionary.W_dec /= dictionary.W_dec.norm(dim=-1, keepdim=True)
        dictionary.observe(codes.detach())
        numbers.since_fired += tokens
        numbers.since_fired.masked_fill_(fired > 0, 0)
        spread = squares - moments.square().sum() / tokens   # Σ‖x̃ - x̄‖² = Σ‖x̃‖² - ‖Σ x̃‖² / t
        numbers.add(torch.stack([whole_squared_error, spread, fired.sum(), sums.new_full((), tokens)]),
                    parallel.total(loss.detach()), not_finite, step=step, tokens=tokens)


def auxk(pre: Tensor, residual: Tensor, dead: Tensor, W_dec: Tensor, k_aux: int, *,
         residual_total: Tensor | None = None) -> Tensor:
    """Gao et al.'s AuxK: the residual (t d) reconstructed from the k_aux largest pre-activations (t n) among
    the `dead` concepts (n), Σ‖e - ê‖² / Σ‖e‖². `k_aux` at least the number dead: the others, masked to -inf,
    give 0 (so the caller can choose it without reading `dead` back from the device). `residual_total` is the
    denominator Σ‖e‖² when the batch is more than these tokens (under torchrun: the whole batch's, summed over the
    ranks); default this residual's."""
    dead_pre = pre.masked_fill(~dead, -torch.inf)
    revived = top_k_relu(dead_pre, min(k_aux, len(dead)))
    total = residual.square().sum() if residual_total is None else residual_total.to(pre.dtype)
    return (residual - revived @ W_dec).square().sum() / total.clamp_min(torch.finfo(pre.dtype).tiny)


@torch.no_grad()   # recorded, the change would give the gradient a history, kept step after step by the optimizer
def remove_parallel_gradient(W_dec: torch.nn.Parameter) -> None:
    """g_i ← g_i - (g_i · w_i) w_i for each unit row w_i: the step then turns the rows without lengthening them."""
    if W_dec.grad is not None:
        W_dec.grad -= (W_dec.grad * W_dec).sum(-1, keepdim=True) * W_dec


def _check_ranks_agree(dictionary: Dictionary, step: int) -> None:
    """Under torchrun: a ConceptsError on every rank unless all of them start at the same step (read the same
    checkpoint, or none) with the same normalisation (read the same activations)."""
    normalisation = dictionary.normalisation
    start = torch.tensor([step], dtype=torch.float64, device=normalisation.scale.device)
    low, high = parallel.extremes(torch.cat([start, normalisation.offset.double(), normalisation.scale.double()[None]]))
    if low[0] != high[0]:
        raise ConceptsError(f"The ranks would start at different steps ({int(low[0])} to {int(high[0])}): they found "
                            f"different checkpoints, or some found none. Under torchrun every rank reads the one "
                            f"checkpoint rank 0 writes: give a path on a disk all of them share.")
    if not torch.allclose(low[1:], high[1:], rtol=1e-6, atol=1e-6 * normalisation.scale.item()):
        raise ConceptsError("The ranks' activations differ: their first tokens give different normalisations. Under "
                            "torchrun every rank reads all the activations and trains on its share of each batch: "
                            "give each rank the same activations, not a shard of its own.")


def _initialised(cls: type[Dictionary], head: list[Tensor] | None, settings: dict, *,
                 d: int | None = None) -> Dictionary:
    """A dictionary of `settings` for d-wide activations (d from the first batch of `head`): random unit decoder
    rows drawn from the seed, the encoder their transpose, zero biases."""
    d = d if d is not None else head[0].shape[1]
    kind_settings = {key: settings[key] for key in ("k", "threshold_rate") if key in settings}
    dictionary = cls(d, settings["expansion"] * d, origin=Origin.from_dict(settings["origin"]), **kind_settings)
    generator = torch.Generator().manual_seed(settings["seed"])
    rows = torch.randn(dictionary.n_concepts, d, generator=generator)
    with torch.no_grad():
        dictionary.W_dec.copy_(rows / rows.norm(dim=-1, keepdim=True))
        dictionary.W_enc.copy_(dictionary.W_dec.T)
    return dictionary
