"""What a feature picture maximises: a target, read from the trace of the crops a model is shown.

    Concept(dictionary, concept)    a dictionary's concept: its encoder's pre-activation on the block's grid tokens
    Unit(block, unit)               an MLP's hidden unit, its first layer through the activation (Ghiasi et al. 2022)
    Channel(block, channel)         a channel of a block's output tokens (a CNN's feature map channel)
    Label(label)                    a class logit, by index or name

A concept, unit or channel is averaged over the block's grid tokens (class and register tokens left out), or read
at one of them (`position`, row-major on the grid). Every family's trace gives them (`BlockTrace.tokens`, and
`BlockTrace.hidden` from `trace(units=True)`); a ResNet has no MLP, so a unit there is refused and its channels
are named instead.

Why the pre-activation. A dictionary's code z_c = σ(pre_c) is 0 wherever concept c is not among a token's k
largest (TopK) or below zero (ReLU), and has no gradient there: from a random image most concepts would never
move. The objective is therefore the encoder's linear response, pre_c = (x̃ - b_dec) W_enc[:, c] + b_enc[c] on the
normalised tokens x̃, which the code follows wherever it is not 0 (`Dictionary.pre_activations`).

A dictionary across models (`concepts.Across`) reads the cells its models share: each model's grid tokens are
resampled onto the cells over the picture it is shown (`concepts.activations.align`, the crop standing for the
photo), then encoded by that model's dictionary. Drawn in several models at once (Thasarathan et al. 2025's
coordinated activation maximisation), each model's objective is divided by that concept's typical activation in
the model (`typical`): the mean of its top exemplar values there (the largest code over an image's cells, on the
images of the exemplar index beside the dictionary), so that every model counts alike whatever its scale; where a
concept never fired in a model, the median over the model's concepts that did; 1 where there is no index.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from ..concepts import Across, ConceptsError, Dictionary, load as load_dictionary
from ..concepts.activations.align import align, token_rectangles
from ..concepts.activations.cache import block_index, block_tokens, default_tokens
from ..concepts.analysis.exemplars import index_in
from ..concepts.analysis.photo import cells_of, model_names
from ..concepts.files.own import checksum
from ..concepts.kinds.dictionary import block_words
from ..models.trace import Trace


class LooksError(ValueError):
    """A target or setting a picture cannot be drawn for, said in words a person can act on."""


@dataclass(frozen=True)
class Concept:
    """Concept `concept` of a dictionary (a bundled name, a folder, or a loaded `Dictionary` / `Across`)."""
    dictionary: str | Path | Dictionary | Across
    concept: int
    position: int | None = None   # a grid token (a cell, across models), row-major; None: the mean over the grid


@dataclass(frozen=True)
class Unit:
    """Hidden unit `unit` of block `block`'s MLP (negative blocks count from the last)."""
    block: int
    unit: int
    position: int | None = None


@dataclass(frozen=True)
class Channel:
    """Channel `channel` of block `block`'s output tokens (negative blocks count from the last)."""
    block: int
    channel: int
    position: int | None = None


@dataclass(frozen=True)
class Label:
    """A class logit: its index, or its name among the model's labels."""
    label: int | str
    position: None = None   # a logit has no place on the grid


Target = Concept | Unit | Channel | Label


