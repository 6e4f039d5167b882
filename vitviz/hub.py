"""`load(source)`: a catalog name, a Hub repo id or a local folder -> a ready model with its own
preprocessing and labels, or a `LoadError` that says why in plain words.

Hub files come through huggingface_hub's `hf_hub_download` and its standard cache (shared with
every other HF tool; nothing is downloaded twice). Before any download one metadata request, with
a deadline of `HUB_TIMEOUT` seconds and no retries, asks the Hub which commit the revision is. If
the Hub can't be reached (`HF_HUB_OFFLINE=1`, no network, DNS failure, timeout, HTTP 5xx) only the
cache answers, so an offline machine hears so within that deadline rather than after
huggingface_hub's own retries. Files of one load come from that one commit.

These layouts are read, none by running code from the checkpoint: timm's (`architecture` +
`pretrained_cfg`), transformers' CvT (`model_type: "cvt"`), CLIP in open_clip's layout
(`open_clip_config.json`, read first wherever config.json names a CLIP model or is absent: only
open_clip's files have the text tower) and in transformers' (`model_type: "clip"`), and vitviz's own
bundles. Weights come from `model.safetensors` (open_clip: `open_clip_model.safetensors`), else from
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

import difflib
import functools
import hashlib
import json
import math
import os
import pickle
import re
import threading
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn
from tqdm import tqdm

from . import catalog
from .bundle import FORMAT as BUNDLE_FORMAT, load_bundle
from .models import FAMILIES, CvTConfig, ViTConfig, convert_transformers_state_dict, load_weights
from .models.clip import CLIP, CLIPConfig, convert_open_clip_state_dict
from .models.clip import convert_transformers_state_dict as convert_transformers_clip
from .models.vit import LN_EPS as VIT_LN_EPS
from .preprocess import IMAGENET_MEAN, IMAGENET_STD, Tokenizer, Transform

CONFIG, SAFETENSORS, PICKLED, CVT_PROCESSOR = ("config.json", "model.safetensors", "pytorch_model.bin",
                                               "preprocessor_config.json")
# open_clip's Hub layout (`push_to_hf_hub`); timm's CLIP repos ship it beside their own config.json
OPEN_CLIP_CONFIG, OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED = ("open_clip_config.json", "open_clip_model.safetensors",
                                                              "open_clip_pytorch_model.bin")
CLIP_VOCAB, CLIP_MERGES = "vocab.json", "merges.txt"   # transformers' CLIPTokenizer files
HUB_TIMEOUT = 2.5   # seconds the Hub has to answer the first metadata request of a load
SIZES = (32, 1024)  # input sizes (px, square) `load` accepts; a ViT-S/14's attention at 1024 px is ~8 GB
# CvT's own evaluation preprocessing (the paper, Microsoft's code), for a CvT repo that has no
# preprocessor_config.json: transformers' processor defaults (384 px, mean/std 0.5) would be wrong
CVT_EVAL_PROCESSOR = {"size": {"shortest_edge": 224}, "crop_pct": 224 / 256, "resample": int(Image.BICUBIC),
                      "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD}
# only whether a timm ViT has LayerScale shows in its modules; the checkpoint's gammas replace this value
LAYER_SCALE_PRESENT = 1e-5

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"   # the Hub's owner and name rules
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")   # branch, tag, refs/pr/N or commit
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

ProgressFn = Callable[[float, str], None]   # (fraction done, what is being done)


class LoadError(ValueError):
    """A model that can't be loaded: the message names it, says why in plain words and what to do."""


