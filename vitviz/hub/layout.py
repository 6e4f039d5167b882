"""What every checkpoint layout's reader shares: the model built from a state dict, the label list, the refusal.

A reader is a module with `read(files, config, device) -> LoadedModel` for one layout (`__init__.py` picks
it from config.json); none runs code from the checkpoint.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..models import allocate, load_weights
from ..preprocess import Transform
from .files import CONFIG, OPEN_CLIP_CONFIG, PROCESSOR, Files
from .loaded import LoadedModel, LoadError

WHAT_RUNS = (f"vitviz runs ViT, DeiT, Swin, ResNet and ConvNeXt checkpoints from timm, CvT, Swin, ResNet and "
             f"ConvNeXt checkpoints from transformers, CLIP ViTs from open_clip ({OPEN_CLIP_CONFIG}) or transformers "
             f"(CLIPModel) and its own bundled models")


def unsupported(name: str, what: str) -> LoadError:
    """The `LoadError` for a checkpoint of a kind vitviz does not read: what it is, and what does run."""
    return LoadError(f"{name!r} is {what}; {WHAT_RUNS}.")


def build(model_cls: type[nn.Module], config, weights: dict[str, Tensor], device: torch.device, files: Files,
          weights_file: str, *, config_file: str = CONFIG) -> nn.Module:
    """`model_cls(config)` holding `weights`, in eval mode on `device`, or a LoadError saying what does not fit."""
    with torch.device("meta"):   # no random init: every value comes from the checkpoint
        model = model_cls(config)
    model = allocate(model, device)
    try:
        load_weights(model, weights)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: the tensors in {weights_file} do not fit its {config_file}: {e}.") from None
    for name, buffer in model.named_buffers():
        if name.endswith("num_batches_tracked"):   # not stored by transformers; unused in eval
            buffer.zero_()
    return model.eval()


def label_list(names, n: int, *, describe: dict | None = None) -> tuple[str, ...] | None:
    """Class names in index order from a list or an {index: name} dict; None if they don't cover n classes."""
    if isinstance(names, dict):
        names = [names.get(str(i)) for i in range(n)]
    if not isinstance(names, (list, tuple)) or len(names) != n or not all(isinstance(x, str) for x in names):
        return None
    return tuple((describe or {}).get(x, x) for x in names)


def numbered(n: int) -> tuple[str, ...]:
    """Labels for a checkpoint that names no classes: 'class 0', 'class 1', ..."""
    return tuple(f"class {i}" for i in range(n))


def id2label(config: dict, n: int) -> tuple[str, ...]:
    """A transformers config.json's class names (`id2label`), numbered where it has none for all n classes."""
    return label_list({str(k): v for k, v in (config.get("id2label") or {}).items()}, n) or numbered(n)


def num_labels(config: dict) -> int:
    """The class count transformers reads from a config.json: id2label's size, else num_labels (default 2)."""
    return len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)


def transformers_model(files: Files, config: dict, device: torch.device, *, family: str, model_cls: type[nn.Module],
                       from_config: Callable[[dict], object], convert: Callable[[dict], dict], default_processor: dict,
                       transform: Callable[[dict], Transform], resized: Callable[[dict, int], dict]) -> LoadedModel:
    """A transformers image classifier: its config.json through `from_config`, its preprocessor_config.json (or
    `default_processor`) through `transform`, its weights through `convert`; `resized(processor, size)` is the
    processor at another input size."""
    try:
        model_config = from_config(config)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its {config.get('model_type')} {CONFIG} is not one vitviz can build "
                        f"({e!r}).") from None
    processor = files.json(PROCESSOR, optional=True) or default_processor
    try:
        model_transform = transform(processor)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its {PROCESSOR} is not supported ({e}).") from None
    weights, weights_file = files.weights()
    model = build(model_cls, model_config, convert(weights), device, files, weights_file)
    return LoadedModel(files.name, model, family, id2label(config, num_labels(config)), model_transform,
                       files.source("transformers", weights_file),
                       functools.partial(_at, transform, resized, processor))


def _at(transform: Callable[[dict], Transform], resized: Callable[[dict, int], dict], processor: dict,
        size: int) -> Transform:
    return transform(resized(processor, size))   # a module-level function: a card's transform_at must pickle


def same_shapes(ours: torch.nn.Module, reference: torch.nn.Module, name: str, family: str) -> None:
    """What module checks can't see (biases, extra norms, token counts) shows in the state dict's shapes."""
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    if mine != theirs:
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise unsupported(name, f"a timm model whose parameters differ from vitviz's {family} at {differ[:4]}")
