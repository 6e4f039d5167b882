"""What the readers of dictionary files share: the shape of one (`Reader`), and for other tools' files, their weights
checked and put into a vitviz kind, the TransformerLens hook names they record turned into a block, and pickled
state dicts read without running code.

A reader is a module for one layout (`own`, `across`, `saelens`, `saev`, `prisma`) with the three functions of
`Reader`; `READERS` (`__init__.py`) lists them in the order `load` tries them. A new published layout is a new
module of that shape and a place in that list.

Every layout holds SAELens's four tensors, W_enc d n, b_enc n, W_dec n d and b_dec d, and a kind's own (JumpReLU's
threshold n). `dictionary_from` checks that none is missing or unknown, that their shapes are the ones the file's
config names and that they are finite, and folds into vitviz's formulas (`kinds/dictionary.py`) what the tool's
differ in:

    b_dec not subtracted before the encoder (SAELens's apply_b_dec_to_input = false, saev's newer files):
        pre = x W_enc + b_enc = (x - b_dec) W_enc + (b_enc + b_dec W_enc)          b_enc <- b_enc + b_dec W_enc
    codes in units of the decoder rows' norms r_i = ‖W_dec[i]‖ (SAELens's rescale_acts_by_decoder_norm):
        z = σ(pre · r),  x̂ = Σ_i (z_i / r_i) W_dec[i] + b_dec     W_enc[:, i], b_enc[i] <- · r_i,  W_dec[i] <- / r_i

each exact up to rounding: computed in float64, and kept in float64 where the file's weights are, else in float32
as vitviz's dictionaries are (a float16 or bfloat16 file's weights are exact in float32).

The normalisation is none (offset 0, scale 1), or one of each token by its own statistics (SAELens's and
ViT-Prisma's layer_norm and constant_norm_rescale, `kinds.dictionary.TokenNormalisation`: `per_token`); the layouts that
normalise with constants of the data set do not hold them (their readers refuse those files or say so).
"""
from __future__ import annotations

import io
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ... import catalog
from ..kinds.dictionary import UNKNOWN, ConceptsError, Dictionary, Origin
from .own import refuse_non_finite

if TYPE_CHECKING:
    from ..kinds.across import Across

WEIGHTS = ("W_enc", "b_enc", "W_dec", "b_dec")
HOOK = re.compile(r"blocks\.(\d+)\.hook_resid_(post|pre)")   # TransformerLens's residual stream around block L
MODEL_PREFIXES = ("open-clip:", "hf-hub:")   # how ViT-Prisma and open_clip write a Hub model's name


class Reader(Protocol):
    """The shape of a reader of one dictionary layout: a module with these three functions (a module is a
    `Protocol`'s implementation as a class instance is)."""

    def matches(self, path: Path) -> bool:
        """Whether the local file or folder `path` is in this layout."""

    def read(self, path: Path) -> Dictionary | Across:
        """A file or folder of this layout -> the dictionary, in eval mode on the CPU, or a ConceptsError in words."""

    def fetch(self, get: Callable[..., Path | None], *, weights: str | None = None) -> Path | None:
        """This layout's files from a Hub repo (`get(name, optional=)` downloads one) -> the local path for `read`,
        or None where the repo does not hold this layout. `weights` names the weights file, where it varies."""