@dataclass(frozen=True)
class Source:
    """Where a loaded model's files came from: enough to fetch exactly the same ones again."""

    kind: str                    # 'hub' or 'folder'
    location: str                # the repo id, or the folder's absolute path
    layout: str                  # 'timm', 'transformers' or 'vitviz'
    weights: str                 # the weights file that was read
    revision: str | None = None  # asked for (hub)
    commit: str | None = None    # what the revision was when loaded (hub)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    name: str                    # as asked for: catalog name, repo id or folder name
    model: nn.Module | None      # our ViT or CvT, eval mode: model(pixels) -> logits; None in a `card`
    family: str                  # 'vit' or 'cvt'
    labels: tuple[str, ...]      # class names in logit order
    transform: Transform         # the checkpoint's own preprocessing
    source: Source
    # the checkpoint's preprocessing at another input size; None: the crop keeps its share of the resized image
    transform_at: Callable[[int], Transform] | None = None
    takes_prompts: bool = False  # a CLIP model: `with_prompts` makes it a classifier over texts
    clip: CLIP | None = None     # a CLIP model's two towers (`model` is its image tower); None in a `card`
    tokenizer: Tokenizer | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def has_classifier(self) -> bool:
        """False for a model without a classifier (DINO, DINOv2): no labels, no predictions."""
        return bool(self.labels)

    @property
    def size(self) -> int:
        """The input size (px, square) it runs at."""
        return self.transform.crop[0]

    def at_size(self, size: int) -> LoadedModel:
        """The same model, weights shared, fed `size` x `size` pixels by the checkpoint's own resize and crop rule."""
        if not isinstance(size, int) or isinstance(size, bool) or not SIZES[0] <= size <= SIZES[1]:
            raise LoadError(f"The input size must be a whole number of pixels from {SIZES[0]} to {SIZES[1]}, "
                            f"not {size!r}.")
        if size == self.size:
            return self
        return replace(self, transform=(self.transform_at or functools.partial(_same_crop_share, self.transform))(size))

    @property
    def nbytes(self) -> int:
        module = self.model if self.clip is None else self.clip
        return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])

    def preprocess(self, image: Image.Image) -> Tensor:
        """A PIL image -> 1 3 h w pixel batch on the model's device, as the checkpoint expects it."""
        return self.transform(image).to(self.device)

    def source_info(self) -> dict:
        """`source` as plain data, for manifests."""
        return asdict(self.source)

    def card(self) -> LoadedModel:
        """The same without its weights (`model` None): names, labels, preprocessing and source, plain data
        to send to another process (the app's, when the model runs in a GPU worker)."""
        return replace(self, model=None, clip=None)

    # ---- CLIP: prompts make a classifier -------------------------------------------------------------

    def with_prompts(self, prompts: Sequence[str], *, labels: Sequence[str] | None = None) -> LoadedModel:
        """This CLIP model as a zero-shot classifier over `prompts`: its logits are exp(logit_scale) cos(image
        features, text features), open_clip's `logits_per_image`; the weights are shared. Its labels are the
        prompts, or `labels` (one per prompt: the words a template was filled with, a data set's class names).
        `preprocess.prompts_from_text` makes prompts from what a person types. A `card` gets the labels alone."""
        prompts = self._checked_texts(prompts)
        labels = tuple(prompts if labels is None else labels)
        if len(labels) != len(prompts) or not all(isinstance(label, str) for label in labels):
            raise LoadError(f"Give one label (text) per prompt: {len(labels)} for {len(prompts)} prompts.")
        if self.model is None and self.takes_prompts:   # a card: what the prompted model is called, no weights
            return replace(self, labels=labels)
        with torch.inference_mode():
            text = self.text_features(prompts)
        return replace(self, model=self._clip().zero_shot(text.clone()), labels=labels)

    def tokenize(self, texts: Sequence[str]) -> Tensor:
        """Texts -> b context_length token ids on the model's device (open_clip's tokenizer)."""
        texts = self._checked_texts(texts)
        self._clip()   # a card has no weights to read the ids
        return self.tokenizer(texts).to(self.device)

    def text_features(self, texts: Sequence[str]) -> Tensor:
        """Texts -> b embed_dim, unnormalised (open_clip's `encode_text`)."""
        return self._clip().text_features(self.tokenize(texts))

    def image_features(self, pixels: Tensor) -> Tensor:
        """b 3 h w pixels (`preprocess`) -> b embed_dim, unnormalised (open_clip's `encode_image`)."""
        return self._clip().image_features(pixels)

    def _checked_texts(self, texts) -> list[str]:
        """`texts` as a list, if this model takes prompts and they are a non-empty list of non-empty texts."""
        if not self.takes_prompts:
            raise LoadError(f"{self.name!r} is not a CLIP model, so it takes no text prompts.")
        if isinstance(texts, str) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise LoadError(f"Prompts are a non-empty list of non-empty texts, not {str(texts)[:80]!r}.")
        return list(texts)

    def _clip(self) -> CLIP:
        if self.clip is None:
            raise LoadError(f"{self.name!r} is a card without weights: load it to use prompts." if self.takes_prompts
                            else f"{self.name!r} is not a CLIP model, so it takes no text prompts.")
        return self.clip


# ---- what a source names, decided before any request ------------------------------------------------

@dataclass(frozen=True)
class Request:
    name: str
    repo_id: str | None = None
    revision: str = "main"
    folder: Path | None = None
    size: int | None = None   # the catalog's input size for it (None: the checkpoint's own)

    def key(self) -> tuple:
        if self.folder is None:
            return ("hub", self.repo_id, self.revision)
        # a folder trained again in place is a different model
        files = [self.folder / f for f in (CONFIG, SAFETENSORS, PICKLED, CVT_PROCESSOR, OPEN_CLIP_CONFIG,
                                           OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED)]
        return ("folder", str(self.folder), *(p.stat().st_mtime_ns if p.is_file() else None for p in files))


