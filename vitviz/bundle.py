"""vitviz's own checkpoint folder: `config.json` (architecture, preprocessing, labels) + `model.safetensors`.

The bundled offline models in `checkpoints/` use it; `vitviz.train` writes it and `vitviz.hub` reads it.
Weights may be stored as fp16 to stay small; they always load back as fp32.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .models import allocate, build, family_of, load_weights
from .preprocess import Transform

FORMAT = "vitviz"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
STEPS = "steps"   # the folder of a training run's step checkpoints (`vitviz.train --save-steps`)


def is_bundle(folder: Path) -> bool:
    config = Path(folder) / CONFIG_FILE
    return config.is_file() and json.loads(config.read_text()).get("format") == FORMAT


def save_bundle(folder: str | Path, model, *, transform: Transform, labels: list[str], extra: dict | None = None,
                dtype: torch.dtype = torch.float16) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "family": family_of(model), "model": model.config.to_dict(),
              "preprocess": transform.to_dict(), "labels": list(labels), **(extra or {})}
    weights = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
               for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(weights, tmp)
    tmp.replace(folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def read_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / CONFIG_FILE).read_text())


def load_bundle(folder: str | Path):
    """-> (model in eval mode, fp32, on CPU; Transform; labels; the whole config dict)."""
    config = read_config(folder)
    with torch.device("meta"):   # no random initialisation (most of a load's time): the file holds every value
        model = build(config["family"], config["model"])
    model = allocate(model, "cpu")
    weights = {k: v.float() if v.is_floating_point() else v for k, v in load_file(Path(folder) / WEIGHTS_FILE).items()}
    load_weights(model, weights)
    for name, buffer in model.named_buffers():
        if name.endswith("num_batches_tracked"):   # not stored (see save_bundle); unused in eval
            buffer.zero_()
    return model.eval(), Transform(**config["preprocess"]), config["labels"], config


def step_folder(out: str | Path, step: int) -> Path:
    """Where `--save-steps` keeps the model after `step` optimiser steps: OUT/steps/step-<step>/."""
    return Path(out) / STEPS / f"step-{step}"


def saved_steps(folder: str | Path) -> list[int]:
    """The steps a checkpoint folder keeps along its training (OUT/steps/step-<N>/ with its weights), in order."""
    found = (Path(folder) / STEPS).glob("step-*")
    return sorted(int(p.name[5:]) for p in found if p.name[5:].isdigit() and (p / WEIGHTS_FILE).is_file())
