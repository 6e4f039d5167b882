"""timm's Hub layout (`save_for_hf`): config.json with `architecture`, `model_args` and `pretrained_cfg`, and
the model's state dict. timm builds its own model from config.json on the meta device (no weights, no
memory); one reader per family (`timm_vit`, `timm_swin`, `timm_resnet`, `timm_convnext`) reads vitviz's
config off it, and refuses in words what vitviz's model of that family does not have.
"""
from __future__ import annotations

import functools
from types import ModuleType

import torch

from ..preprocess import Transform
from . import timm_convnext, timm_resnet, timm_swin, timm_vit
from .files import CONFIG, Files
from .layout import build, label_list, numbered, unsupported
from .loaded import LoadedModel, LoadError

READERS: tuple[ModuleType, ...] = (timm_vit, timm_swin, timm_resnet, timm_convnext)
# timm designs with windowed attention other than Swin's, named when refused
OTHER_WINDOWED = {"timm.models.swin_transformer_v2": "SwinV2 (scaled cosine attention, log-spaced position bias)",
                  "timm.models.swin_transformer_v2_cr": "SwinV2-CR", "timm.models.maxxvit": "MaxViT / CoAtNet",
                  "timm.models.davit": "DaViT", "timm.models.focalnet": "FocalNet",
                  "timm.models.swin_transformer_v1_cr": "Swin-CR", "timm.models.nest": "NesT",
                  "timm.models.twins": "Twins", "timm.models.cswin": "CSWin", "timm.models.hiera": "Hiera"}


def matches(config: dict) -> bool:
    """Whether a config.json is in timm's layout (it names an `architecture`)."""
    return "architecture" in config


def read(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """A timm checkpoint as a `LoadedModel`: timm reads its config (on the meta device: no weights), the
    reader of its family builds vitviz's model, the labels come from its pretrained_cfg or ImageNet's;
    `LoadError` for an architecture no reader takes."""
    import timm  # timm is only needed for timm checkpoints, and takes seconds to import
    from timm.data import ImageNetInfo, infer_imagenet_subset

    arch = config["architecture"]
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise LoadError(f"{files.name!r} names a timm architecture {arch!r} that timm {timm.__version__} "
                        f"does not have.")
    module = timm.models.model_entrypoint(arch).__module__
    reader = next((r for r in READERS if module in r.MODULES), None)
    if reader is None:
        kind = f"a timm {arch}" + (f", a {OTHER_WINDOWED[module]} model" if module in OTHER_WINDOWED else "")
        raise unsupported(files.name, kind)
    try:
        with torch.device("meta"):   # timm reads its own config.json (model_args and all); no memory, no weights
            reference = timm.create_model(f"local-dir:{files.folder}", pretrained=False)
    except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: timm cannot build {arch} from its {CONFIG} ({e}).") from None
    model_config = reader.config_of(reference, files.name)
    try:
        transform = Transform.from_timm(reference.pretrained_cfg)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its preprocessing is not supported ({e}).") from None
    # timm's own rule at another size: the same crop_pct, resize floor(size / crop_pct)
    transform_at = functools.partial(_transform_at, dict(reference.pretrained_cfg))
    cfg, n = reference.pretrained_cfg, model_config.num_classes
    labels = label_list(cfg.get("label_names"), n, describe=cfg.get("label_descriptions") or {})
    if labels is None and (subset := infer_imagenet_subset(cfg)) is not None:
        info = ImageNetInfo(subset)
        labels = tuple(info.label_descriptions()) if info.num_classes() == n else None
    weights, weights_file = files.weights()
    model = build(reader.MODEL, model_config, reader.converted(weights), device, files, weights_file)
    return LoadedModel(files.name, model, reader.FAMILY, labels or numbered(n), transform,
                       files.source("timm", weights_file), transform_at)


def _transform_at(pretrained_cfg: dict, size: int) -> Transform:
    return Transform.from_timm({**pretrained_cfg, "input_size": (3, size, size)})
