"""Training one dictionary across models (`train_across`, Thasarathan et al. 2025; the dictionary itself:
`kinds/across.py`).


The loss. A step takes one batch of t aligned rows and one model m, encodes m's tokens and reconstructs
every model's from those codes z^m:

    L_m = Σ_j (1 / (t d_j)) Σ_t ‖x̃^j_t - (z^m_t W_dec^j + b_dec^j)‖²   +   auxk_alpha · AuxK_m

Each term is model j's mean squared error in its normalised space, where the entries have variance 1 on
average, so each is about the FVU of j's reconstruction and no model outweighs another by its width or
scale (Thasarathan et al. sum the models' losses). AuxK_m is Gao et al.'s (`single.py`, `auxk`) on model
m's own residual x̃^m - x̂^m, with m's pre-activations and decoder.

Why it aligns. The gradient of L_m reaches m's encoder through every decoder, so m's codes are pushed to
be what every model can be rebuilt from: a concept m fires has to mean, in each j, what j's decoder row
for it adds. What m's tokens hold and the others' do not (a direction of m's own) is still worth a concept
that fires on m's tokens: with the unit rows, its code z costs z² in each other model's term (a unit row
adds z·w to a reconstruction that nothing in m's tokens predicts) and saves up to (cᵀw)² in m's, so it
fires on m's tokens at a smaller code than a model alone would give it.

What the loss leaves open. Two of its solutions cost the same and mean different things. (a) Paired own
concepts: one concept can be model A's own direction a (fired by A's encoder, A's row = a) and model B's
own direction b (fired by B's encoder, B's row = b) at once: when A fires it, B's row costs z² whatever it
points at, so sharing one concept between two own directions costs nothing and saves a concept. Such a
concept fires as often on A's tokens as on B's (firing entropy near 1) but never at the same places.
(b) Split shared concepts: a shared direction may be two concepts, one fired by A's encoder and one by
B's, each with good rows in both decoders (firing entropy near 0 each). Which one training lands on is
decided by the number of concepts (scarce: pairs; plentiful: splits) and the path of training, not by
the loss. So `across_metrics` measures, besides each concept's firing entropy over the models, its
co-firing: how often it fires in every model at the same place when it fires in one. A shared concept
does both; a paired one has a high entropy and a co-firing near 0, and is not counted shared.

The algorithm.
  1. Each model's normalisation from its first `norm_tokens` tokens in training order.
  2. The decoders' rows start as random unit vectors, drawn model after model from one generator seeded by
     `seed`; each encoder is its decoder's transpose, the biases 0 (as `single.py`).
  3. Step s takes the next batch of rows (the same rows of every model: a tensor's rows are shuffled each
     epoch by one permutation from (seed, epoch), `activations.batches.epoch_order`) and the model m = s mod M,
     round robin, so each encoder trains on every M-th batch and a run is repeatable.
  4. L_m, backward; the gradient along each decoder row removed in every model (`remove_parallel_gradient`);
     one Adam step over all the parameters (the other encoders got no gradient: Adam leaves them and their
     moments as they are); every decoder's rows scaled back to unit norm; m's BatchTopK threshold moves
     towards the smallest code kept (`observe`), so each model's threshold is learned from its own codes.
  5. Dead concepts: one counter per concept, of the tokens encoded (of any model) since it last fired.
     A concept of one model's alone fires on that model's steps and stays alive; counters per model
     would call it dead in the others, and AuxK would push it into them.

Adam at `lr`, warmed up linearly over `warmup` steps, as `single.py`. The progress bar shows the epoch's
running FVU, pooled over every model's reconstruction (Σ_j squared errors / Σ_j spreads, normalised
space), and L0 of the encoded tokens. Checkpoints as `single.py`'s: the whole state written atomically
every `checkpoint_every` steps and after each epoch, read with `torch.load(weights_only=True)`, refused
when its settings differ, a resumed run equal to one never interrupted.
"""
from __future__ import annotations

