"""What a load hands back: the model with its own preprocessing, labels and provenance, or a `LoadError`."""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch
from PIL import Image
from torch import Tensor, nn

from ..models.clip import CLIP
from ..preprocess import Tokenizer, Transform

SIZES = (32, 1024)  # input sizes (px, square) `load` accepts; a ViT-S/14's attention at 1024 px is ~8 GB

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
    """What `load` hands back: one of vitviz's models in eval mode with the checkpoint's own
    preprocessing, its labels in logit order and where it came from (for CLIP, both towers and the
    tokenizer too)."""
    name: str                    # as asked for: catalog name, repo id or folder name
    model: nn.Module | None      # one of vitviz's models, eval mode: model(pixels) -> logits; None in a `card`
    family: str                  # a key of `models.FAMILIES`: 'vit', 'cvt', 'swin', 'resnet', 'convnext'
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
        return replace(self, transform=(self.transform_at or functools.partial(same_crop_share, self.transform))(size))

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


def same_crop_share(transform: Transform, size: int) -> Transform:
    """`transform` at another size, the crop keeping its share of the resized image (vitviz's bundles)."""
    resize = transform.resize
    scaled = (size, size) if isinstance(resize, tuple) else math.floor(resize * size / transform.crop[0])
    return replace(transform, crop=(size, size), resize=scaled)