def _number(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise LooksError(f"{what} must be a whole number, not {value!r}.")
    return value


def _checked(value, count: int, what: str, where: str) -> int:
    if not 0 <= _number(value, f"The {what}") < count:
        raise LooksError(f"{where} has {count} {what}s (0 to {count - 1}): there is no {what} {value}.")
    return value


@dataclass
class Group:
    """Targets one reading of the trace serves: `tokens` ((B K) n c, what they read at each grid token), `project`
    (their images' b K n c tokens and ids -> b K n values; None: channel `id` itself), and per target its image
    (row of the batch), id and weights over the n tokens (the mean, or one position)."""
    tokens: Callable[[Trace], Tensor]
    project: Callable[[Tensor, Tensor], Tensor] | None
    n: int
    images: list[int]
    ids: list[int]
    weights: list[Tensor]


class Readout:
    """The targets of a batch of B images in one model, `readout(trace of the B K crops, K) -> B K` values. `units`:
    whether the trace must keep the MLPs' hidden units; `typical` (B): each target's typical activation in the model
    (`typical_activation`; 1 unless asked for with `normalised`); `blocks` (B): the block each target reads (a
    class: the last), where the variants' diversity term reads their style (`draw.diversity`). Every target is
    checked against the model here, once, and refused in words."""

    def __init__(self, loaded, targets: Sequence[Target], *, dictionaries: dict | None = None,
                 normalised: bool = False):
        self.loaded, self.units = loaded, any(isinstance(t, Unit) for t in targets)
        self.dictionaries = {} if dictionaries is None else dictionaries   # loaded once per source, shared
        with torch.inference_mode():
            probe = loaded.model.trace(torch.zeros(1, 3, *loaded.transform.crop, device=loaded.device),
                                       attention=False, units=self.units)
        self.groups: dict[tuple, Group] = {}
        self.blocks: list[int] = []
        for image, target in enumerate(targets):
            key, tokens, project, n, value = self._resolve(probe, target)
            self.blocks.append(len(probe.blocks) - 1 if key[0] == "class" else key[1])   # (kind, block, ...)
            group = self.groups.setdefault(key, Group(tokens, project, n, [], [], []))
            group.images.append(image)
            group.ids.append(value)
            weights = torch.full((n,), 1 / n)
            if target.position is not None:
                if not 0 <= _number(target.position, "The position") < n:
                    raise LooksError(f"{loaded.name} reads this target on a grid of {n} cells (0 to {n - 1}, row by "
                                     f"row): there is no position {target.position}.")
                weights = torch.nn.functional.one_hot(torch.tensor(target.position), n).float()
            group.weights.append(weights)
        self.indices = {key: (torch.tensor(g.images, device=loaded.device), torch.tensor(g.ids, device=loaded.device),
                              torch.stack(g.weights).to(loaded.device)) for key, g in self.groups.items()}
        self.typical = torch.tensor([self.typical_activation(t) if normalised else 1.0 for t in targets],
                                    device=loaded.device)

    def __call__(self, trace: Trace, copies: int) -> Tensor:
        """B K: each image's target at each of its K copies."""
        out = None
        for key, group in self.groups.items():
            images, ids, weights = self.indices[key]
            tokens = rearrange(group.tokens(trace).float(), '(b k) n c -> b k n c', k=copies)[images]
            if group.project is None:
                per_token = tokens[torch.arange(len(ids), device=ids.device), :, :, ids]   # b K n
            else:
                per_token = group.project(tokens, ids)
            values = torch.einsum('bkn,bn->bk', per_token, weights)
            if out is None:
                out = values.new_zeros(trace.logits.shape[0] // copies, copies)
            out = out.index_copy(0, images, values)
        return out

    def _resolve(self, probe: Trace, target: Target):
        """-> (its group's key, the group's tokens and projection, the grid's size, the target's id), or a
        LooksError."""
        loaded = self.loaded
        if isinstance(target, Label):
            if target.position is not None:
                raise LooksError("A class logit has no place on the grid: draw it without a position.")
            if not loaded.has_classifier:
                raise LooksError(f"{loaded.name} has no classifier, so there is no class logit to draw.")
            label = target.label
            if isinstance(label, str):
                if label not in loaded.labels:
                    raise LooksError(f"{loaded.name} has no class {label!r}; its classes are "
                                     f"{', '.join(loaded.labels)}.")
                label = loaded.labels.index(label)
            return ("class",), lambda t: t.logits[:, None, :], None, 1, \
                _checked(label, len(loaded.labels), "class", loaded.name)
        if isinstance(target, Concept):
            return self._concept(probe, target)
        if not isinstance(target, (Unit, Channel)):
            raise LooksError(f"{target!r} is no target: draw a Concept, Unit, Channel or Label.")
        try:
            index = block_index(probe, _number(target.block, "The block"))
        except ConceptsError as e:
            raise LooksError(f"{loaded.name}: {e}") from None
        block = probe.blocks[index]
        prefix, n = block.prefix, block.query_grid[0] * block.query_grid[1]
        if isinstance(target, Unit):
            if block.hidden is None:
                raise LooksError(f"{loaded.name}'s blocks have no MLP, so there are no hidden units to draw: draw a "
                                 f"block's channels instead (a Channel, --channel BLOCK:CHANNEL).")
            unit = _checked(target.unit, block.hidden.shape[-1], "unit",
                            f"{block_words(index).capitalize()}'s MLP in {loaded.name}")
            return ("unit", index), lambda t: t.blocks[index].hidden[:, prefix:], None, n, unit
        channel = _checked(target.channel, block.tokens.shape[-1], "channel",
                           f"{block_words(index).capitalize()} of {loaded.name}")
        return ("channel", index), lambda t: t.blocks[index].tokens[:, prefix:], None, n, channel

    def _concept(self, probe: Trace, target: Concept):
        dictionary, cells = self.dictionary(target)
        concept = _checked(target.concept, dictionary.n_concepts, "concept", f"The dictionary {target.dictionary}")
        if dictionary.block is None:
            raise LooksError(f"The dictionary {target.dictionary} does not record which block it was trained on, so "
                             f"it cannot be read from {self.loaded.name}.")
        index = block_index(probe, dictionary.block)
        kind = default_tokens(probe.blocks[index])
        dictionary.check_width(probe.blocks[index].tokens.shape[-1])
        grid = probe.blocks[index].query_grid
        resample = None
        if cells is not None:   # the crop stands for the photo: the cells tile the model's whole input
            h, w = cells
            size = torch.tensor(probe.input_size * 2, dtype=torch.float64)
            tiles = torch.tensor([[i / h, j / w, (i + 1) / h, (j + 1) / w] for i in range(h) for j in range(w)],
                                 dtype=torch.float64)
            alignment = align([token_rectangles(probe, index) / size, tiles])
            resample, grid = alignment.weights[0].to(self.loaded.device), alignment.grid

        def tokens(trace: Trace) -> Tensor:   # (B K) n d: the normalised grid tokens (or cells)
            x = block_tokens(trace, index, kind).float()
            return dictionary.normalisation(x if resample is None else torch.einsum('ct,btd->bcd', resample, x))

        def project(x: Tensor, ids: Tensor) -> Tensor:   # pre = x̃ W_enc + (b_enc - b_dec W_enc), at the ids
            bias = dictionary.b_enc - dictionary.b_dec @ dictionary.W_enc
            return torch.einsum('bknd,db->bkn', x, dictionary.W_enc[:, ids]) + bias[ids][:, None, None]
        return ("concept", index, id(dictionary)), tokens, project, grid[0] * grid[1], concept

    def start(self, target: Target, models: Sequence[str]) -> str:
        """What seeds the randomness of `target`'s picture drawn in `models` (`images.Randomness`, with the seed). A
        concept: its number and its dictionary's weights (their SHA-256: the dictionary, and so its model and block,
        whatever path or name it was given by), so concept i of two dictionaries starts apart, and a dictionary across
        models' concept starts alike in each of its models and in all at once. A unit, channel or class: its place
        and the models."""
        if isinstance(target, Concept):
            self.dictionary(target)   # loaded, once
            key = self.source_key(target)
            if ("sha256", key) not in self.dictionaries:
                state = self.dictionaries[key].state_dict()
                self.dictionaries["sha256", key] = checksum({k: v.detach().cpu() for k, v in state.items()})
            return f"concept {target.concept} of the dictionary {self.dictionaries['sha256', key]}"
        drawn_in = " + ".join(models)
        if isinstance(target, Label):
            return f"class {target.label} in {drawn_in}"
        number = target.unit if isinstance(target, Unit) else target.channel
        return f"{type(target).__name__.lower()} {number} of block {target.block} in {drawn_in}"

    @staticmethod
    def source_key(target: Concept):
        """Where `dictionaries` keeps the source a concept names: its name or folder, or the object given."""
        return str(target.dictionary) if isinstance(target.dictionary, (str, Path)) else id(target.dictionary)

    def dictionary(self, target: Concept) -> tuple[Dictionary, tuple[int, int] | None]:
        """The dictionary `target` names, for this model (its own, of a dictionary across models), and the cells it
        reads (None: the model's own grid); a source is loaded once."""
        source = target.dictionary
        key = self.source_key(target)
        if key not in self.dictionaries:
            if isinstance(source, (str, Path)):
                try:
                    found = load_dictionary(source).eval().requires_grad_(False)   # ours: no gradient of its own
                except ConceptsError as e:
                    raise LooksError(str(e)) from None
            else:
                found = source
            self.dictionaries[key] = found.to(self.loaded.device)
        found, names = self.dictionaries[key], model_names(self.loaded)
        if isinstance(found, Across):
            model = next((m for m in found.models if m in names), None)
            if model is None:
                raise LooksError(f"The dictionary {source} is across {', '.join(found.models)}, not "
                                 f"{self.loaded.name}: pick one of those models.")
            return found.dictionary(model), cells_of(found.training_record)
        if found.model is not None and found.model not in names:
            raise LooksError(f"The dictionary {source} was trained on {found.origin.describe()}, not on "
                             f"{self.loaded.name}: pick {found.model}, or a dictionary of {self.loaded.name}.")
        return found, None

    def typical_activation(self, target: Target) -> float:
        """A target's typical activation in this model (the module docstring): for a concept of a dictionary read
        from a folder with an exemplar index, the mean of its top exemplar values (the median over the concepts
        that fire, where it never does); 1 otherwise."""
        if not isinstance(target, Concept) or not isinstance(target.dictionary, (str, Path)):
            return 1.0
        dictionary, _ = self.dictionary(target)
        key = ("typical", str(target.dictionary), id(dictionary))
        if key not in self.dictionaries:
            try:
                values = index_in(target.dictionary, dictionary=dictionary).values.double()
            except ConceptsError:
                values = torch.ones(dictionary.n_concepts, 1, dtype=torch.float64)
            fired = values > 0
            typical = (values * fired).sum(1) / fired.sum(1).clamp(min=1)
            fires = typical > 0
            self.dictionaries[key] = torch.where(fires, typical, typical[fires].median() if fires.any() else 1.0)
        return float(self.dictionaries[key][target.concept])