def parse_source(source: str, *, allow_local: bool = True) -> Request:
    """What `source` names: a catalog entry, a local folder (if allowed) or a Hub repo id.

    Only the text is looked at (and the disk for folders), so a bad id never reaches the network.
    """
    if not isinstance(source, str) or not source.strip():
        raise LoadError(f"No model named. {_what_loads()}")
    text = source.strip()
    entry = catalog.CATALOG.get(text)
    if entry is not None and entry.bundled:
        if not (entry.path / CONFIG).is_file():
            raise LoadError(f"The bundled model {text!r} is missing: {entry.path} has no {CONFIG} "
                            f"(checkpoints/README.md says how it is trained).")
        return Request(name=text, folder=entry.path)
    if entry is not None:
        return Request(name=text, repo_id=entry.source, size=entry.size)
    if allow_local and (text.startswith(("/", ".", "~")) or Path(text).expanduser().is_dir()):
        folder = Path(text).expanduser().resolve()
        if not any((folder / f).is_file() for f in (CONFIG, OPEN_CLIP_CONFIG)):
            raise LoadError(f"{folder} is not a model folder: it has no {CONFIG} (nor open_clip's {OPEN_CLIP_CONFIG}).")
        return Request(name=folder.name, folder=folder)
    repo_id, at, revision = text.partition("@")
    problem = _repo_id_problem(repo_id, allow_local) or (_revision_problem(revision) if at else None)
    if problem:
        raise LoadError(f"{text[:120]!r} is not a model vitviz can load: {problem}. {_what_loads()}")
    return Request(name=text, repo_id=repo_id, revision=revision or "main")


def _repo_id_problem(repo_id: str, allow_local: bool) -> str | None:
    if "://" in repo_id or repo_id.lower().startswith(("www.", "huggingface.co/", "hf.co/")):
        return "web addresses are not accepted, give the repo id (owner/name) instead"
    if repo_id.startswith(("/", ".", "~")) or "\\" in repo_id or ".." in repo_id:
        return "that is a file path" + ("" if allow_local else ", and local folders are not accepted here")
    if _REPO_ID.fullmatch(repo_id) and "--" not in repo_id:
        return None
    if "/" not in repo_id:
        close = difflib.get_close_matches(repo_id, catalog.CATALOG, n=1)
        return "not a catalog name" + (f" (did you mean {close[0]!r}?)" if close else "")
    return "a Hub repo id is owner/name, each up to 96 letters, digits, '-', '_' or '.'"


def _revision_problem(revision: str) -> str | None:
    if _REVISION.fullmatch(revision) and ".." not in revision and "//" not in revision and not revision.endswith("/"):
        return None
    return "after '@' comes a branch, tag or commit, e.g. '@main'"


def _what_loads() -> str:
    return (f"Use a catalog name ({', '.join(catalog.CATALOG)}) or a Hub repo id such as "
            f"'timm/deit_small_patch16_224.fb_in1k' or 'microsoft/cvt-13'.")


def _offline_hint() -> str:
    cached = [name for name in cached_models() if not catalog.CATALOG[name].bundled]
    return ((f"Cached models: {', '.join(cached)}. " if cached else "")
            + f"Bundled models work offline: {', '.join(e.name for e in catalog.bundled())}.")


# ---- the in-process cache of loaded models -------------------------------------------------------------

class ModelCache:
    """Loaded models by (request, device), least recently used first, bounded by count and bytes.

    Loads of the same key wait for each other (one download, one copy in memory); different keys don't.
    A model dropped from the cache but still held elsewhere (by a session the app keeps) is handed out
    again instead of being loaded a second time beside it.
    """

    def __init__(self, *, max_models: int, max_bytes: int):
        self.max_models, self.max_bytes = max_models, max_bytes
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self._alive: weakref.WeakValueDictionary[tuple, LoadedModel] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._loading: dict[tuple, list] = {}   # key -> [lock, number of loads holding or waiting for it]

    def get(self, key: tuple) -> LoadedModel | None:
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            loaded = self._alive.get(key)
        if loaded is not None:
            self.put(key, loaded)
        return loaded

    def put(self, key: tuple, loaded: LoadedModel) -> None:
        """Keep `loaded`, dropping the least recently used; a model above `max_bytes` alone isn't kept."""
        with self._lock:
            self._alive[key] = loaded
            if loaded.nbytes <= self.max_bytes:
                self._models[key] = loaded
            while self._models and (len(self._models) > self.max_models or self._nbytes() > self.max_bytes):
                self._models.popitem(last=False)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes()

    def _nbytes(self) -> int:
        return sum(m.nbytes for m in self._models.values())

    def names(self) -> list[str]:
        with self._lock:
            return [m.name for m in self._models.values()]

    def clear(self) -> None:
        with self._lock:
            self._models.clear()
            self._alive.clear()

    @contextmanager
    def loading(self, key: tuple):
        with self._lock:
            entry = self._loading.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._loading[key]


