"""What every dictionary kind shares: the normalisation, the encoder and decoder, where it came from.

A dictionary (a sparse autoencoder, SAE) of n concepts over d-wide activations x (one token: the
`resid_post` of a block, a CNN's channel vector at one position) is, in SAELens's names,

    x̃     = (x - offset) / scale                      the normalisation, stored with the weights
    pre   = (x̃ - b_dec) W_enc + b_enc                 W_enc d n, b_enc n   (the pre-activations)
    z     = σ(pre)                                    σ the kind's activation: z >= 0, mostly 0
    x̂     = (z W_dec + b_dec) · scale + offset        W_dec n d: row i is concept i's direction

so `encode` takes raw activations to codes and `decode` takes codes back to raw activation space.
b_dec is subtracted before the encoder (SAELens's `apply_b_dec_to_input`, Gao et al.'s pre-encoder
bias). The rows of W_dec have unit norm (training keeps them so), so a code is the length of its
concept's part of x̃: x̂ - offset = scale · (b_dec + Σ_i z_i W_dec[i]).

The normalisation. vitviz centres the activations on their per-dimension mean over the tokens it
estimates them from and divides by one scalar, the root mean square of the centred entries:

    offset = mean_t x_t,      scale = sqrt( mean_t ‖x_t - offset‖² / d )

so the normalised entries have variance 1 on average, and the training loss (the mean squared
error over the entries of x̃) reads as the fraction of variance left unexplained. Both are buffers
of the dictionary and travel in its file, with what it was trained on (`Origin`): a dictionary
applied to other activations is refused in words, never silently rescaled.

Other tools' dictionaries may instead normalise each token by its own statistics at run time (SAELens's and
ViT-Prisma's `normalize_activations`, `TokenNormalisation`): x̃ = (x - μ_x) / σ_x, x̂ = (z W_dec + b_dec) · σ_x + μ_x.
Such a dictionary's codes decode back to raw activations only beside the tokens they came from:
`decode(codes, tokens=x)`, and `forward(x)` passes them itself.

The kinds (one module each, over this base): `standard` (ReLU, made sparse by an L1 penalty while
training), `topk` and `batchtopk`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn


class ConceptsError(ValueError):
    """A dictionary that can't be loaded, trained or applied as asked: the message says why in plain words."""


@dataclass(frozen=True)
class Origin:
    """What a dictionary was trained on: the model (a catalog name or Hub id) at its revision, the block whose
    output tokens it read, and which of them (`tokens`: 'patch', 'cls', 'patch+cls', or 'position' for a CNN's
    spatial positions). None where it is not known."""
    model: str | None = None
    revision: str | None = None
    block: int | None = None
    tokens: str | None = None

    def describe(self) -> str:
        """A few words for messages: 'vit-cifar10 block 6 (index 5), patch tokens' (`block_words`)."""
        if self.model is None and self.block is None:
            return "activations of unrecorded origin"
        model = (self.model or "an unnamed model") + (f"@{self.revision}" if self.revision else "")
        block = f" {block_words(self.block)}" if self.block is not None else ""
        return model + block + (f", {self.tokens} tokens" if self.tokens else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping) -> Origin:
        return cls(**{key: values.get(key) for key in ("model", "revision", "block", "tokens")})


UNKNOWN = Origin()   # a dictionary whose origin nobody recorded


def block_words(index: int) -> str:
    """A block as a person reads it: the app counts blocks from 1, the code (the trace's blocks, timm's `blocks.N`,
    `concepts train --block`, the bundled names like vit-cifar10-block1) indexes them from 0, so a message says
    both: 'block 6 (index 5)'; 'the last block (index -1)' from the end."""
    if index == -1:
        return "the last block (index -1)"
    return f"block {index + 1} (index {index})" if index >= 0 else f"block index {index} (from the end)"


