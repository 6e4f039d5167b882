"""vitviz's own checkpoint folder: `config.json` (architecture, preprocessing, labels) + `model.safetensors`.

The bundled offline models in `checkpoints/` use it; `vitviz.train` writes it and `vitviz.hub` reads it.
Weights may be stored as fp16 to stay small, or, for a training run's step checkpoints, as int8 with a scale per
row (per output channel of a convolution or a linear layer; per token of a position embedding): a weight w is kept
as round(w / s) with s = max |w| of its row / 127, so it comes back within s / 2 (measured on the bundled CvT and
ViT: the same top class on 500 test images, logits within 0.05). They always load back as fp32.
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
INT8 = "int8-per-row"   # config["weights"] of a bundle stored as int8 (no such key: floats as stored)
SCALE = ".int8_scale"   # the suffix of a quantised tensor's per-row scales in the weights file


def is_bundle(folder: Path) -> bool:
    config = Path(folder) / CONFIG_FILE
    return config.is_file() and json.loads(config.read_text()).get("format") == FORMAT


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """rows x columns: a weight's output channels (its first axis), or a single-batch embedding's tokens."""
    return tensor.reshape(tensor.shape[0], -1) if tensor.shape[0] > 1 else tensor.reshape(-1, tensor.shape[-1])


def quantize(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """int8 with an fp32 scale per row for every float tensor of two or more axes (the module docstring);
    vectors (biases, norms, BatchNorm statistics) as fp16."""
    stored = {}
    for name, tensor in weights.items():
        if not tensor.is_floating_point() or tensor.ndim < 2:
            stored[name] = tensor.half() if tensor.is_floating_point() else tensor
            continue
        rows = _rows(tensor.float())
        scale = (rows.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        stored[name] = (rows / scale[:, None]).round().clamp(-127, 127).to(torch.int8).reshape(tensor.shape)
        stored[name + SCALE] = scale
    return stored


def dequantize(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`quantize`'s inverse up to its rounding: fp32 tensors by name."""
    weights = {}
    for name, tensor in stored.items():
        if name.endswith(SCALE):
            continue
        scale = stored.get(name + SCALE)
        weights[name] = (tensor.float() if scale is None else
                         (_rows(tensor.float()) * scale[:, None]).reshape(tensor.shape))
    return weights


def save_bundle(folder: str | Path, model, *, transform: Transform, labels: list[str], extra: dict | None = None,
                dtype: torch.dtype = torch.float16) -> None:
    """`model` into `folder` (config.json + model.safetensors), floats as `dtype`: fp16, fp32, or int8 (`quantize`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "family": family_of(model), "model": model.config.to_dict(),
              "preprocess": transform.to_dict(), "labels": list(labels), **(extra or {}),
              **({"weights": INT8} if dtype == torch.int8 else {})}
    weights = {k: v.contiguous().cpu() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    weights = ({k: v.contiguous() for k, v in quantize(weights).items()} if dtype == torch.int8 else
               {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()})
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
    stored = load_file(Path(folder) / WEIGHTS_FILE)
    weights = (dequantize(stored) if config.get("weights") == INT8 else
               {k: v.float() if v.is_floating_point() else v for k, v in stored.items()})
    load_weights(model, weights)
    for name, buffer in model.named_buffers():
        if name.endswith("num_batches_tracked"):   # not stored (see save_bundle); unused in eval
            buffer.zero_()
    return model.eval(), Transform(**config["preprocess"]), config["labels"], config


def copy_bundle(source: str | Path, folder: str | Path, *, dtype: torch.dtype = torch.int8) -> None:
    """The bundle in `source` written again into `folder` with its floats as `dtype` (a run's fp16 steps to int8)."""
    model, transform, labels, config = load_bundle(source)
    own = {"format", "family", "model", "preprocess", "labels", "weights"}
    save_bundle(folder, model, transform=transform, labels=labels, dtype=dtype,
                extra={k: v for k, v in config.items() if k not in own})


def step_folder(out: str | Path, step: int) -> Path:
    """Where `--save-steps` keeps the model after `step` optimiser steps: OUT/steps/step-<step>/."""
    return Path(out) / STEPS / f"step-{step}"


def saved_steps(folder: str | Path) -> list[int]:
    """The steps a checkpoint folder keeps along its training (OUT/steps/step-<N>/ with its weights), in order."""
    found = (Path(folder) / STEPS).glob("step-*")
    return sorted(int(p.name[5:]) for p in found if p.name[5:].isdigit() and (p / WEIGHTS_FILE).is_file())
