"""saev's dictionary file, `sae.pt` (saev's `nn.modeling.dump`, Stevens et al. 2025): one line of JSON, a newline,
then `torch.save` of the state dict.

    {"schema": N, "cfg": {d_model, d_sae, activation: {cls, params}, ...}, "commit": ..., "lib": ...}
    state dict: W_enc d n, b_enc n, W_dec n d, b_dec d; a newer BatchTopK also activation.threshold ()

The header has changed with saev's versions, and with it the encoder (saev's `SparseAutoencoder.forward` and
`encode` through its history):

    no "schema"     the header is the config itself: d_vit, exp_factor (n = d_vit · exp_factor), ReLU codes,
                    and the encoder read x - b_dec:   pre = (x - b_dec) W_enc + b_enc
    schema 1        "cls" the config's class; "SparseAutoencoderConfig" (its activation a {cls, params} entry):
                    the encoder reads x itself, pre = x W_enc + b_enc. "Relu", "TopK" or "BatchTopK" (the class
                    was the activation): saev wrote these both before and after it stopped subtracting b_dec,
                    without a new schema, so their codes cannot be known: refused in words
    schema 2 to 5   cfg d_vit or d_model, exp_factor or d_sae, activation {cls, params}; pre = x W_enc + b_enc

and the activations (saev's `get_activation`):

    Relu                          z = ReLU(pre)                                               -> Standard
    TopK {top_k}                  the k largest pre-activations kept, as they are             -> TopK
    BatchTopK {top_k} with        z = pre · 1[pre > θ] at inference (θ <= 0: a ReLU)          -> JumpReLU, every
      activation.threshold                                                                       threshold θ
    BatchTopK without one         the k largest of each token, like TopK                      -> TopK

saev's TopK keeps a negative pre-activation among the k largest where vitviz's codes (non-negative) hold 0: the
codes are equal wherever a token has k positive pre-activations, as trained ones do. The pre-activations with
x itself are folded into vitviz's formula exactly (`layout.py`). Other activations are refused.

The state dict is read by torch.load(weights_only=True) alone: a file holding pickled code is refused, never run.
saev's header names neither the model nor the layer, and saev does not save how it normalised the activations it
trained on (its older data loader subtracted the data set's mean and scaled to a mean norm of sqrt(d), with
constants it kept nowhere): the dictionary reads raw activations with no normalisation, which is exactly what
saev's own `encode` does with what it is given. The catalog entries name the model and block of saev's published
files; the header is kept as the dictionary's `training_record`.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..kinds.dictionary import ConceptsError, Dictionary
from ..kinds.jumprelu import JumpReLU
from ..kinds.standard import Standard
from ..kinds.topk import TopK
from .layout import dictionary_from, read_state_dict

FILE = "sae.pt"
SCHEMAS = (None, 1, 2, 3, 4, 5)   # those of saev's loader up to its SCHEMA_VERSION = 5
THRESHOLD = "activation.threshold"   # a newer BatchTopK's inference threshold, in its state dict


def matches(path: Path) -> bool:
    """Whether `path` is in this layout: a .pt file whose first line is JSON, or a folder holding sae.pt."""
    path = path / FILE if path.is_dir() else path
    if not (path.is_file() and path.suffix == ".pt"):
        return False
    with open(path, "rb") as f:
        return f.read(1) == b"{"


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's file from a Hub repo (`get(name, optional=)` downloads one): `weights` or sae.pt, or None."""
    return get(weights or FILE, optional=True)


def read(path: Path) -> Dictionary:
    """A saev sae.pt (or a folder holding one) -> the dictionary in eval mode on the CPU, or a ConceptsError that
    says what vitviz cannot read in it and why."""
    path = path / FILE if path.is_dir() else path
    first, newline, rest = path.read_bytes().partition(b"\n")
    try:
        header = json.loads(first)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConceptsError(f"{path} is damaged: its first line is not saev's JSON header ({e}).") from None
    if not newline or not isinstance(header, dict):
        raise ConceptsError(f"{path} is damaged: it has no saev header line before its weights.")
    what = f"The saev dictionary {path}"
    schema = header.get("schema")
    if schema not in SCHEMAS:
        raise ConceptsError(f"{what} is of saev's schema {schema!r}; vitviz reads schemas up to {SCHEMAS[-1]}.")
    if schema == 1 and header.get("cls", "SparseAutoencoderConfig") != "SparseAutoencoderConfig":
        raise ConceptsError(f"{what} is of saev's schema 1 with cls {header['cls']!r}, which saev wrote both while "
                            f"its encoder subtracted b_dec and after it stopped, under the same schema: its codes "
                            f"cannot be known exactly. Load it with the saev version that trained it and dump "
                            f"it again, which writes a newer schema.")
    cfg = header if schema is None else header.get("cfg")
    if not isinstance(cfg, dict):
        raise ConceptsError(f"{path} is damaged: its header has no cfg.")
    tensors = read_state_dict(rest, what=what)
    try:
        d = int(cfg.get("d_model", cfg.get("d_vit")))
        n = int(cfg["d_sae"]) if "d_sae" in cfg else d * int(cfg["exp_factor"])
        cls, settings = _kind(cfg.get("activation") if schema is not None else None, tensors, n, what)
    except (KeyError, TypeError, ValueError) as e:
        raise ConceptsError(f"{what}: its header lacks a setting vitviz needs or holds one it cannot read "
                            f"({type(e).__name__}: {e}).") from None
    dictionary = dictionary_from(cls, tensors, what=what, d=d, n_concepts=n, b_dec_in_encoder=schema is None,
                                 **settings)
    dictionary.training_record = {"layout": "saev", "header": header}
    return dictionary


def _kind(activation: dict | None, tensors: dict, n: int, what: str) -> tuple[type[Dictionary], dict]:
    """The vitviz kind and its settings for saev's activation entry ({cls, params}; None: ReLU), a newer BatchTopK's
    threshold moved from the state dict's activation.threshold to the JumpReLU's threshold (one per concept)."""
    name = (activation or {}).get("cls", "Relu")
    params = (activation or {}).get("params") or {}
    if name == "Relu":
        return Standard, {}
    if name == "BatchTopK" and THRESHOLD in tensors:
        tensors["threshold"] = tensors.pop(THRESHOLD).reshape(()).expand(n).clone()
        return JumpReLU, {}
    if name in ("TopK", "BatchTopK"):
        return TopK, {"k": int(params.get("top_k", 32))}   # saev's default top_k
    raise ConceptsError(f"{what} has saev's {name!r} activation; vitviz reads Relu, TopK and BatchTopK.")