class Normalisation(nn.Module):
    """x̃ = (x - offset) / scale, and its inverse; `offset` d and `scale` () are buffers (saved, not trained)."""

    per_token: ClassVar[str | None] = None   # the name of a normalisation of each token by its own statistics

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("offset", torch.zeros(d))
        self.register_buffer("scale", torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.offset) / self.scale

    def inverse(self, normalised: Tensor, tokens: Tensor | None = None) -> Tensor:
        """Normalised space -> raw activations (`tokens`, the ones the codes came from, are not needed)."""
        return normalised * self.scale + self.offset

    def scale_of(self, tokens: Tensor) -> Tensor:
        """(..., 1): what a unit of normalised space is in raw activations at each of `tokens` (..., d)."""
        return self.scale.expand(*tokens.shape[:-1], 1)

    @torch.no_grad()
    def fit(self, tokens: Tensor) -> None:
        """offset and scale from `tokens` (t d), in float64: the per-dimension mean, and the root mean square
        of the centred entries. Refused when the tokens are not finite or do not vary (nothing to scale)."""
        if not tokens.isfinite().all():
            raise ConceptsError(f"The activations hold NaN or infinite values among the first {len(tokens)} tokens, "
                                f"which the normalisation is estimated from.")
        tokens = tokens.double()
        offset = tokens.mean(0)
        scale = (tokens - offset).square().mean().sqrt()
        if not scale > 0:
            raise ConceptsError(f"All {len(tokens)} activation tokens the normalisation was estimated from are the "
                                f"same vector: there is nothing for a dictionary to explain.")
        self.offset.copy_(offset)
        self.scale.copy_(scale)


class TokenNormalisation(nn.Module):
    """Each token x (d entries) normalised by its own statistics, as SAELens and ViT-Prisma do at run time (their
    `normalize_activations`; both tools' code computes the same):

        layer_norm              x̃ = (x - μ_x) / (σ_x + ε)     x̂ = y · σ_x + μ_x
        constant_norm_rescale   x̃ = x · √d / ‖x‖               x̂ = y · ‖x‖ / √d

    μ_x and σ_x the mean and standard deviation (n - 1 in the denominator, torch's default) of the token's
    entries, ε = 1e-5, y = z W_dec + b_dec the reconstruction in normalised space. The inverse of layer_norm
    leaves ε out, as the tools' does. Nothing is stored: the inverse needs the token itself."""

    EPS = 1e-5
    MODES: ClassVar[dict[str, str]] = {"layer_norm": "its own mean and spread", "constant_norm_rescale": "its own norm"}

    def __init__(self, mode: str):
        super().__init__()
        if mode not in self.MODES:
            raise ConceptsError(f"There is no normalisation of each token called {mode!r}; there are "
                                f"{', '.join(self.MODES)}.")
        self.per_token = mode

    def forward(self, x: Tensor) -> Tensor:
        if self.per_token == "layer_norm":
            centred = x - x.mean(-1, keepdim=True)
            return centred / (centred.std(-1, keepdim=True) + self.EPS)
        return x * (x.shape[-1] ** 0.5 / x.norm(dim=-1, keepdim=True))

    def inverse(self, normalised: Tensor, tokens: Tensor | None = None) -> Tensor:
        if tokens is None:
            raise ConceptsError(f"This dictionary normalises each token by {self.MODES[self.per_token]} "
                                f"({self.per_token}), so its codes decode back to raw activations only beside the "
                                f"tokens they came from: decode(codes, tokens=x).")
        if tokens.shape[:-1] != normalised.shape[:-1]:
            raise ConceptsError(f"The codes are of {_shape(normalised.shape[:-1])} tokens, the tokens given beside "
                                f"them {_shape(tokens.shape[:-1])}.")
        shift = tokens.mean(-1, keepdim=True) if self.per_token == "layer_norm" else 0
        return normalised * self.scale_of(tokens) + shift

    def scale_of(self, tokens: Tensor) -> Tensor:
        if self.per_token == "layer_norm":
            return tokens.std(-1, keepdim=True)
        return tokens.norm(dim=-1, keepdim=True) / tokens.shape[-1] ** 0.5


def _shape(shape) -> str:
    return " x ".join(map(str, shape)) or "one"


