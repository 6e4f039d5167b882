"""Our ViT, CvT, Swin, ResNet and ConvNeXt, and the trace they return. Imports nothing from the rest of vitviz."""
import torch
from torch import Tensor, nn

from .convnext import ConvNeXt, ConvNeXtConfig
from .cvt import CvT, CvTConfig, CvTStageConfig, convert_transformers_state_dict
from .resnet import ResNet, ResNetConfig
from .swin import Swin, SwinConfig
from .trace import BlockTrace, Embedding, Trace, Window, WindowPartition
from .vit import ViT, ViTConfig

FAMILIES = {"vit": (ViT, ViTConfig), "cvt": (CvT, CvTConfig), "swin": (Swin, SwinConfig),
            "resnet": (ResNet, ResNetConfig), "convnext": (ConvNeXt, ConvNeXtConfig)}


def build(family: str, config: dict) -> nn.Module:
    """A fresh model of `family` (a key of FAMILIES) from its config as a dict (config.json's form)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: expected one of {sorted(FAMILIES)}")
    model_cls, config_cls = FAMILIES[family]
    return model_cls(config_cls(**config))


def family_of(model: nn.Module) -> str:
    """The family (a key of FAMILIES) a model of vitviz's belongs to."""
    return next(name for name, (model_cls, _) in FAMILIES.items() if isinstance(model, model_cls))


def family_of_config(config) -> str:
    """The family (a key of FAMILIES) a model configuration belongs to."""
    return next(name for name, (_, config_cls) in FAMILIES.items() if isinstance(config, config_cls))


def num_params(model: nn.Module) -> int:
    """How many parameters a model has, every tensor counted."""
    return sum(p.numel() for p in model.parameters())


def allocate(model: nn.Module, device: torch.device | str) -> nn.Module:
    """A model built on the meta device, with uninitialised tensors of the same shapes on `device`: what
    `to_empty` does, without its `empty_like` of meta tensors, whose first call goes through torch's Python
    references and imports sympy (0.6 s of the first load after a start)."""
    return model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


def load_weights(model: nn.Module, state_dict: dict[str, Tensor]) -> None:
    """Strict load that tolerates only BatchNorm's `num_batches_tracked` counters, and says what is off."""
    try:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
    except RuntimeError as e:   # shape mismatches
        raise ValueError(f"weights do not fit the model's configuration: {str(e).splitlines()[-1].strip()}") from None
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    unexpected = [k for k in unexpected if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}{'...' * (len(missing) > 5)}, "
                         f"unexpected {unexpected[:5]}{'...' * (len(unexpected) > 5)}")


__all__ = ["BlockTrace", "ConvNeXt", "ConvNeXtConfig", "CvT", "CvTConfig", "CvTStageConfig", "Embedding", "ResNet",
           "ResNetConfig", "Swin", "SwinConfig", "Trace", "ViT", "ViTConfig", "Window", "WindowPartition", "allocate",
           "build", "family_of", "family_of_config", "num_params", "convert_transformers_state_dict", "load_weights"]