# server owners size it to their memory: VITVIZ_CACHE_MODELS (count), VITVIZ_CACHE_GB (weights, GiB)
CACHE = ModelCache(max_models=int(os.environ.get("VITVIZ_CACHE_MODELS", 4)),
                   max_bytes=int(float(os.environ.get("VITVIZ_CACHE_GB", 3)) * 2**30))


def clear_cache() -> None:
    """Forget every loaded model (the next `load` reads files again; the HF cache is untouched)."""
    CACHE.clear()


# ---- load ---------------------------------------------------------------------------------------------

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
    files = FolderFiles(request) if request.folder else HubFiles(request, progress)
    config = files.json(CONFIG, optional=request.folder is not None)   # a folder may hold open_clip's files alone
    # open_clip's files first: only they have the text tower (timm's CLIP repos ship both layouts); asked for
    # only where config.json says CLIP, so other loads make no extra request
    if config is None or config.get("model_type") == "clip" or "clip" in str(config.get("architecture", "")):
        open_clip = files.json(OPEN_CLIP_CONFIG, optional=config is not None)
        if open_clip is not None:
            return _from_open_clip(files, open_clip, device)
    if config.get("model_type") == "clip":
        return _from_transformers_clip(files, config, device)
    if config.get("format") == BUNDLE_FORMAT:
        return _from_bundle(files, config, device)
    if "architecture" in config:
        return _from_timm(files, config, device)
    if config.get("model_type") == "cvt":
        return _from_transformers_cvt(files, config, device)
    what = config.get("model_type") or ", ".join(config.get("architectures") or []) or "an unknown layout"
    raise _unsupported(files.name, f"a {what} checkpoint")


def _unsupported(name: str, what: str) -> LoadError:
    return LoadError(f"{name!r} is {what}; vitviz runs ViT and DeiT checkpoints from timm, CvT checkpoints "
                     f"from transformers, CLIP ViTs from open_clip ({OPEN_CLIP_CONFIG}) or transformers (CLIPModel) "
                     f"and its own bundled models.")


def _from_bundle(files: Files, config: dict, device: torch.device) -> LoadedModel:
    weights = files.get(SAFETENSORS)
    try:
        model, transform, labels, _ = load_bundle(weights.parent)
    except SafetensorError as e:
        raise files.damaged(weights, e) from None
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its vitviz {CONFIG} and weights do not fit together ({e}).") from None
    return LoadedModel(files.name, model.to(device), config["family"], tuple(labels), transform,
                       files.source("vitviz", SAFETENSORS))


