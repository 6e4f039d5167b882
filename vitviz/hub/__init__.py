"""`load(source)`: a catalog name, a Hub repo id or a local folder -> a ready model with its own
preprocessing and labels, or a `LoadError` that says why in plain words.

Hub files come through huggingface_hub's `hf_hub_download` and its standard cache (shared with
every other HF tool; nothing is downloaded twice). Before any download one metadata request, with
a deadline of `HUB_TIMEOUT` seconds and no retries, asks the Hub which commit the revision is. If
the Hub can't be reached (`HF_HUB_OFFLINE=1`, no network, DNS failure, timeout, HTTP 5xx) only the
cache answers, so an offline machine hears so within that deadline rather than after
huggingface_hub's own retries. Files of one load come from that one commit.

These layouts are read, one module each, none by running code from the checkpoint: timm's
(`architecture` + `pretrained_cfg`: `timm_vit`, `timm_swin`, `timm_resnet`, `timm_convnext`, picked by
`timm_layout`), transformers' CvT, Swin, ResNet and ConvNeXt (`model_type`: `transformers_cvt`, ...),
CLIP in open_clip's layout (`openclip`: `open_clip_config.json`, read first wherever config.json names a
CLIP model or is absent, as only open_clip's files have the text tower) and in transformers'
(`transformers_clip`), and vitviz's own bundles (`own`). Sources (`sources`), files and their integrity
(`files`) and the cache of loaded models (`cache`) have modules of their own, so a new family adds a
reader and grows none of them.

Weights come from `model.safetensors` (open_clip: `open_clip_model.safetensors`), else from
`pytorch_model.bin` (`open_clip_pytorch_model.bin`) through `torch.load(weights_only=True)`, which
refuses pickled code; keys must match exactly. A fresh download is checked against the
SHA-256 the Hub named it by, and a damaged file is removed from the cache so a retry fetches it
again. Loaded models stay in a small in-process LRU cache bounded by count and bytes.

Models without a classifier (timm's `num_classes=0`: DINO, DINOv2) load like any other, with no
labels. A CLIP model loads as one too (its image tower), with `takes_prompts`: `with_prompts` makes it
a zero-shot classifier over texts. `size` runs a model at another input size: the checkpoint's own
resize and crop rule at that size, the weights shared with the model at its own size (a ViT
resamples its position embeddings as timm's `dynamic_img_size` does).
"""
from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import torch

from . import (
    openclip,
    own,
    timm_layout,
    transformers_clip,
    transformers_convnext,
    transformers_cvt,
    transformers_resnet,
    transformers_swin,
)
from .cache import CACHE, ModelCache, clear_cache
from .files import CONFIG, OPEN_CLIP_CONFIG, FolderFiles, HubFiles, cached_files, cached_models, resolve_commit
from .layout import unsupported
from .loaded import SIZES, LoadedModel, LoadError, ProgressFn, Source
from .sources import Request, parse_source

# transformers' layouts by config.json's model_type
TRANSFORMERS: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (transformers_cvt, transformers_swin,
                                                                  transformers_resnet, transformers_convnext)}
# transformers model types with windowed attention other than Swin's, named when refused
OTHER_WINDOWED = {"swinv2": "SwinV2 (scaled cosine attention, log-spaced position bias)", "donut-swin": "Donut's Swin",
                  "maskformer-swin": "MaskFormer's Swin", "nat": "Neighborhood Attention (NAT)",
                  "dinat": "Dilated Neighborhood Attention (DiNAT)", "focalnet": "FocalNet"}


def load(source: str, *, device: str | torch.device | None = None, progress: ProgressFn | None = None,
         allow_local: bool = True, size: int | None = None) -> LoadedModel:
    """A catalog name, Hub repo id (`owner/name[@revision]`) or local folder -> `LoadedModel`.

    `device` defaults to CUDA when there is one. `progress(fraction, description)` hears download
    progress. `allow_local=False` refuses folders (the app passes it for text a user typed).
    `size`: the input size (px, square) to run it at; default the catalog's size for a catalog name
    (DINOv2: 224), else the checkpoint's own.
    Raises `LoadError` for anything a person can fix or should know; nothing half-done is kept.
    """
    request = parse_source(source, allow_local=allow_local)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoadError("This machine has no CUDA device: load the model with device='cpu'.")
    key = (*request.key(), str(device))
    with CACHE.loading(key):
        loaded = CACHE.get(key)
        if loaded is None:
            loaded = _load(request, device, progress)
            CACHE.put(key, loaded)
    loaded = loaded if loaded.name == request.name else replace(loaded, name=request.name)
    size = size if size is not None else request.size
    return loaded if size is None else loaded.at_size(size)



def _load(request: Request, device: torch.device, progress: ProgressFn | None) -> LoadedModel:
    files = FolderFiles(request.name, request.folder) if request.folder else \
        HubFiles(request.name, request.repo_id, request.revision, progress)
    config = files.json(CONFIG, optional=request.folder is not None)   # a folder may hold open_clip's files alone
    if openclip.may_have(config):   # open_clip's files first: only they have the text tower
        open_clip_config = files.json(OPEN_CLIP_CONFIG, optional=config is not None)
        if open_clip_config is not None:
            return openclip.read(files, open_clip_config, device)
    model_type = config.get("model_type")
    if model_type == transformers_clip.MODEL_TYPE:
        return transformers_clip.read(files, config, device)
    if own.matches(config):
        return own.read(files, config, device)
    if timm_layout.matches(config):
        return timm_layout.read(files, config, device)
    if model_type in TRANSFORMERS:
        return TRANSFORMERS[model_type].read(files, config, device)
    what = model_type or ", ".join(config.get("architectures") or []) or "an unknown layout"
    raise unsupported(files.name, f"a {OTHER_WINDOWED.get(model_type, what)} checkpoint")


def available(source: str) -> bool:
    """Whether `load(source)` can get its files now: a bundled model, files in the HF cache, or a Hub that
    answers for it (one metadata request, within HUB_TIMEOUT). Never raises; folders count only if bundled."""
    try:
        request = parse_source(source, allow_local=False)
        if request.folder is not None or cached_files(request.repo_id, request.revision):
            return True
        return resolve_commit(request.repo_id, request.revision, request.name)[0] is not None
    except LoadError:
        return False




__all__ = ["CACHE", "SIZES", "LoadError", "LoadedModel", "ModelCache", "ProgressFn", "Request", "Source", "available",
           "cached_models", "clear_cache", "load", "parse_source"]