import itertools
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from ..activations.batches import (
    Activations,
    aligned,
    aligned_count,
    epoch_order,
    head_of,
    is_one_pass,
    refuse_unlike_models,
)
from ..analysis.across import across_metrics
from ..kinds import kind_named
from ..kinds.across import Across, refuse_model_names
from ..kinds.batchtopk import THRESHOLD_RATE
from ..kinds.dictionary import ConceptsError, Origin
from .loop import Schedule, TrainingProgress, check_schedule, read_checkpoint, run_schedule, write_checkpoint
from .single import (
    AUXK_ALPHA,
    BATCH_SIZE,
    DEAD_AFTER,
    FIT_TOKENS,
    K_AUX,
    WARMUP,
    K,
    auxk,
    fit_warning,
    remove_parallel_gradient,
)

EXPANSION = 8        # concepts per dimension of the widest model
KINDS = ("topk", "batchtopk")   # the kinds an across dictionary trains: sparse by their activation, no penalty


def train_across(activations: Sequence[Activations], *, models: Sequence[str],
                 revisions: str | Sequence[str | None] | None = None, blocks: int | Sequence[int | None] | None,
                 tokens: str | Sequence[str | None] | None, kind: str = "topk", k: int | None = None,
                 n_concepts: int | None = None, expansion: int | None = None, epochs: int = 1,
                 steps: int | None = None, batch_size: int = BATCH_SIZE, lr: float = 4e-4, warmup: int = WARMUP,
                 auxk_alpha: float = AUXK_ALPHA,
                 k_aux: int = K_AUX, dead_after: int | None = None, threshold_rate: float = THRESHOLD_RATE,
                 norm_tokens: int = 100_000, seed: int = 0, checkpoint: str | Path | None = None,
                 checkpoint_every: int = 500, device: str | torch.device | None = None,
                 progress: bool = True) -> Across:
    """One dictionary across the `models` trained on their aligned `activations` (one per model, in the order
    of `models`: raw tensors (t, d_m) whose row r is the same place of the same image in every model, or
    re-iterables of such batches), in eval mode on `device`.

    `kind`: 'topk' or 'batchtopk', `k` concepts per token (default 32). The code space has `n_concepts`
    concepts, or `expansion` (default 8) times the widest model's width; not both. `revisions`, `blocks`
    and `tokens` say what each model's activations are (one value for all, or one per model); each
    model's dictionary and file keep them. The rest is `train`'s: the module docstring has the loss, the
    step, the progress bar and how `checkpoint` resumes. Raises `ConceptsError` for settings or
    activations that can't be trained on, said in words.
    """
    models = list(models)
    refuse_model_names(models)
    if kind not in KINDS:
        kind_named(kind)   # a kind that does not exist is refused by its own words
        raise ConceptsError(f"A dictionary across models is of kind {' or '.join(KINDS)}; a {kind} dictionary is "
                            f"made sparse by a penalty the shared codes do not have.")
    refuse_unlike_models(activations, models)
    if n_concepts is not None and expansion is not None:
        raise ConceptsError(f"Give n_concepts ({n_concepts}) or expansion ({expansion}), not both: expansion "
                            f"is the number of concepts per dimension of the widest model.")
    if n_concepts is not None and (not isinstance(n_concepts, int) or n_concepts < 1):
        raise ConceptsError(f"n_concepts must be a whole number of at least 1, not {n_concepts!r}.")
    check_schedule(activations, expansion=expansion, epochs=epochs, steps=steps, batch_size=batch_size,
                   checkpoint_every=checkpoint_every, warmup=warmup)
    count = aligned_count(activations, models)
    origins = [Origin(model, revision, block, kind_of_tokens).to_dict() for model, revision, block, kind_of_tokens in
               zip(models, _per_model(revisions, "revisions", models), _per_model(blocks, "blocks", models),
                   _per_model(tokens, "tokens", models))]
    settings = {"kind": kind, "n_concepts": n_concepts, "expansion": expansion or (None if n_concepts else EXPANSION),
                "batch_size": batch_size, "lr": lr, "warmup": warmup, "norm_tokens": norm_tokens, "seed": seed,
                "k": K if k is None else k, "auxk_alpha": auxk_alpha, "k_aux": k_aux,
                "dead_after": dead_after or (min(DEAD_AFTER, max(1, count // 2)) if count else DEAD_AFTER),
                **({"threshold_rate": threshold_rate} if kind == "batchtopk" else {}), "origins": origins}
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checkpoint = Path(checkpoint) if checkpoint is not None else None

    state = read_checkpoint(checkpoint, settings, device) if checkpoint and checkpoint.exists() else None
    first_epoch = None
    if state is None:
        heads, first_epoch = [], []
        for model_activations in activations:
            head, rest = head_of(epoch_order(model_activations, 0, batch_size, seed), norm_tokens)
            heads.append(head)
            first_epoch.append(itertools.chain(head, rest))
        across = _initialised(settings, [head[0].shape[1] for head in heads])
        for dictionary, head in zip(across.per_model, heads):
            dictionary.normalisation.fit(torch.cat(head)[:norm_tokens])
        across.to(device)
    else:
        across = _initialised(settings, list(state["d"])).to(device)
        across.load_state_dict(state["dictionary"])
    position, numbers = TrainingProgress.started(state, across.n_concepts, settings["dead_after"], device)
    across.train()
    optimizer = torch.optim.Adam(across.parameters(), lr=lr)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    schedule = Schedule(epochs=None if steps is not None else epochs, steps=steps, warmup=warmup, lr=lr)

    def epoch_batches(epoch: int) -> Iterator[tuple[Tensor, ...]]:
        streams = first_epoch if epoch == 0 and first_epoch is not None else \
            [epoch_order(model_activations, epoch, batch_size, seed) for model_activations in activations]
        return aligned(streams, models)

    def train_step(rows: tuple[Tensor, ...], step: int) -> int:
        _step(across, optimizer, [x.to(device) for x in rows], step % len(models), numbers, settings, step)
        return len(rows[0])

    def save(last_epoch: dict | None) -> None:
        write_checkpoint(checkpoint, across, optimizer, settings, position, numbers.running, numbers.since_fired,
                         last_epoch=last_epoch)

    total = schedule.total(math.ceil(count / batch_size) if count else None)
    with tqdm(total=total, initial=position["step"], desc=f"{kind} dictionary across {len(models)} models",
              unit="step", file=sys.stderr, disable=not progress, mininterval=1) as bar:
        last_epoch = run_schedule(epoch_batches, train_step, schedule=schedule, position=position, numbers=numbers,
                                  optimizer=optimizer, bar=bar, save=save if checkpoint else None,
                                  checkpoint_every=checkpoint_every)
    if last_epoch is None:   # it had already finished: nothing trained now
        last_epoch = state["last_epoch"]
    across.eval()
    how = {key: value for key, value in settings.items() if key != "origins"}   # each file has its origin
    fvu = _fitted_fvu(across, activations, batch_size, seed)
    warning = [text for model in models if (text := fit_warning(fvu[model], what=f"Across the models, {model}'s "
                                                                                   f"reconstruction from its codes"))]
    passes = epochs if steps is None else round(position["tokens"] / count, 3) if count else None
    across.training_record = {**how, "n_concepts": across.n_concepts, "models": models, "epochs": passes,
                              "steps": position["step"], "tokens": position["tokens"], "last_epoch": last_epoch,
                              "fvu": fvu, **({"warning": " ".join(warning)} if warning else {})}
    for dictionary in across.per_model:
        dictionary.training_record = across.training_record   # so that one model's file alone says how
    for text in warning:
        warnings.warn(text, stacklevel=2)
    return across


def _fitted_fvu(across: Across, activations: Sequence[Activations], batch_size: int, seed: int) -> dict[str, float]:
    """Each model's FVU rebuilt from its own codes (1 - the R² matrix's diagonal), on the first FIT_TOKENS rows of
    the aligned data in training order."""
    if any(is_one_pass(model_activations) for model_activations in activations):
        return dict.fromkeys(across.models, math.nan)
    heads = [torch.cat(head_of(epoch_order(model_activations, 0, batch_size, seed), FIT_TOKENS)[0])[:FIT_TOKENS]
             for model_activations in activations]
    r2 = across_metrics(across, heads, batch_size=batch_size).r2
    return {model: float(1 - r2[m, m]) for m, model in enumerate(across.models)}


def _step(across: Across, optimizer: torch.optim.Optimizer, rows: list[Tensor], source: int,
          numbers: TrainingProgress, settings: dict, step: int) -> None:
    """One optimisation step: model `source`'s tokens of the aligned batch `rows` (one raw (t d_m) per model)
    encoded and every model's reconstructed from its codes, adding the squared errors and spreads summed over the
    models, codes > 0 and tokens to `numbers` and updating its tokens since each concept fired; nothing read back
    from the device."""
    for dictionary, x in zip(across.per_model, rows):
        dictionary.check_width(x.shape[1])
    encoder = across.per_model[source]
    normalised = [dictionary.normalisation(x) for dictionary, x in zip(across.per_model, rows)]
    pre = encoder.pre_activations(normalised[source])
    codes = encoder.training_activation(pre)
    errors = [target - dictionary.decode_normalised(codes) for dictionary, target in zip(across.per_model, normalised)]
    loss = sum(error.square().mean() for error in errors)
    if settings["auxk_alpha"] and (dead_at_most := numbers.may_be_dead()):
        loss = loss + settings["auxk_alpha"] * auxk(pre, errors[source].detach(),
                                                    numbers.since_fired >= settings["dead_after"], encoder.W_dec,
                                                    min(settings["k_aux"], dead_at_most))
    optimizer.zero_grad(set_to_none=True)   # the other encoders then have no gradient, and Adam skips them
    loss.backward()
    firing = codes.detach() > 0
    for dictionary in across.per_model:
        remove_parallel_gradient(dictionary.W_dec)
    optimizer.step()
    with torch.no_grad():
        for dictionary in across.per_model:
            dictionary.W_dec /= dictionary.W_dec.norm(dim=-1, keepdim=True)
        encoder.observe(codes.detach())
        numbers.since_fired += len(pre)
        numbers.since_fired.masked_fill_(firing.any(0), 0)
        spread = sum((target - target.mean(0)).square().sum() for target in normalised)
        squared_errors = sum(error.square().sum() for error in errors)
        sums = (squared_errors, spread, firing.sum(), pre.new_full((), len(pre)))
        not_finite = sum((~x.isfinite()).sum() for x in rows)
        numbers.add(torch.stack([value.double() for value in sums]), loss.detach().double(), not_finite.double(),
                    step=step, tokens=len(pre))


def _initialised(settings: dict, widths: list[int]) -> Across:
    """The across dictionary of `settings` for models of these widths: random unit decoder rows drawn model
    after model from one generator seeded by the seed, each encoder its decoder's transpose, zero biases."""
    cls = kind_named(settings["kind"])
    n = settings["n_concepts"] or settings["expansion"] * max(widths)
    kind_settings = {key: settings[key] for key in ("k", "threshold_rate") if key in settings}
    generator = torch.Generator().manual_seed(settings["seed"])
    dictionaries = []
    for d, origin in zip(widths, settings["origins"]):
        dictionary = cls(d, n, origin=Origin.from_dict(origin), **kind_settings)
        rows = torch.randn(n, d, generator=generator)
        with torch.no_grad():
            dictionary.W_dec.copy_(rows / rows.norm(dim=-1, keepdim=True))
            dictionary.W_enc.copy_(dictionary.W_dec.T)
        dictionaries.append(dictionary)
    return Across(dictionaries)


def _per_model(value, what: str, models: list[str]) -> list:
    """One value per model: `value` itself for each (a single value or None), or its items, one per model."""
    if value is None or isinstance(value, (str, int)):
        return [value] * len(models)
    values = list(value)
    if len(values) != len(models):
        raise ConceptsError(f"{len(values)} {what} for {len(models)} models: give one for all, or one per model in "
                            f"the order of `models`.")
    return values
