"""SAELens's dictionary folder: `cfg.json` beside `sae_weights.safetensors`, as SAELens's `SAE.save_model` and
`save_inference_model` write it (one folder per dictionary; a Hub repo of many keeps each in a folder of its own).

    sae_weights.safetensors   W_enc d n, b_enc n, W_dec n d, b_dec d; JumpReLU: threshold n; a BatchTopK training
                              checkpoint: topk_threshold ()
    cfg.json                  architecture, d_in, d_sae, apply_b_dec_to_input, normalize_activations, k (topk),
                              rescale_acts_by_decoder_norm (topk, batchtopk), reshape_activations, metadata
                              {model_name, hook_name}; files before SAELens 6 keep the metadata at the top level,
                              call the hook `hook_point` and say topk as activation_fn(_str) "topk" with
                              activation_fn_kwargs {k}

The architectures and their codes (SAELens's `encode`, pre = (x - b_dec) W_enc + b_enc):

    standard    z = ReLU(pre)                                            -> Standard
    topk        z = ReLU(TopK_k(pre))   the k largest, then the ReLU     -> TopK
    jumprelu    z = ReLU(pre) · 1[pre > threshold]                       -> JumpReLU
    batchtopk   SAELens writes a trained one as jumprelu, every threshold its learned one; a training checkpoint
                (architecture batchtopk) is read as that same JumpReLU, as `save_inference_model` would write it

`apply_b_dec_to_input` false (the encoder reads x itself) and `rescale_acts_by_decoder_norm` (the TopK picks among
pre · ‖W_dec[i]‖) are folded into the weights exactly (`layout.py`). Refused, in words:
- `normalize_activations` expected_average_only_in, which scales the activations by a factor SAELens keeps in
  its registry of pretrained dictionaries, not in the folder, and covariance_whitening, whose matrix is not in the
  folder (SAELens folds it into the weights when it finishes training, and this folder was saved before); none,
  layer_norm and constant_norm_rescale (each token by its own mean and spread, or norm:
  `kinds.dictionary.TokenNormalisation`, whose codes decode beside their tokens) are read;
- `reshape_activations` hook_z (attention heads' outputs, not a block's output tokens), a hook other than a
  block's residual output (`layout.block_of_hook`), and the other architectures (gated, matryoshka, transcoders);
- a `scaling_factor` other than ones (SAELens before 6 fine-tuned one; SAELens 6 reads none);
- a damaged file, missing or misshapen tensors, NaN weights.

The origin is the metadata's model (the catalog's name for it where there is one) and the block its hook reads;
the whole cfg.json is kept as the dictionary's `training_record`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..kinds.dictionary import ConceptsError, Dictionary, Origin, TokenNormalisation
from ..kinds.jumprelu import JumpReLU
from ..kinds.standard import Standard
from ..kinds.topk import TopK
from .layout import block_of_hook, dictionary_from, model_of

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"


def matches(path: Path) -> bool:
    """Whether `path` is in this layout: a folder holding cfg.json, or one of the two files of such a folder."""
    folder = path if path.is_dir() else path.parent
    return (folder / CONFIG).is_file() and (path.is_dir() or path.name in (CONFIG, WEIGHTS))


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's files from a Hub repo (`get(name, optional=)` downloads one) -> their local folder, or None
    where there is no cfg.json. Its file names are fixed: `weights` names none of them."""
    config = get(CONFIG, optional=True)
    if config is None:
        return None
    get(WEIGHTS)
    return config.parent


