"""One dictionary across models (Thasarathan et al. 2025, "Universal Sparse Autoencoders: Interpretable
Cross-Model Concept Alignment"): one code space, so that concept i means the same thing in every model.

    across = train_across([vit_tokens, cvt_tokens], models=["vit-cifar10", "cvt-cifar10"], blocks=[-1, -1],
                          tokens=["patch", "patch"], kind="topk", k=32, expansion=8)
    codes = across.encode(vit_tokens, "vit-cifar10")        # ViT's raw tokens -> the shared codes
    as_cvt = across.decode(codes, "cvt-cifar10")            # -> CvT's raw activation space
    across_metrics(across, [vit_held_out, cvt_held_out])    # R² matrix, firing entropy, shared concepts
    save_across(across, "dictionaries/vit+cvt"); read(Path("dictionaries/vit+cvt"))

The dictionary. M models read the same places: row r of every model's activations x^m (t d_m) is the same
cell of the same image (the caller has resampled the models' grids onto common cells). Each model has an
ordinary `Dictionary` of one kind (TopK or BatchTopK) with the same n concepts, its own normalisation
(fitted on its own tokens, `Normalisation.fit`) and its own weights, and all share the codes:

    x̃^m  = (x^m - offset_m) / scale_m                        model m's normalisation
    z    = σ_m((x̃^m - b_dec^m) W_enc^m + b_enc^m)            n codes, the space every model shares
    x̂^j  = (z W_dec^j + b_dec^j) · scale_j + offset_j        model j's reconstruction of the same place

so the codes of model m's tokens decode into any model j, and row i of W_dec^j is concept i's direction in j.

The loss. A step takes one batch of t aligned rows and one model m, encodes m's tokens and reconstructs
every model's from those codes z^m:

    L_m = Σ_j (1 / (t d_j)) Σ_t ‖x̃^j_t - (z^m_t W_dec^j + b_dec^j)‖²   +   auxk_alpha · AuxK_m

Each term is model j's mean squared error in its normalised space, where the entries have variance 1 on
average, so each is about the FVU of j's reconstruction and no model outweighs another by its width or
scale (Thasarathan et al. sum the models' losses). AuxK_m is Gao et al.'s (`train.py`, `auxk`) on model
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
     `seed`; each encoder is its decoder's transpose, the biases 0 (as `train.py`).
  3. Step s takes the next batch of rows (the same rows of every model: a tensor's rows are shuffled each
     epoch by one permutation from (seed, epoch), `train.py`'s) and the model m = s mod M, round robin, so
     each encoder trains on every M-th batch and a run is repeatable.
  4. L_m, backward; the gradient along each decoder row removed in every model (`remove_parallel_gradient`);
     one Adam step over all the parameters (the other encoders got no gradient: Adam leaves them and their
     moments as they are); every decoder's rows scaled back to unit norm; m's BatchTopK threshold moves
     towards the smallest code kept (`observe`), so each model's threshold is learned from its own codes.
  5. Dead concepts: one counter per concept, of the tokens encoded (of any model) since it last fired.
     A concept of one model's alone fires on that model's steps and stays alive; counters per model
     would call it dead in the others, and AuxK would push it into them.

Adam at `lr`, warmed up linearly over `warmup` steps, as `train.py`. The progress bar shows the epoch's
running FVU, pooled over every model's reconstruction (Σ_j squared errors / Σ_j spreads, normalised
space), and L0 of the encoded tokens. Checkpoints as `train.py`'s: the whole state written atomically
every `checkpoint_every` steps and after each epoch, read with `torch.load(weights_only=True)`, refused
when its settings differ, a resumed run equal to one never interrupted.

Metrics (`across_metrics`), over T aligned rows:

    R²[i, j]  = 1 - FVU(x^j, decode_j(encode_i(x^i)))     FVU as `metrics.py`: Σ_t ‖x - x̂‖² / Σ_t ‖x - x̄‖²,
                                                           x̄ model j's per-dimension mean, float64
    f[m, c]   = (1/T) #{t : z^m_tc > 0}                    the share of model m's tokens concept c fires on
    p[m, c]   = f[m, c] / Σ_m' f[m', c]                    where concept c fires over all models
    H[c]      = -Σ_m p[m, c] log p[m, c] / log M           (0 log 0 = 0); NaN for a concept that fires on no
                                                           model's tokens (it has no share to spread)
    co[c]     = mean over the model pairs (a, b) of         its co-firing: for each pair of models, of the rows
                #{t : z^a_tc > 0 and z^b_tc > 0}           where it fires in either, the share where it fires
              / #{t : z^a_tc > 0 or z^b_tc > 0}            in both (their Jaccard index); NaN: fires nowhere
    shared    = #{c : H[c] >= SHARED_FROM and co[c] >= COFIRING_FROM} / n
    specific_m = #{c : H[c] <= SPECIFIC_TO and m = argmax_m' p[m', c]} / n

with L0 and the dead share of each model's codes as `metrics.py` defines them. The shares are of all n
concepts: shared + Σ_m specific_m + the in-between (paired concepts among them) + `unused` (firing on no
model) = 1. The thresholds, for two models: H >= 0.9 when the less-used model has at least 32 % of the
firing (H(0.32, 0.68) = 0.904), and H <= 0.3 when one model has at least 95 % of it (H(0.05, 0.95) =
0.286); for four models, a concept used by one model 90 % of the time and by the other three equally has
H = 0.31. Co-firing >= 0.25: a shared concept's encoders agree on where it is at least a quarter of the
time (on the planted pair of the tests they agree 0.6-0.9 of the time; a paired concept's, whose two
firings are independent, 0-0.1: about the product of its two firing rates over their sum). Averaged over
pairs, so that with four models a concept three of them share at the same places still counts (the share
of rows where all M fire at once falls fast with M: under 0.19 for every concept of the bundled four-way
dictionary); for two models it is that share.

Files (`save_across`, `read`). A folder holding one vitviz dictionary file per model (`own.py`, named
from its position and model: '0-vit-cifar10.safetensors', '1-facebook--dinov2-base.safetensors') and
the manifest `across.json`:

    {"format": "vitviz-concepts-across", "version": 1, "kind": ..., "n_concepts": n,
     "models": [{"model": name, "file": file name, "sha256": SHA-256 of the file's bytes}, ...],
     "training": how it was trained}

written file by file through temporary files renamed into place, the manifest last (and an older
manifest removed first): a folder without a manifest is not an across dictionary, and a file swapped
for another (even a sound dictionary of the same model) is refused by its SHA-256.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..export import safe_name, write_atomic
from . import own
from .batches import Activations, batches, is_one_pass, token_count
from .batchtopk import THRESHOLD_RATE
from .dictionary import ConceptsError, Dictionary, Origin
from .kinds import kind_named
from .train import (
    AUXK_ALPHA,
    BATCH_SIZE,
    DEAD_AFTER,
    FIT_TOKENS,
    K_AUX,
    WARMUP,
    K,
    Schedule,
    TrainingProgress,
    auxk,
    check_schedule,
    epoch_order,
    fit_warning,
    head_of,
    read_checkpoint,
    remove_parallel_gradient,
    run_schedule,
    write_checkpoint,
)

EXPANSION = 8        # concepts per dimension of the widest model
KINDS = ("topk", "batchtopk")   # the kinds an across dictionary trains: sparse by their activation, no penalty
SHARED_FROM = 0.9    # firing entropy from which a concept is shared by the models (module docstring)
SPECIFIC_TO = 0.3    # firing entropy up to which a concept is its most-firing model's own
COFIRING_FROM = 0.25   # co-firing from which a concept of high firing entropy is shared (not paired)
FORMAT, VERSION = "vitviz-concepts-across", 1
MANIFEST = "across.json"


class Across(nn.Module):
    """One dictionary across models: an ordinary `Dictionary` per model, all of one kind and n concepts,
    sharing one code space (concept i means the same thing in every model). Each one's `origin` names its
    model, which must differ from the others'; `models` keeps their order."""

    def __init__(self, dictionaries: Sequence[Dictionary]):
        super().__init__()
        names = [dictionary.origin.model for dictionary in dictionaries]
        _refuse_model_names(names)
        first = dictionaries[0]
        for name, dictionary in zip(names[1:], dictionaries[1:]):
            if dictionary.kind != first.kind:
                raise ConceptsError(f"The dictionaries are of different kinds: {names[0]}'s is {first.kind}, "
                                    f"{name}'s {dictionary.kind}; an across dictionary has one kind.")
            if dictionary.n_concepts != first.n_concepts:
                raise ConceptsError(f"The models' dictionaries have different numbers of concepts: {names[0]}'s "
                                    f"has {first.n_concepts}, {name}'s {dictionary.n_concepts}; an across "
                                    f"dictionary's models share one code space.")
        self.per_model = nn.ModuleList(dictionaries)
        self.training_record: dict | None = None   # how it was trained (`train_across` fills it; files keep it)

    @property
    def models(self) -> tuple[str, ...]:
        """The models' names, in order."""
        return tuple(dictionary.origin.model for dictionary in self.per_model)

    @property
    def dictionaries(self) -> dict[str, Dictionary]:
        """Each model's dictionary, by name, in model order."""
        return dict(zip(self.models, self.per_model))

    @property
    def n_concepts(self) -> int:
        """The size of the shared code space."""
        return self.per_model[0].n_concepts

    @property
    def kind(self) -> str:
        return self.per_model[0].kind

    @property
    def d(self) -> tuple[int, ...]:
        """Each model's activation width, in model order (a `Dictionary`'s d, one per model)."""
        return tuple(dictionary.d for dictionary in self.per_model)

    def dictionary(self, model: str) -> Dictionary:
        """The dictionary of `model`, or a ConceptsError naming the models there are."""
        if model not in self.models:
            raise ConceptsError(f"This dictionary across models has no {model!r}; its models are "
                                f"{', '.join(self.models)}.")
        return self.per_model[self.models.index(model)]

    def encode(self, x: Tensor, model: str) -> Tensor:
        """`model`'s raw activations (..., d_model) -> the shared non-negative codes (..., n)."""
        return self.dictionary(model).encode(x)

    def decode(self, codes: Tensor, model: str) -> Tensor:
        """Shared codes (..., n) -> `model`'s raw activation space (..., d_model)."""
        return self.dictionary(model).decode(codes)


