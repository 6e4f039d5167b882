"""A target for models without a classifier: how far the pooled output points along a reference direction.

DINO and DINOv2 have no classes, and every gradient or relevance method explains one class's logit.
`SimilarityTarget` gives such a model a one-class classifier whose score exists without one:

    s = <pooled, u>,     u = r / |r|,  r fixed

where `pooled` is what a classifier would read (the class token through the final norm, timm's
pre-logits: `Trace.pooled`) and r a reference taken from a kept trace and held constant:

- a token's final output (`Trace.final_tokens` at a clicked patch): s is the pooled output's
  similarity to that patch's representation, and the maps show what makes the image's global
  representation resemble that patch's (a dot product with a unit vector: the cosine times |pooled|);
- by default the image's own pooled output: u = pooled / |pooled| at the image, so s = |pooled| there
  and its gradient is the pooled output's own direction: what makes up the global representation.

s is linear in the pooled output (a linear head with one class and no bias), so every method treats
it as a classifier's logit: gradient rollout, Chefer's rule and Grad-CAM read `trace.logits`, LeGrad
scores each layer with `pooled_logits`, and AttnLRP's Gamma rule applies to the head as to any
classifier (its relevance sums to s). The wrapped model is shared, never modified.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..models.relevance import GammaLinear
from ..models.trace import Embedding, KeptAttention, Trace


class SimilarityTarget:
    """`model` (a ViT without a classifier) with the one-class head s = <pooled, direction / |direction|>.

    Called, traced and scored per layer like a classifier, so `explain.METHODS[name].maps(target, pixels, 0)`
    explains s; `target` 0 is its only class.
    """

    def __init__(self, model: nn.Module, direction: Tensor):
        if getattr(model, "config", None) is None or model.config.num_classes:
            raise ValueError("SimilarityTarget is for a ViT without a classifier; "
                             "a classifier's logits need no stand-in")
        direction = direction.detach().reshape(-1).float()
        if direction.numel() != model.config.embed_dim or not direction.norm() > 0:
            raise ValueError(f"the direction must be a non-zero vector of the model's width {model.config.embed_dim}")
        parameter = next(model.parameters())
        self.model = model
        self.head = GammaLinear(direction.numel(), 1, bias=False).to(device=parameter.device, dtype=parameter.dtype)
        with torch.no_grad():
            self.head.weight.copy_(direction / direction.norm())
        self.head.requires_grad_(False)

    @property
    def training(self) -> bool:
        return self.model.training

    def __call__(self, pixels: Tensor) -> Tensor:
        return self.head(self.model(pixels))   # the headless model returns its pooled output, as timm's

    def trace(self, pixels: Tensor, *, grad: bool = False, attention: KeptAttention = True) -> Trace:
        trace = self.model.trace(pixels, grad=grad, attention=attention)
        with torch.set_grad_enabled(grad):
            return replace(trace, logits=self.head(trace.pooled))

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        return self.head(self.model.pooled_logits(tokens))   # Identity heads: the pooled features

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        return self.model.embeddings(input_size)