class Dictionary(nn.Module):
    """n concepts over d-wide activations (the module docstring has the formulas). A kind subclasses it with
    its `kind` name, its `activation` (pre-activations -> codes at inference), optionally the codes it trains
    with (`training_activation`) and what it learns from them besides gradients (`observe`)."""

    kind: ClassVar[str]
    penalised: ClassVar[bool] = False   # made sparse by an L1 penalty in training, rather than by its activation

    def __init__(self, d: int, n_concepts: int, *, origin: Origin = UNKNOWN):
        super().__init__()
        self.W_enc = nn.Parameter(torch.zeros(d, n_concepts))
        self.b_enc = nn.Parameter(torch.zeros(n_concepts))
        self.W_dec = nn.Parameter(torch.zeros(n_concepts, d))
        self.b_dec = nn.Parameter(torch.zeros(d))
        self.normalisation = Normalisation(d)
        self.origin = origin
        self.training_record: dict | None = None   # how it was trained (`train` fills it; files keep it)

    @property
    def d(self) -> int:
        """The width of the activations it reads."""
        return self.W_enc.shape[0]

    @property
    def n_concepts(self) -> int:
        return self.W_enc.shape[1]

    @property
    def model(self) -> str | None:
        """The model whose activations it was trained on."""
        return self.origin.model

    @property
    def block(self) -> int | None:
        """The block whose output tokens it was trained on."""
        return self.origin.block

    def normalise_each_token(self, mode: str) -> Dictionary:
        """This dictionary with SAELens's or ViT-Prisma's normalisation of each token by its own statistics (`mode`
        layer_norm or constant_norm_rescale: `TokenNormalisation`) in place of the fixed one; -> itself."""
        self.normalisation = TokenNormalisation(mode)
        return self

    def settings(self) -> dict:
        """The kind's own settings (TopK's k), as its file records them; the constructor takes them back."""
        return {}

    def activation(self, pre: Tensor) -> Tensor:
        """Pre-activations (..., n) -> non-negative codes (..., n), token by token (inference)."""
        raise NotImplementedError

    def training_activation(self, pre: Tensor) -> Tensor:
        """The codes of a training batch (t n); the same as at inference unless the kind says otherwise."""
        return self.activation(pre)

    def observe(self, codes: Tensor) -> None:
        """What a kind learns from a training batch's codes besides gradients (BatchTopK: its threshold)."""

    def pre_activations(self, normalised: Tensor) -> Tensor:
        """x̃ (..., d) -> (x̃ - b_dec) W_enc + b_enc (..., n), computed as x̃ W_enc + (b_enc - b_dec W_enc): b_dec's
        gradient then comes through one vector, not through every token (a t n by n d product less per step)."""
        return normalised @ self.W_enc + (self.b_enc - self.b_dec @ self.W_enc)

    def decode_normalised(self, codes: Tensor) -> Tensor:
        """Codes (..., n) -> the reconstruction in normalised space, z W_dec + b_dec (..., d)."""
        return codes @ self.W_dec + self.b_dec

    def encode(self, x: Tensor) -> Tensor:
        """Raw activations (..., d) -> non-negative codes (..., n), in the dictionary's dtype and device."""
        self.check_width(x.shape[-1])
        x = x.to(device=self.W_enc.device, dtype=self.W_enc.dtype)
        return self.activation(self.pre_activations(self.normalisation(x)))

    def decode(self, codes: Tensor, tokens: Tensor | None = None) -> Tensor:
        """Codes (..., n) -> activations (..., d) in raw activation space (the normalisation undone). `tokens`
        (..., d), the raw activations the codes came from, are needed where the dictionary normalises each token
        by its own statistics (`TokenNormalisation`), and not read otherwise."""
        if codes.shape[-1] != self.n_concepts:
            raise ConceptsError(f"This dictionary has {self.n_concepts} concepts; the codes given have "
                                f"{codes.shape[-1]}.")
        codes = codes.to(device=self.W_dec.device, dtype=self.W_dec.dtype)
        if tokens is not None:
            self.check_width(tokens.shape[-1])
            tokens = tokens.to(device=self.W_dec.device, dtype=self.W_dec.dtype)
        return self.normalisation.inverse(self.decode_normalised(codes), tokens)

    def forward(self, x: Tensor) -> Tensor:
        """The reconstruction x̂ of raw activations x (..., d)."""
        return self.decode(self.encode(x), x)

    def check_applies(self, *, model: str, block: int, width: int, names: tuple[str, ...] = ()) -> None:
        """Refuses a model, block (an index into the trace's blocks, counted from 0) or width other than the ones
        it was trained on, in words that say which those were. `names` are other names of the model (its Hub
        repo for a catalog name); an origin that does not record the model or block accepts any."""
        if self.origin.model is not None and self.origin.model not in (model, *names):
            raise ConceptsError(f"This dictionary was trained on {self.origin.describe()}, not on {model}: pick "
                                f"{self.origin.model} to use it, or a dictionary trained on {model}.")
        if self.origin.block is not None and self.origin.block != block:
            raise ConceptsError(f"This dictionary was trained on {self.origin.describe()}, not on "
                                f"{block_words(block)}: read {block_words(self.origin.block)} to use it.")
        self.check_width(width)

    def check_width(self, width: int) -> None:
        """Refuses activations of another width, in words that say which it was trained on."""
        if width != self.d:
            raise ConceptsError(f"This dictionary was trained on {self.d}-wide activations "
                                f"({self.origin.describe()}); these are {width} wide.")