def _from_open_clip(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """open_clip's layout: open_clip_config.json (`model_cfg`, `preprocess_cfg`) and its weights."""
    model_cfg = config.get("model_cfg", config)
    if "quick_gelu" not in model_cfg and isinstance(files, HubFiles):
        model_cfg = {**model_cfg, "quick_gelu": _open_clip_registry_quick_gelu(files.repo_id)}
    try:
        clip_config = CLIPConfig.from_open_clip(model_cfg)
    except (TypeError, ValueError) as e:
        raise _unsupported(files.name, f"an open_clip model vitviz cannot build ({e})") from None
    size = clip_config.vision.img_size
    try:
        if size[0] != size[1]:
            raise ValueError(f"a {size[0]}x{size[1]} input is not square")
        transform = Transform.from_open_clip(config.get("preprocess_cfg") or {}, size[0])
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its preprocessing is not supported ({e}).") from None
    weights, weights_file = files.weights(OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED)
    clip = _build("clip", clip_config, convert_open_clip_state_dict(weights), device, files, weights_file,
                  config_file=OPEN_CLIP_CONFIG)
    return _clip_model(files, clip, transform, "open_clip", weights_file)


def _open_clip_registry_quick_gelu(repo_id: str) -> bool:
    """Whether open_clip's pretrained registry trains the weights in `repo_id` with QuickGELU (OpenAI's, as
    `create_model('ViT-B-16', pretrained='openai')` reads it), for an open_clip_config.json that does not say."""
    import open_clip

    tags = [open_clip.get_pretrained_cfg(*pair) for pair in open_clip.list_pretrained()]
    return any(tag.get("hf_hub", "").rstrip("/") == repo_id and tag.get("quick_gelu", False) for tag in tags)


def _from_transformers_clip(files: Files, config: dict, device: torch.device) -> LoadedModel:
    """transformers' `CLIPModel` layout: config.json, preprocessor_config.json, its tokenizer's vocab.json and
    merges.txt (checked to be CLIP's, which open_clip's tokenizer then reproduces), model.safetensors."""
    try:
        clip_config = CLIPConfig.from_transformers(config)
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its CLIP {CONFIG} is not one vitviz can build ({e!r}).") from None
    try:
        transform = Transform.from_clip_processor(files.json(CVT_PROCESSOR, optional=True) or {})
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its {CVT_PROCESSOR} is not supported ({e}).") from None
    merges = [line for line in files.get(CLIP_MERGES).read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    if not Tokenizer(clip_config.text.context_length).has_vocabulary(files.json(CLIP_VOCAB), merges):
        raise LoadError(f"{files.name!r}: its tokenizer ({CLIP_VOCAB}, {CLIP_MERGES}) is not CLIP's byte-pair "
                        f"vocabulary, the one vitviz tokenizes with.")
    weights, weights_file = files.weights()
    clip = _build("clip", clip_config, convert_transformers_clip(weights), device, files, weights_file)
    return _clip_model(files, clip, transform, "transformers", weights_file)


def _clip_model(files: Files, clip: CLIP, transform: Transform, layout: str, weights_file: str) -> LoadedModel:
    """A CLIP model before any prompt: its image tower, without a classifier (like DINO) until `with_prompts`."""
    return LoadedModel(files.name, clip.visual, "vit", (), transform, files.source(layout, weights_file),
                       takes_prompts=True, clip=clip, tokenizer=Tokenizer(clip.config.text.context_length))


def _from_timm(files: Files, config: dict, device: torch.device) -> LoadedModel:
    import timm   # timm is only needed for timm checkpoints, and takes seconds to import
    from timm.data import ImageNetInfo, infer_imagenet_subset

    arch = config["architecture"]
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise LoadError(f"{files.name!r} names a timm architecture {arch!r} that timm {timm.__version__} "
                        f"does not have.")
    if timm.models.model_entrypoint(arch).__module__ not in ("timm.models.vision_transformer", "timm.models.deit"):
        raise _unsupported(files.name, f"a timm {arch}")
    try:
        with torch.device("meta"):   # timm reads its own config.json (model_args and all); no memory, no weights
            reference = timm.create_model(f"local-dir:{files.folder}", pretrained=False)
    except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: timm cannot build {arch} from its {CONFIG} ({e}).") from None
    vit_config = _vit_config(reference, files.name)
    try:
        transform = Transform.from_timm(reference.pretrained_cfg)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its preprocessing is not supported ({e}).") from None
    # timm's own rule at another size: the same crop_pct, resize floor(size / crop_pct)
    transform_at = functools.partial(_timm_transform_at, dict(reference.pretrained_cfg))
    cfg, n = reference.pretrained_cfg, vit_config.num_classes
    labels = _label_list(cfg.get("label_names"), n, describe=cfg.get("label_descriptions") or {})
    if labels is None and (subset := infer_imagenet_subset(cfg)) is not None:
        info = ImageNetInfo(subset)
        labels = tuple(info.label_descriptions()) if info.num_classes() == n else None
    weights, weights_file = files.weights()
    return LoadedModel(files.name, _build("vit", vit_config, weights, device, files, weights_file), "vit",
                       labels or _numbered(n), transform, files.source("timm", weights_file), transform_at)


def _timm_transform_at(pretrained_cfg: dict, size: int) -> Transform:
    return Transform.from_timm({**pretrained_cfg, "input_size": (3, size, size)})


def _cvt_transform_at(processor: dict, size: int) -> Transform:
    return Transform.from_cvt_processor({**processor, "size": {"shortest_edge": size}})


def _same_crop_share(transform: Transform, size: int) -> Transform:
    """`transform` at another size, the crop keeping its share of the resized image (vitviz's bundles)."""
    resize = transform.resize
    scaled = (size, size) if isinstance(resize, tuple) else math.floor(resize * size / transform.crop[0])
    return replace(transform, crop=(size, size), resize=scaled)


def _vit_config(reference: nn.Module, name: str) -> ViTConfig:
    """Our ViTConfig for timm's model, or a LoadError naming every part our ViT doesn't have."""
    from timm.layers import LayerScale, Mlp
    from timm.layers.activations import GELU as TimmGELU
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Block, VisionTransformer

    r, blocks = reference, list(getattr(reference, "blocks", []))
    patch = getattr(r, "patch_embed", None)
    proj = getattr(patch, "proj", None)
    checks = {
        f"a {type(r).__name__}": type(r) in (VisionTransformer, VisionTransformerDistilled),
        f"global_pool {getattr(r, 'global_pool', None)!r}": getattr(r, "global_pool", None) in ("token", "avg"),
        "a classifier other than one linear layer": isinstance(getattr(r, "head", None), nn.Linear)
        or (getattr(r, "num_classes", None) == 0 and isinstance(getattr(r, "head", None), nn.Identity)),
        "no learned position embedding": getattr(r, "pos_embed", None) is not None,
        "a patch embedding other than one conv": isinstance(proj, nn.Conv2d) and proj.kernel_size == proj.stride
        and proj.kernel_size[0] == proj.kernel_size[1] and not getattr(patch, "dynamic_img_pad", False),
        "no blocks, or blocks other than timm's plain Block": bool(blocks) and all(type(b) is Block for b in blocks),
        "an MLP other than fc1, exact GELU, fc2": all(type(b.mlp) is Mlp and isinstance(b.mlp.act, (nn.GELU, TimmGELU))
                                                       and getattr(b.mlp.act, "approximate", "none") == "none"
                                                       for b in blocks),
        f"norms other than LayerNorm(eps={VIT_LN_EPS})": all(isinstance(m, nn.LayerNorm) and m.eps == VIT_LN_EPS
                                                             for m in r.modules() if "Norm" in type(m).__name__),
    }
    missing = [what for what, ok in checks.items() if not ok]
    if missing:
        raise _unsupported(name, f"a timm model with {', '.join(missing)}")
    config = ViTConfig(
        img_size=tuple(patch.img_size), patch_size=proj.kernel_size[0], in_chans=proj.in_channels,
        num_classes=r.num_classes, embed_dim=r.embed_dim, depth=len(blocks), num_heads=blocks[0].attn.num_heads,
        mlp_ratio=blocks[0].mlp.fc1.out_features / r.embed_dim, qkv_bias=blocks[0].attn.qkv.bias is not None,
        class_token=r.cls_token is not None, dist_token=isinstance(r, VisionTransformerDistilled),
        reg_tokens=r.num_reg_tokens, no_embed_class=r.no_embed_class, global_pool=r.global_pool,
        fc_norm=not isinstance(r.fc_norm, nn.Identity),
        init_values=LAYER_SCALE_PRESENT if isinstance(blocks[0].ls1, LayerScale) else None)
    # what the module checks can't see (biases, extra norms, token counts) shows in the state dict
    with torch.device("meta"):
        ours = {k: tuple(v.shape) for k, v in FAMILIES["vit"][0](config).state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in r.state_dict().items()}
    if ours != theirs:
        differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        raise _unsupported(name, f"a timm model whose parameters differ from vitviz's ViT at {differ[:4]}")
    return config


def _from_transformers_cvt(files: Files, config: dict, device: torch.device) -> LoadedModel:
    try:
        cvt_config = CvTConfig.from_transformers(config)
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{files.name!r}: its CvT {CONFIG} is not one vitviz can build ({e!r}).") from None
    processor = files.json(CVT_PROCESSOR, optional=True) or CVT_EVAL_PROCESSOR
    try:
        transform = Transform.from_cvt_processor(processor)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: its {CVT_PROCESSOR} is not supported ({e}).") from None
    id2label = {str(k): v for k, v in (config.get("id2label") or {}).items()}
    n = cvt_config.num_classes
    labels = _label_list(id2label, n)
    weights, weights_file = files.weights()
    model = _build("cvt", cvt_config, convert_transformers_state_dict(weights), device, files, weights_file)
    return LoadedModel(files.name, model, "cvt", labels or _numbered(n), transform,
                       files.source("transformers", weights_file), functools.partial(_cvt_transform_at, processor))


def _label_list(names, n: int, *, describe: dict | None = None) -> tuple[str, ...] | None:
    """Class names in index order from a list or an {index: name} dict; None if they don't cover n classes."""
    if isinstance(names, dict):
        names = [names.get(str(i)) for i in range(n)]
    if not isinstance(names, (list, tuple)) or len(names) != n or not all(isinstance(x, str) for x in names):
        return None
    return tuple((describe or {}).get(x, x) for x in names)


def _numbered(n: int) -> tuple[str, ...]:
    return tuple(f"class {i}" for i in range(n))


def _build(family: str, config, weights: dict[str, Tensor], device: torch.device, files: Files,
           weights_file: str, *, config_file: str = CONFIG) -> nn.Module:
    with torch.device("meta"):   # no random init: every value comes from the checkpoint
        model = (CLIP if family == "clip" else FAMILIES[family][0])(config)
    model = model.to_empty(device=device)
    try:
        load_weights(model, weights)
    except ValueError as e:
        raise LoadError(f"{files.name!r}: the tensors in {weights_file} do not fit its {config_file}: {e}.") from None
    for name, buffer in model.named_buffers():
        if name.endswith("num_batches_tracked"):   # not stored by transformers; unused in eval
            buffer.zero_()
    return model.eval()


# ---- where files come from ----------------------------------------------------------------------------

class Files(ABC):
    """The files of one checkpoint, from a folder or the Hub; subclasses say how to get one."""

    name: str
    folder: Path | None   # where config.json is (timm reads it from there)

    @abstractmethod
    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        """The file's local path; None if it is `optional` and absent, else a LoadError."""

    @abstractmethod
    def damaged(self, path: Path, error) -> LoadError:
        """The error for a file that can't be read (and whatever clean-up makes a retry work)."""

    @abstractmethod
    def source(self, layout: str, weights: str) -> Source:
        """Where these files came from."""

    def json(self, filename: str, *, optional: bool = False) -> dict | None:
        path = self.get(filename, optional=optional)
        if path is None:
            return None
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self.damaged(path, f"not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise self.damaged(path, "not a JSON object")
        return value

    def weights(self, safetensors: str = SAFETENSORS, pickled: str = PICKLED) -> tuple[dict[str, Tensor], str]:
        """(state dict, file name): model.safetensors if there is one, else pytorch_model.bin, tensors only
        (open_clip's layout: its own two names)."""
        path = self.get(safetensors, optional=True)
        if path is not None:
            try:
                return load_file(path), safetensors
            except SafetensorError as e:
                raise self.damaged(path, e) from None
        path = self.get(pickled, optional=True)
        if path is None:
            raise LoadError(f"{self.name!r} has neither {safetensors} nor {pickled}.")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # torch's weights-only unpickler stops at the first thing that isn't tensor data; pickled code
            # and plain garbage look the same to it
            raise LoadError(f"{self.name!r}: {pickled} was refused: it is not tensors alone (it holds Python "
                            f"objects or code, or it is damaged), and vitviz never runs code from a checkpoint."
                            ) from None
        except (EOFError, RuntimeError) as e:
            raise self.damaged(path, e) from None
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise LoadError(f"{self.name!r}: {pickled} is not a state dict of tensors.")
        return state, pickled


class FolderFiles(Files):
    def __init__(self, request: Request):
        self.name, self.folder = request.name, request.folder

    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        path = self.folder / filename
        if path.is_file():
            return path
        if optional:
            return None
        raise LoadError(f"{self.folder} has no {filename}.")

    def damaged(self, path: Path, error) -> LoadError:
        return LoadError(f"{path} is damaged ({error}).")   # a person's own files are never deleted

    def source(self, layout: str, weights: str) -> Source:
        return Source("folder", str(self.folder), layout, weights)


class HubFiles(Files):
    def __init__(self, request: Request, progress: ProgressFn | None):
        self.name, self.repo_id, self.revision = request.name, request.repo_id, request.revision
        self.progress = progress
        self.commit, self.offline_reason = _resolve_commit(self.repo_id, self.revision, self.name)
        self.folder = None   # the snapshot folder, known once config.json is here

    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        if self.commit is None:   # the Hub can't be reached: the cache answers alone
            try:
                path = Path(hf_hub_download(self.repo_id, filename, revision=self.revision, local_files_only=True))
            except EntryNotFoundError:
                if optional:
                    return None
                raise LoadError(f"Could not download {self.name!r} ({self.offline_reason}), and it is not in the "
                                f"cache. {_offline_hint()}") from None
        else:
            path = self._download(filename, optional)
            if path is None:
                return None
        if filename in (CONFIG, OPEN_CLIP_CONFIG):
            self.folder = path.parent
        return path

    def _download(self, filename: str, optional: bool) -> Path | None:
        # the configs by the revision's name, so the cache learns where it points (for offline use);
        # the rest by commit, so one load's files always belong together
        revision = self.revision if filename in (CONFIG, OPEN_CLIP_CONFIG) else self.commit
        fresh = not isinstance(try_to_load_from_cache(self.repo_id, filename, revision=self.commit), str)
        bar = _progress_bar(self.progress, f"Downloading {filename} of {self.name}") if self.progress else None
        try:
            path = Path(hf_hub_download(self.repo_id, filename, revision=revision, etag_timeout=HUB_TIMEOUT,
                                        tqdm_class=bar))
        except EntryNotFoundError:
            if optional:
                return None
            raise LoadError(f"{self.name!r} has no {filename}"
                            + (", so it is not a timm or transformers image model." if filename == CONFIG else ".")
                            ) from None
        except (RepositoryNotFoundError, RevisionNotFoundError) as e:   # gone since the first request
            raise LoadError(f"{self.name!r} is no longer on the Hub ({type(e).__name__}).") from None
        except Exception as e:   # HTTP errors, dropped connections: huggingface_hub's client raises its own types
            raise LoadError(f"Downloading {filename} of {self.name!r} failed ({_reason(e)}). Nothing incomplete "
                            f"is used; loading it again resumes the download. {_offline_hint()}") from None
        if fresh and not _matches_its_hash(path):
            raise self.damaged(path, "its SHA-256 is not the one the Hub gave")
        return path

    def damaged(self, path: Path, error) -> LoadError:
        blob = path.resolve()   # the cache keeps a link per snapshot and the file itself as a blob
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        return LoadError(f"{path.name} of {self.name!r} is damaged ({error}); it was removed from the cache, "
                         f"so loading it again downloads a fresh copy.")

    def source(self, layout: str, weights: str) -> Source:
        commit = self.commit or (self.folder.name if _COMMIT.fullmatch(self.folder.name) else None)
        return Source("hub", self.repo_id, layout, weights, self.revision, commit)


def _resolve_commit(repo_id: str, revision: str, name: str) -> tuple[str | None, str | None]:
    """(commit, None) from one metadata request within HUB_TIMEOUT, or (None, why) if the Hub can't be reached.

    A missing repo, revision or config.json is a LoadError right away.
    """
    if is_offline_mode():
        return None, "offline mode: HF_HUB_OFFLINE is set"
    if _COMMIT.fullmatch(revision) and isinstance(try_to_load_from_cache(repo_id, CONFIG, revision=revision), str):
        return revision, None   # a commit's files never change: nothing to ask
    url = hf_hub_url(repo_id, CONFIG, revision=revision)
    try:
        metadata = _within(HUB_TIMEOUT, get_hf_file_metadata, url, timeout=HUB_TIMEOUT)
    except RepositoryNotFoundError:
        raise LoadError(f"{name!r} is not on the Hugging Face Hub (or it is private or gated).") from None
    except RevisionNotFoundError:
        raise LoadError(f"{name!r}: the Hub repo {repo_id} has no revision {revision!r}.") from None
    except EntryNotFoundError:
        raise LoadError(f"{name!r} has no {CONFIG}, so it is not a timm or transformers image model.") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status is not None and status < 500 and status != 429:
            raise LoadError(f"The Hub refused {name!r} (HTTP {status}).") from None
        return None, _reason(e)
    except Exception as e:   # no network, DNS, timeouts: whatever the HTTP client calls them
        return None, _reason(e)
    if not metadata.commit_hash:
        return None, "the endpoint does not answer like the Hugging Face Hub"
    return metadata.commit_hash, None


def _within(seconds: float, fn, *args, **kwargs):
    """fn(...) in a daemon thread, given up on after `seconds` (a DNS lookup ignores HTTP timeouts)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:
            outcome["error"] = e

    worker = threading.Thread(target=run, daemon=True, name="vitviz-hub-request")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _reason(error: BaseException) -> str:
    """A few plain words for a network failure."""
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"the Hub answered HTTP {error.response.status_code}"
    kind = type(error).__name__
    if isinstance(error, TimeoutError) or "Timeout" in kind:
        return f"no answer within {HUB_TIMEOUT:g} s"
    detail = (str(error).splitlines() or [""])[0][:160]
    if "Connect" in kind:
        return f"no network: {detail}" if detail else "no network"
    return detail or kind


def _matches_its_hash(path: Path) -> bool:
    """Whether a cached file is what the Hub named it: LFS files are stored under their SHA-256."""
    blob = path.resolve()
    if not _SHA256.fullmatch(blob.name):
        return True   # small files are named by their git hash; JSON parsing checks those
    digest = hashlib.sha256()
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == blob.name


def _progress_bar(report: ProgressFn, description: str) -> type[tqdm]:
    """A tqdm class for `hf_hub_download` that tells `report` instead of drawing."""

    class Report(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n: int = 1):
            self.n += n
            if self.total:
                report(min(max(self.n / self.total, 0.0), 1.0), description)

    return Report


# ---- what can be had now ------------------------------------------------------------------------------

def cached_models() -> dict[str, int]:
    """Catalog models that load without the network -> bytes on disk: the bundled ones and those in the HF cache."""
    out = {}
    for entry in catalog.CATALOG.values():
        paths = [entry.path / CONFIG, entry.path / SAFETENSORS] if entry.bundled else _cached_files(entry.source)
        if paths and all(p.is_file() for p in paths):
            out[entry.name] = sum(p.stat().st_size for p in paths)
    return out


def available(source: str) -> bool:
    """Whether `load(source)` can get its files now: a bundled model, files in the HF cache, or a Hub that
    answers for it (one metadata request, within HUB_TIMEOUT). Never raises; folders count only if bundled."""
    try:
        request = parse_source(source, allow_local=False)
        if request.folder is not None or _cached_files(request.repo_id, request.revision):
            return True
        return _resolve_commit(request.repo_id, request.revision, request.name)[0] is not None
    except LoadError:
        return False


def _cached_files(repo_id: str, revision: str = "main") -> list[Path]:
    """The files `load` would read for `revision` of `repo_id` from the HF cache; [] without config or weights."""
    found = [try_to_load_from_cache(repo_id, f, revision=revision)
             for f in (CONFIG, SAFETENSORS, PICKLED, CVT_PROCESSOR, OPEN_CLIP_CONFIG, OPEN_CLIP_SAFETENSORS,
                       OPEN_CLIP_PICKLED, CLIP_VOCAB, CLIP_MERGES)]
    paths = [Path(p) for p in found if isinstance(p, str)]
    names = {p.name for p in paths}
    layouts = [({CONFIG}, {SAFETENSORS, PICKLED}), ({OPEN_CLIP_CONFIG}, {OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED})]
    return paths if CONFIG in names and any(config & names and weights & names for config, weights in layouts) else []