def dictionary_from(cls: type[Dictionary], tensors: Mapping[str, Tensor], *, what: str, d: int, n_concepts: int,
                    origin: Origin = UNKNOWN, b_dec_in_encoder: bool = True, decoder_norm_units: bool = False,
                    per_token: str | None = None, **settings) -> Dictionary:
    """A `cls` dictionary (built with `settings`) holding a file's `tensors` (SAELens's names and the kind's own
    buffers), in eval mode on the CPU; `what` names the file in messages. `b_dec_in_encoder`: whether the tool's
    encoder reads x - b_dec; `decoder_norm_units`: whether its codes are in units of the decoder rows' norms (the
    module docstring has both folds); `per_token`: the normalisation of each token the tool applies, if any.
    Refused in words: missing, unknown, misshapen or non-finite tensors."""
    try:
        dictionary = cls(d, n_concepts, origin=origin, **settings)
    except ConceptsError as e:
        raise ConceptsError(f"{what}: {e}") from None
    expected = {name: tuple(value.shape) for name, value in dictionary.state_dict().items()
                if not name.startswith("normalisation.")}
    missing, unknown = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing:
        raise ConceptsError(f"{what} has no {', '.join(missing)}, which a {cls.kind} dictionary needs: it is "
                            f"incomplete, or written by another version of its tool.")
    if unknown:
        raise ConceptsError(f"{what} holds {', '.join(unknown)}, which a {cls.kind} dictionary does not have: "
                            f"vitviz does not know what they do to its codes, so it does not guess.")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ConceptsError(f"{what}: {name} is {_shape(tensors[name].shape)}, but its config (d = {d}, "
                                f"{n_concepts} concepts) makes it {_shape(shape)}.")
    refuse_non_finite(dict(tensors), what)
    if tensors["W_enc"].dtype == torch.float64:
        dictionary.double()
    weights = {name: value.double() for name, value in tensors.items()}
    if decoder_norm_units:
        norms = weights["W_dec"].norm(dim=1)
        if not (norms > 0).all():
            raise ConceptsError(f"{what}: a row of W_dec is zero, and its codes are in units of those rows' norms.")
        weights["W_enc"], weights["b_enc"] = weights["W_enc"] * norms, weights["b_enc"] * norms
        weights["W_dec"] = weights["W_dec"] / norms[:, None]
    if not b_dec_in_encoder:
        weights["b_enc"] = weights["b_enc"] + weights["b_dec"] @ weights["W_enc"]
    state = dictionary.state_dict()
    dictionary.load_state_dict({**state, **{name: value.to(state[name].dtype) for name, value in weights.items()}})
    if per_token:
        dictionary.normalise_each_token(per_token)
    return dictionary.eval()


def block_of_hook(hook: str, *, what: str) -> int:
    """The block whose output tokens a TransformerLens hook name reads: blocks.L.hook_resid_post is block L's output,
    blocks.L.hook_resid_pre block L - 1's. Anything else (an MLP's or attention's output, resid_mid, the embedding
    before block 0) is not a block's output, which is what vitviz's dictionaries read: refused in words."""
    found = HOOK.fullmatch(hook)
    if found and (found[2] == "post" or int(found[1]) > 0):
        return int(found[1]) - (found[2] == "pre")
    raise ConceptsError(f"{what} was trained on {hook!r}, which is not a block's output (vitviz reads the residual "
                        f"stream after a block: blocks.L.hook_resid_post, or blocks.L+1.hook_resid_pre).")


def model_of(name: str | None) -> str | None:
    """The model a tool's file names, as vitviz names it: the catalog's short name for its Hub repo where the catalog
    has one, else the repo (open_clip's `hf-hub:` and ViT-Prisma's `open-clip:` prefixes dropped)."""
    if not name:
        return None
    for prefix in MODEL_PREFIXES:
        name = name.removeprefix(prefix)
    return catalog.model_name(name)


def read_state_dict(data: bytes, *, what: str) -> dict[str, Tensor]:
    """A torch.save'd state dict of tensors, through torch.load(weights_only=True): pickled code, or any object
    but tensors, is refused in words and never run."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # the weights-only unpickler stops at the first thing that is not tensor data; code and garbage look alike
        raise ConceptsError(f"{what} was refused: it is not tensors alone (it holds pickled Python objects or code, "
                            f"or it is damaged), and vitviz never runs code from a file.") from None
    except (EOFError, RuntimeError, ValueError, zipfile.BadZipFile) as e:
        raise ConceptsError(f"{what} is damaged or cut short ({_reason(e)}).") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise ConceptsError(f"{what} is not a state dict of tensors.")
    return state


def _shape(shape) -> str:
    return " x ".join(map(str, shape)) or "a scalar"


def _reason(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]
