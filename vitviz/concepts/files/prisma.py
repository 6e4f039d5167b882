"""ViT-Prisma's dictionary (Joseph et al. 2025): `config.json` (its `VisionModelSAERunnerConfig.save_config`)
beside a `.pt` of the state dict (`weights.pt`, or `n_images_<N>.pt` for its CLIP checkpoints).

    config.json   d_in, d_sae (or expansion_factor: n = d_in · expansion_factor), architecture, activation_fn_str,
                  activation_fn_kwargs {k}, normalize_activations, model_name, hook_point_layer, layer_subtype,
                  cls_token_only, use_patches_only, is_transcoder
    the .pt       W_enc d n, b_enc n, W_dec n d, b_dec d (or {"state_dict": ...}), through
                  torch.load(weights_only=True) alone: one holding pickled objects (ViT-Prisma's older
                  `save_model` pickled its config object beside the weights) or code is refused, never run

ViT-Prisma's `SparseAutoencoder.encode_standard` and decoder, with its normalisation N of each token:

    pre = (N(x) - b_dec) W_enc + b_enc,   z = σ(pre),   x̂ = N⁻¹(z W_dec + b_dec)

    activation_fn_str relu   σ = ReLU                                 -> Standard
    activation_fn_str topk   σ = ReLU of the k largest (its TopK)     -> TopK

N none is vitviz's formula with no normalisation. ViT-Prisma's default N, layer_norm (also taken when the config
does not name one, as ViT-Prisma's loader does), centres each token on its own mean and divides it by its own
spread, and constant_norm_rescale scales it to norm √d (`kinds.dictionary.TokenNormalisation`, the same formulas as
SAELens's): its codes decode back to raw activations beside the tokens they came from. Refused in words: other
normalisations, the gated and jumprelu architectures, other activations (tanh-relu), transcoders, a hook other
than a block's residual output, damaged files, missing or misshapen tensors and NaN.

The origin: the model (`model_name`, ViT-Prisma's `open-clip:` prefix dropped; the catalog's name for it where
there is one), the block of `blocks.{hook_point_layer}.{layer_subtype}` (`layout.block_of_hook`) and the tokens
(cls_token_only: cls, use_patches_only: patch, else patch+cls). The config is kept as its `training_record`.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..kinds.dictionary import ConceptsError, Dictionary, Origin, TokenNormalisation
from ..kinds.standard import Standard
from ..kinds.topk import TopK
from .layout import block_of_hook, dictionary_from, model_of, read_state_dict

CONFIG = "config.json"
WEIGHTS = ("weights.pt", "n_images_2600058.pt")   # its README's name, and its CLIP checkpoints' (its loaders' default)
PRISMA_KEYS = ("d_in", "hook_point_layer", "layer_subtype")   # in ViT-Prisma's config.json, in no model's


def matches(path: Path) -> bool:
    """Whether `path` is in this layout: a folder whose config.json is ViT-Prisma's, or a .pt file beside one."""
    if path.is_dir():
        return _is_prisma_config(path / CONFIG)
    return path.suffix == ".pt" and _is_prisma_config(path.parent / CONFIG)


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's files from a Hub repo (`get(name, optional=)` downloads one) -> the local .pt (config.json
    beside it), or None where there is no config.json. The .pt is `weights`, else the first of WEIGHTS there is."""
    if get(CONFIG, optional=True) is None:
        return None
    for name in (weights,) if weights else WEIGHTS:
        path = get(name, optional=True)
        if path is not None:
            return path
    raise ConceptsError(f"This repo has a {CONFIG} but no {' or '.join(WEIGHTS)}: name its weights file, "
                        f"e.g. path_in_repo='n_images_2600058.pt'.")


def read(path: Path) -> Dictionary:
    """A ViT-Prisma .pt (config.json beside it) or its folder -> the dictionary in eval mode on the CPU, or a
    ConceptsError that says what vitviz cannot read in it and why."""
    path = _weights_in(path) if path.is_dir() else path
    config = json.loads((path.parent / CONFIG).read_text(encoding="utf-8"))   # matches() has parsed it
    what = f"The ViT-Prisma dictionary {path}"
    per_token = _refuse_what_cannot_be_exact(config, what)
    tensors = read_state_dict(path.read_bytes(), what=what)
    if set(tensors) == {"state_dict"}:
        tensors = tensors["state_dict"]
    try:
        d = int(config["d_in"])
        n = int(config["d_sae"]) if config.get("d_sae") else d * int(config["expansion_factor"])
        layer = config["hook_point_layer"]
        layer = layer[0] if isinstance(layer, list) and len(layer) == 1 else layer
        origin = Origin(model=model_of(config.get("model_name")),
                        block=block_of_hook(f"blocks.{int(layer)}.{config['layer_subtype']}", what=what),
                        tokens="cls" if config.get("cls_token_only") else
                        "patch" if config.get("use_patches_only") else "patch+cls")
        activation = config.get("activation_fn_str", "relu")
        if activation == "relu":
            cls, settings = Standard, {}
        elif activation == "topk":
            cls, settings = TopK, {"k": int((config.get("activation_fn_kwargs") or {})["k"])}
        else:
            raise ConceptsError(f"{what} has the activation {activation!r}; vitviz reads relu and topk.")
    except (KeyError, TypeError, ValueError) as e:
        raise ConceptsError(f"{path.parent / CONFIG} lacks a setting vitviz needs or holds one it cannot read "
                            f"({type(e).__name__}: {e}).") from None
    dictionary = dictionary_from(cls, tensors, what=what, d=d, n_concepts=n, origin=origin, per_token=per_token,
                                 **settings)
    dictionary.training_record = {"layout": "vit-prisma", "config": config}
    return dictionary


def _is_prisma_config(path: Path) -> bool:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and all(key in config for key in PRISMA_KEYS)


def _weights_in(folder: Path) -> Path:
    """The folder's one .pt, or the first of WEIGHTS where it holds several."""
    found = sorted(folder.glob("*.pt"))
    named = [folder / name for name in WEIGHTS if (folder / name).is_file()]
    if len(found) == 1 or named:
        return named[0] if named else found[0]
    raise ConceptsError(f"{folder} has ViT-Prisma's {CONFIG} but " + (f"{len(found)} .pt files: name the one "
                        f"to load." if found else "no .pt file of weights."))


def _refuse_what_cannot_be_exact(config: dict, what: str) -> str | None:
    """What vitviz's formulas cannot reproduce, refused in words; -> the normalisation of each token, or None."""
    norm = config.get("normalize_activations", "layer_norm")   # ViT-Prisma's default
    if norm not in ("none", None, *TokenNormalisation.MODES):
        raise ConceptsError(f"{what} normalises its activations by {norm!r}; vitviz reads normalize_activations "
                            f"none, {' and '.join(TokenNormalisation.MODES)}.")
    if config.get("architecture", "standard") != "standard":
        raise ConceptsError(f"{what} is a {config['architecture']!r} dictionary; vitviz reads ViT-Prisma's "
                            f"standard ones (relu or topk).")
    if config.get("is_transcoder"):
        raise ConceptsError(f"{what} is a transcoder (it maps one layer's input to another's output), not a "
                            f"dictionary of one layer's tokens.")
    return norm if norm in TokenNormalisation.MODES else None
