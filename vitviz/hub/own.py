"""vitviz's own checkpoint folders (`bundle.py`: config.json with `"format": "vitviz"`, model.safetensors)."""
from __future__ import annotations

import torch
from safetensors import SafetensorError

from ..bundle import FORMAT, load_bundle
from .files import CONFIG, SAFETENSORS, Files
from .loaded import LoadedModel, LoadError


def matches(config: dict) -> bool:
    """Whether a config.json is one of vitviz's own (`"format": "vitviz"`)."""
    return config.get("format") == FORMAT


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A vitviz checkpoint folder (`bundle.py`'s layout) as a `LoadedModel`; `LoadError` when its config
    and weights do not fit together or the weights are damaged."""
    weights = files.get(SAFETENSORS)
    try:
        model, transform, labels, _ = load_bundle(weights.parent)
    except SafetensorError as e:
        raise files.damaged(weights, e) from None
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its vitviz {CONFIG} and weights do not fit together ({e}).") from None
    return LoadedModel(files.name, model.to(device), config["family"], tuple(labels), transform,
                       files.source("vitviz", SAFETENSORS))