def _refuse_model_names(names: Sequence[str | None]) -> None:
    """A ConceptsError unless `names` name two models or more, each once."""
    if len(names) < 2:
        raise ConceptsError(f"A dictionary across models needs two models or more; {len(names)} given.")
    if None in names:
        raise ConceptsError(f"The dictionary at position {list(names).index(None)} does not record its model; each "
                            f"dictionary of an across dictionary is named by its model.")
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConceptsError(f"{twice} is named twice; an across dictionary holds one dictionary per model.")


# ---- training ----------------------------------------------------------------------------------------------

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
    _refuse_model_names(models)
    if kind not in KINDS:
        kind_named(kind)   # a kind that does not exist is refused by its own words
        raise ConceptsError(f"A dictionary across models is of kind {' or '.join(KINDS)}; a {kind} dictionary is "
                            f"made sparse by a penalty the shared codes do not have.")
    _refuse_unlike_models(activations, models)
    if n_concepts is not None and expansion is not None:
        raise ConceptsError(f"Give n_concepts ({n_concepts}) or expansion ({expansion}), not both: expansion "
                            f"is the number of concepts per dimension of the widest model.")
    if n_concepts is not None and (not isinstance(n_concepts, int) or n_concepts < 1):
        raise ConceptsError(f"n_concepts must be a whole number of at least 1, not {n_concepts!r}.")
    check_schedule(activations, expansion=expansion, epochs=epochs, steps=steps, batch_size=batch_size,
                   checkpoint_every=checkpoint_every, warmup=warmup)
    count = _aligned_count(activations, models)
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
        position = {"epoch": 0, "batch": 0, "step": 0, "tokens": 0}
        running = torch.zeros(4, dtype=torch.float64, device=device)   # see TrainingProgress
        since_fired = torch.zeros(across.n_concepts, dtype=torch.int64, device=device)
    else:
        across = _initialised(settings, list(state["d"])).to(device)
        across.load_state_dict(state["dictionary"])
        position, running, since_fired = dict(state["position"]), state["running"], state["since_fired"].to(device)
    across.train()
    optimizer = torch.optim.Adam(across.parameters(), lr=lr)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    numbers = TrainingProgress(running.to(device), since_fired, settings["dead_after"])
    schedule = Schedule(epochs=None if steps is not None else epochs, steps=steps, warmup=warmup, lr=lr)

    def epoch_batches(epoch: int) -> Iterator[tuple[Tensor, ...]]:
        streams = first_epoch if epoch == 0 and first_epoch is not None else \
            [epoch_order(model_activations, epoch, batch_size, seed) for model_activations in activations]
        return _aligned(streams, models)

    def train_step(rows: tuple[Tensor, ...], step: int) -> int:
        _step(across, optimizer, [x.to(device) for x in rows], step % len(models), numbers, settings, step)
        return len(rows[0])

    def save(last_epoch: dict | None) -> None:
        write_checkpoint(checkpoint, across, optimizer, settings, position, numbers.running, since_fired,
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


def _refuse_unlike_models(activations, models: Sequence[str]) -> None:
    """A ConceptsError unless `activations` is a list (or tuple) of one model's activations per model."""
    if not isinstance(activations, (list, tuple)) or len(activations) != len(models):
        given = f"{len(activations)} sets of activations" if isinstance(activations, (list, tuple)) else \
            f"a {type(activations).__name__}"
        raise ConceptsError(f"A dictionary across models reads one set of activations per model, in a list in the "
                            f"order of its models ({', '.join(models)}); {given} given.")


def _aligned_count(activations: Sequence[Activations], models: Sequence[str]) -> int | None:
    """The number of rows each model's activations hold where that is known without reading them; refused
    when the models' counts differ."""
    counts = [token_count(model_activations) for model_activations in activations]
    known = {model: count for model, count in zip(models, counts) if count is not None}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{model} {count}" for model, count in known.items())
        raise ConceptsError(f"The activations are not aligned: the models hold different numbers of tokens "
                            f"({listed}). Row r of every model's activations must be the same place of the same "
                            f"image: resample the models' grids onto common cells first.")
    return counts[0] if None not in counts else None


def _aligned(streams: Sequence[Iterator[Tensor]], models: Sequence[str]) -> Iterator[tuple[Tensor, ...]]:
    """The models' batches side by side, refused where they stop holding the same number of rows."""
    seen = 0
    for rows in itertools.zip_longest(*streams):
        lengths = [None if x is None else len(x) for x in rows]
        if len(set(lengths)) > 1:
            listed = ", ".join(f"{model} {'none' if length is None else length}" for model, length in
                               zip(models, lengths))
            raise ConceptsError(f"The activations are not aligned: after {seen} tokens, the next batch holds "
                                f"different numbers of tokens ({listed}). Row r of every model's activations must "
                                f"be the same place of the same image: resample the models' grids onto common "
                                f"cells first.")
        seen += lengths[0]
        yield rows


# ---- metrics -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AcrossMetrics:
    """`across_metrics`' numbers, each defined in the module docstring."""
    models: tuple[str, ...]
    r2: Tensor                          # M M float64: entry i, j = 1 - FVU of model j's tokens from model i's codes
    firing: Tensor                      # M n float64: the share of model m's tokens each concept fires on
    entropy: Tensor                     # n float64: each concept's firing entropy over the models; NaN: fires on none
    cofiring: Tensor                    # n float64: per model pair, of the rows where it fires in either, the share
                                        # where it fires in both, averaged over the pairs; NaN: fires nowhere
    shared_concepts: Tensor             # the shared concepts (int64 indices): high entropy and co-firing
    specific_concepts: dict[str, Tensor]   # each model's own concepts: entropy <= specific_to, firing most on it
    shared_from: float
    specific_to: float
    cofiring_from: float
    tokens: int                         # how many aligned rows were evaluated

    @property
    def fvu(self) -> Tensor:
        """The matrix of FVUs, 1 - R²."""
        return 1 - self.r2

    @property
    def shared(self) -> float:
        """The share of the n concepts the models share."""
        return len(self.shared_concepts) / self.firing.shape[1]

    @property
    def specific(self) -> dict[str, float]:
        """Each model's share of the n concepts that are its own."""
        return {model: len(own_concepts) / self.firing.shape[1] for model, own_concepts in
                self.specific_concepts.items()}

    @property
    def unused(self) -> float:
        """The share of the concepts that fire on no model's tokens (their entropy is NaN)."""
        return (self.firing.sum(0) == 0).double().mean().item()

    @property
    def l0(self) -> dict[str, float]:
        """Each model's concepts firing per token, on average (Σ_c f[m, c])."""
        return {model: firing.sum().item() for model, firing in zip(self.models, self.firing)}

    @property
    def dead(self) -> dict[str, float]:
        """Each model's share of the concepts that never fire on its tokens."""
        return {model: (firing == 0).double().mean().item() for model, firing in zip(self.models, self.firing)}

    def to_dict(self) -> dict:
        """The numbers, for a log line or a model card."""
        return {"models": list(self.models), "r2": self.r2.tolist(), "shared": self.shared,
                "shared_concepts": self.shared_concepts.tolist(),
                "specific_concepts": {model: ids.tolist() for model, ids in self.specific_concepts.items()},
                "specific": self.specific, "unused": self.unused, "l0": self.l0, "dead": self.dead,
                "shared_from": self.shared_from, "specific_to": self.specific_to, "cofiring_from": self.cofiring_from,
                "tokens": self.tokens}


@torch.no_grad()
def across_metrics(across: Across, activations: Sequence[Activations], *, batch_size: int = 4096,
                   shared_from: float = SHARED_FROM, specific_to: float = SPECIFIC_TO,
                   cofiring_from: float = COFIRING_FROM) -> AcrossMetrics:
    """The R² matrix, each concept's firing entropy over the models and its co-firing, the shares of shared
    and model-specific concepts, and each model's L0 and dead share, of `across` over aligned `activations`
    (raw, one per model in `across.models`' order: tensors or iterables of batches), streamed in batches of
    `batch_size` rows; the module docstring defines each. Refused when a model's tokens do not vary (its
    FVU's denominator is 0) or the models' rows differ in number."""
    models = across.models
    _refuse_unlike_models(activations, models)
    _aligned_count(activations, models)
    device = across.per_model[0].W_enc.device
    spreads = [_Spread() for _ in models]
    errors = torch.zeros(len(models), len(models), dtype=torch.float64)
    fires = torch.zeros(len(models), across.n_concepts, dtype=torch.int64, device=device)
    pairs = math.comb(len(models), 2)
    fires_in_both = torch.zeros(pairs, across.n_concepts, dtype=torch.int64, device=device)
    fires_in_either = torch.zeros_like(fires_in_both)
    streams = [batches(model_activations, batch_size) for model_activations in activations]
    for rows in _aligned(streams, models):
        rows = [x.to(device) for x in rows]
        for dictionary, spread, x in zip(across.per_model, spreads, rows):
            dictionary.check_width(x.shape[1])
            spread.add(x)
        firings = []
        for i, (encoder, x) in enumerate(zip(across.per_model, rows)):
            codes = encoder.encode(x)
            firings.append(codes > 0)
            fires[i] += firings[-1].sum(0)
            for j, (decoder, target) in enumerate(zip(across.per_model, rows)):
                errors[i, j] += (target.double() - decoder.decode(codes).double()).square().sum().item()
        for pair, (a, b) in enumerate(itertools.combinations(firings, 2)):
            fires_in_both[pair] += (a & b).sum(0)
            fires_in_either[pair] += (a | b).sum(0)
    spread = torch.tensor([spread.total() for spread in spreads], dtype=torch.float64)
    for model, value in zip(models, spread):
        if not value > 0:
            raise ConceptsError(f"The {spreads[0].tokens} tokens of {model} evaluated are all the same vector, so "
                                f"no fraction of their variance can be explained.")
    tokens = spreads[0].tokens
    firing = fires.double().cpu() / tokens
    entropy = firing_entropy(firing)
    owner = firing.argmax(0)
    specific = {model: ((entropy <= specific_to) & (owner == m)).nonzero().flatten() for m, model in
                enumerate(models)}
    either = fires_in_either.double().cpu()
    cofiring = (fires_in_both.double().cpu() / either.clamp(min=1)).mean(0)
    cofiring[(either == 0).all(0)] = math.nan   # a concept that never fires
    shared = ((entropy >= shared_from) & (cofiring >= cofiring_from)).nonzero().flatten()
    return AcrossMetrics(models=models, r2=1 - errors / spread, firing=firing, entropy=entropy, cofiring=cofiring,
                         shared_concepts=shared, specific_concepts=specific, shared_from=shared_from,
                         specific_to=specific_to, cofiring_from=cofiring_from, tokens=tokens)


def firing_entropy(firing: Tensor) -> Tensor:
    """Each concept's firing entropy over the M models, from `firing` (M n, the share of each model's tokens a
    concept fires on): H(p) / log M with p the firing normalised over the models; NaN where it fires on none."""
    total = firing.sum(0)
    p = firing / total
    entropy = torch.where(p > 0, -p * p.log(), 0.0).sum(0) / math.log(len(firing))
    return entropy.masked_fill(total == 0, math.nan)


class _Spread:
    """Σ_t ‖x_t - x̄‖² over streamed batches, in float64 about the first batch's mean (`metrics.py`'s formula:
    Σ ‖x - c‖² - T ‖x̄ - c‖²), so that a large common offset does not cancel a small variance's digits."""

    def __init__(self):
        self.tokens, self.shift, self.squares, self.offset = 0, None, 0.0, None

    def add(self, x: Tensor) -> None:
        x = x.double()
        if self.shift is None:
            self.shift, self.offset = x.mean(0), torch.zeros_like(x[0])
        centred = x - self.shift
        self.squares += centred.square().sum().item()
        self.offset += centred.sum(0)
        self.tokens += len(x)

    def total(self) -> float:
        return self.squares - self.offset.square().sum().item() / self.tokens


# ---- files -------------------------------------------------------------------------------------------------

def file_name(position: int, model: str) -> str:
    """The file of the dictionary of `model`, at `position` among the models: '1-facebook--dinov2-base.safetensors'
    (the position keeps names apart that `safe_name` makes equal)."""
    return f"{position}-{safe_name(model)}.safetensors"


def save_across(across: Across, folder: str | Path) -> Path:
    """`across` written into `folder` (made if need be): one vitviz dictionary file per model and the manifest
    `across.json`, each atomically, the manifest last; -> the folder. Refused, with nothing written, if a
    weight is NaN or infinite."""
    folder = Path(folder)
    for model, dictionary in across.dictionaries.items():
        own.refuse_non_finite(dictionary.state_dict(), f"The dictionary of {model} to be saved in {folder}")
    (folder / MANIFEST).unlink(missing_ok=True)   # until the new manifest is in, the folder is no across dictionary
    entries = []
    for position, (model, dictionary) in enumerate(across.dictionaries.items()):
        path = own.save(dictionary, folder / file_name(position, model))
        entries.append({"model": model, "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    manifest = {"format": FORMAT, "version": VERSION, "kind": across.kind, "n_concepts": across.n_concepts,
                "models": entries, "training": across.training_record}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    return folder


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's files from a Hub repo (`get(name, optional=)` downloads one): the manifest, then each
    model's file it names -> their local folder, or None where the repo has no manifest. `weights` names none."""
    manifest = get(MANIFEST, optional=True)
    if manifest is None:
        return None
    for entry in _manifest(manifest)["models"]:
        get(entry["file"])
    return manifest.parent


def matches(path: Path) -> bool:
    """Whether `path` is an across dictionary: a folder holding across.json, or that manifest itself."""
    return path.is_dir() and (path / MANIFEST).is_file() or path.is_file() and path.name == MANIFEST


def read(path: Path) -> Across:
    """An across dictionary's folder (or its manifest) -> the `Across`, in eval mode on the CPU, or a
    ConceptsError that says what is wrong with the folder."""
    folder = path if path.is_dir() else path.parent
    manifest = _manifest(folder / MANIFEST)
    dictionaries = []
    for entry in manifest["models"]:
        file = folder / entry["file"]
        if not file.is_file():
            raise ConceptsError(f"{folder} is missing {entry['file']}, the dictionary of {entry['model']}: copy the "
                                f"whole folder again.")
        if hashlib.sha256(file.read_bytes()).hexdigest() != entry["sha256"]:
            raise ConceptsError(f"{file} is not the file this across dictionary was saved with (its SHA-256 differs "
                                f"from the one in {MANIFEST}): it was changed or replaced; copy the whole folder "
                                f"again.")
        dictionary = own.read(file)
        if dictionary.origin.model != entry["model"]:
            raise ConceptsError(f"{folder} is inconsistent: {MANIFEST} says {entry['file']} is the dictionary of "
                                f"{entry['model']}, and the file says it is {dictionary.origin.describe()}.")
        if dictionary.kind != manifest["kind"]:
            raise ConceptsError(f"{folder} is inconsistent: {entry['file']} is a {dictionary.kind} dictionary, and "
                                f"{MANIFEST} says the models' are {manifest['kind']}.")
        if dictionary.n_concepts != manifest["n_concepts"]:
            raise ConceptsError(f"{folder} is inconsistent: {entry['file']} has {dictionary.n_concepts} concepts, "
                                f"and {MANIFEST} says the models share {manifest['n_concepts']}.")
        dictionaries.append(dictionary)
    try:
        across = Across(dictionaries)
    except ConceptsError as e:
        raise ConceptsError(f"{folder}: {e}") from None
    across.training_record = manifest.get("training")
    return across.eval()


def _manifest(path: Path) -> dict:
    """The manifest at `path`, checked for its format, version and the fields `read` uses."""
    try:
        manifest = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConceptsError(f"{path} is damaged: it is not valid JSON ({e}).") from None
    own.checked_format(manifest, path, format=FORMAT, version=VERSION, what="dictionary")
    entries, n = manifest.get("models"), manifest.get("n_concepts")
    if not isinstance(n, int) or not isinstance(manifest.get("kind"), str) or not isinstance(entries, list) or not all(
            isinstance(entry, dict) and all(isinstance(entry.get(key), str) for key in ("model", "file", "sha256"))
            for entry in entries):
        raise ConceptsError(f"{path} is incomplete: it needs kind, n_concepts and, for each model, its model, file and "
                            f"sha256.")
    for entry in entries:
        if Path(entry["file"]).name != entry["file"] or entry["file"].startswith("."):
            raise ConceptsError(f"{path} names {entry['file']!r} as a file of the dictionary; its files are in its "
                                f"own folder, by plain names.")
    return manifest