def read(path: Path) -> Dictionary:
    """A SAELens folder (or one of its files) -> the dictionary in eval mode on the CPU, or a ConceptsError that
    says what vitviz cannot read in it and why."""
    folder = path if path.is_dir() else path.parent
    cfg = _config(folder / CONFIG)
    what = f"The SAELens dictionary in {folder}"
    try:
        tensors = load_file(folder / WEIGHTS)
    except FileNotFoundError:
        raise ConceptsError(f"{folder} has {CONFIG} but no {WEIGHTS}: the folder is incomplete.") from None
    except SafetensorError as e:
        raise ConceptsError(f"{folder / WEIGHTS} is damaged or not a safetensors file ({e}).") from None
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else cfg   # before SAELens 6: the top
    per_token = _refuse_what_cannot_be_exact(cfg, tensors, what)
    architecture = _architecture(cfg)
    try:
        d, n = int(cfg["d_in"]), int(cfg["d_sae"])
        hook = metadata.get("hook_name") or metadata.get("hook_point")
        origin = Origin(model=model_of(metadata.get("model_name")),
                        block=block_of_hook(hook, what=what) if hook else None)
        common = dict(what=what, d=d, n_concepts=n, origin=origin,
                      b_dec_in_encoder=cfg.get("apply_b_dec_to_input", True) is not False, per_token=per_token)
        if architecture == "standard":
            dictionary = dictionary_from(Standard, tensors, **common)
        elif architecture == "topk":
            dictionary = dictionary_from(TopK, tensors, k=int(_k(cfg)), **common,
                                         decoder_norm_units=bool(cfg.get("rescale_acts_by_decoder_norm", False)))
        elif architecture == "jumprelu":
            dictionary = dictionary_from(JumpReLU, tensors, **common)
        else:   # a BatchTopK training checkpoint: its one threshold for every concept, as SAELens saves it
            threshold = tensors.pop("topk_threshold", None)
            if threshold is None or threshold.numel() != 1:
                raise ConceptsError(f"{what} is a batchtopk training checkpoint without its one topk_threshold.")
            tensors["threshold"] = threshold.reshape(()).expand(n).clone()
            dictionary = dictionary_from(JumpReLU, tensors, **common,
                                         decoder_norm_units=bool(cfg.get("rescale_acts_by_decoder_norm", True)))
    except (KeyError, TypeError, ValueError) as e:
        raise ConceptsError(f"{folder / CONFIG} lacks a setting vitviz needs or holds one it cannot read "
                            f"({type(e).__name__}: {e}).") from None
    dictionary.training_record = {"layout": "saelens", "cfg": cfg}
    return dictionary


def _config(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConceptsError(f"{path} is damaged: it is not valid JSON ({e}).") from None
    if not isinstance(cfg, dict):
        raise ConceptsError(f"{path} is damaged: it is not a JSON object.")
    return cfg


def _architecture(cfg: dict) -> str:
    """standard, topk, jumprelu or batchtopk, from SAELens 6's `architecture` or the older activation_fn."""
    activation = cfg.get("activation_fn", cfg.get("activation_fn_str", "relu"))
    architecture = cfg.get("architecture", "standard")
    if architecture == "standard" and activation == "topk":   # SAELens before 6 said topk this way
        architecture = "topk"
    elif architecture == "standard" and activation not in ("relu", None):
        raise ConceptsError(f"This SAELens dictionary's activation is {activation!r}; vitviz reads relu and topk.")
    if architecture not in ("standard", "topk", "jumprelu", "batchtopk"):
        raise ConceptsError(f"This SAELens dictionary is a {architecture!r} one; vitviz reads standard, topk, "
                            f"jumprelu and batchtopk dictionaries.")
    return architecture


def _k(cfg: dict) -> int:
    k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
    if k is None or float(k) != int(k):
        raise ConceptsError(f"This SAELens topk dictionary's k is {k!r}; it must be a whole number of concepts.")
    return int(k)


def _refuse_what_cannot_be_exact(cfg: dict, tensors: dict, what: str) -> str | None:
    """The settings whose codes vitviz's formulas cannot reproduce from this folder alone, refused in words;
    a scaling_factor of ones (which SAELens once wrote as a no-op) is dropped. -> the normalisation of each token
    the folder names, or None."""
    norm = cfg.get("normalize_activations", "none")
    norm = {False: "none", True: "expected_average_only_in", None: "none"}.get(norm, norm)   # before SAELens 6
    if norm == "expected_average_only_in":
        raise ConceptsError(f"{what} expects its activations scaled by a factor not in the folder (SAELens "
                            f"keeps it in its registry of pretrained dictionaries): load it with SAELens's "
                            f"SAE.from_pretrained, which folds the factor in, and save it again.")
    if norm != "none" and norm not in TokenNormalisation.MODES:
        raise ConceptsError(f"{what} normalises its activations by {norm!r}, whose constants are not in the folder "
                            f"(SAELens folds a whitening into the weights when training ends); vitviz reads "
                            f"normalize_activations none, {' and '.join(TokenNormalisation.MODES)}.")
    if cfg.get("reshape_activations", "none") != "none":
        raise ConceptsError(f"{what} reads attention heads' outputs ({cfg['reshape_activations']}), not a block's "
                            f"output tokens.")
    scaling = tensors.pop("scaling_factor", None)
    if scaling is not None and not torch.equal(scaling, torch.ones_like(scaling)):
        raise ConceptsError(f"{what} scales its codes by a fine-tuned scaling_factor, which SAELens 6 no longer "
                            f"reads and vitviz does not either.")
    return norm if norm in TokenNormalisation.MODES else None
