"""AttnLRP (Achtibat et al., ICML 2024): the target logit shared out, layer by layer, down to the pixels.

One forward pass with relevance rules switched on (`vitviz.models.relevance`, where every rule is
derived), one backward pass from the target logit; the relevance of each input value is its
gradient times its value, and a pixel's relevance is the sum over its colour channels. Positive
relevance speaks for the class, negative against it.

    R(pixel) = sum_c x_c * dy_target/dx_c   (modified gradients)

Convolutional networks. ConvNeXt takes the same rules (its LayerNorms the LayerNorm rule, its depthwise,
stem and downsampling convolutions the Gamma rule, layer scale a linear map). A ResNet takes zennit's
`EpsilonPlusFlat` composite with its ResNet canonizer (`relevance_rules` of the model; the rules in
`vitviz.models.relevance`): its biases are its BatchNorm shifts, folded into the convolutions.

The token map sums the pixels of each cell of the model's last token grid: a ViT patch, or for CvT
a cell of the stage-3 grid, whose stride is the product of the three embeddings' strides (16 px):
cell (i, j) holds pixels [16 i, 16 i + 16) x [16 j, 16 j + 16), the last row and column of cells
also what lies beyond them (CvT's padded convolutions can make the grid overhang the image, and a
ViT never reads the pixels past its last whole patch, whose relevance is 0).

What is conserved (with the default `attention="cp"`; see `vitviz.models.relevance`): the pixels'
relevance plus what the biases, the LayerNorm and BatchNorm shifts, the position embeddings and the
prefix tokens (class, distillation, registers; CvT's stage-3 class token) absorb equals the target
logit. With every one of those zero the pixel map sums to the logit (tests/test_relevance.py checks
it for CvT). CvT needs nothing of its own: its convolutional token embeddings take the Gamma rule as
convolutions, the depthwise convolution + BatchNorm in front of q/k/v is affine (LRP-0, the shift
absorbing), and the class token that enters at stage 3 is a parameter, absorbing like the biases.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from ..models.relevance import ATTENTION_RULES, RelevanceRules, relevance_rules
from .gradients import Target, resolve_target

__all__ = ["ATTENTION_RULES", "attnlrp", "cell_sums"]


def attnlrp(model: nn.Module, pixels: Tensor, target: Target = None, *, gamma_conv: float | None = None,
            gamma_linear: float | None = None, attention: str | None = None, pixel_map: bool = False) -> Tensor:
    """AttnLRP relevance for `target` (default: each image's top class): b gh gw on the model's last token
    grid, each cell the sum of its pixels' relevance; `pixel_map=True`: b h w, one value per pixel. The rules
    are the model's own (`relevance_rules`: AttnLRP's, or for a ResNet zennit's EpsilonPlusFlat), with any
    knob given here in their place."""
    if model.training:
        raise ValueError("call model.eval() first: in training mode BatchNorm mixes the images of a batch")
    if getattr(getattr(model, "config", None), "num_classes", None) == 0:   # its forward returns features, not logits
        raise ValueError("this model has no classifier, so it has no class to explain: wrap it in "
                         "explain.SimilarityTarget(model, direction) to explain its pooled output's similarity to a "
                         "direction")
    given = {"gamma_conv": gamma_conv, "gamma_linear": gamma_linear, "attention": attention}
    rules = replace(getattr(model, "relevance_rules", RelevanceRules()),
                    **{k: v for k, v in given.items() if v is not None})
    pixels = pixels.detach().requires_grad_(True)
    with torch.enable_grad(), relevance_rules(rules):
        logits = model(pixels)
        target = resolve_target(logits, target)
        score = logits.gather(1, target[:, None]).sum()   # images are independent: each gets its own gradient
        grad, = torch.autograd.grad(score, pixels)
    relevance = (pixels.detach() * grad).sum(dim=1)
    if pixel_map:
        return relevance
    embeddings = model.embeddings(tuple(pixels.shape[-2:]))
    stride = math.prod(embedding.window.stride for embedding in embeddings)
    return cell_sums(relevance, grid=embeddings[-1].grid, stride=stride)


def cell_sums(pixel_map: Tensor, *, grid: tuple[int, int], stride: int) -> Tensor:
    """b h w -> b gh gw: each token cell the sum of the pixels [stride * i, stride * (i + 1)), the last
    cell of each axis also the pixels beyond it."""
    def membership(size: int, cells: int) -> Tensor:   # cells x size, one 1 per column
        owner = (torch.arange(size, device=pixel_map.device) // stride).clamp(max=cells - 1)
        return (owner[None, :] == torch.arange(cells, device=pixel_map.device)[:, None]).to(pixel_map.dtype)

    rows, cols = membership(pixel_map.shape[-2], grid[0]), membership(pixel_map.shape[-1], grid[1])
    return torch.einsum('ih,bhw,jw->bij', rows, pixel_map, cols)
