"""Grad-CAM (Selvaraju et al. 2017) on the last block, as pytorch-grad-cam 1.5.7 computes it for ViTs.

pytorch-grad-cam's ViT recipe takes the last block's first LayerNorm (`blocks[-1].norm1`) as the
target layer, and a `reshape_transform` that drops the prefix tokens and lays the rest out on the
token grid. Why that layer: the classifier reads only the class (and distillation) token of the
last block's output, so the gradient of the logit with respect to that output's grid tokens is
zero; the first norm's output feeds the last attention's keys and values, through which every
grid token reaches the class token. With X its grid tokens (b n c) and G = ∂ y[target] / ∂ X:

    α_c = mean_n G[:, n, c]                                 one weight per channel
    cam = max(Σ_c α_c X[:, :, c], 0)                         b n, laid out on the grid
    cam <- (cam - min) / (max(cam - min) + 1e-7)            per image

The last line is grad-cam's `scale_cam_image` before its resize to the input size; vitviz keeps
the map on the token grid, as every map here, and leaves upsampling to the views. For CvT the
layer is the last stage's last block (its grid is the stage-3 grid, its prefix the class token); for
Swin the same first norm of the last block (grad-cam's Swin recipe, `layers[-1].blocks[-1].norm1`, on
the last grid). A convolutional network's layer is its last block's output, which its pooled classifier
reads directly (grad-cam's usual `layer4[-1]` of a ResNet, `stages[-1]` of a ConvNeXt).

Cost: one traced forward with the graph kept, then `torch.autograd.grad` with respect to that
one tensor: the backward through the classifier and the last block only, with no weight
gradients; 1.2 plain forwards on ViT-B/16 (`benchmarks/bench.py --only attribution`). grad-cam
runs `loss.backward()` through the whole model into every weight: 3.3.
"""
from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from ..models.trace import Trace
from .gradients import Target, grad_trace, resolve_target

EPS = 1e-7   # grad-cam's `scale_cam_image`


def gradcam_from_trace(trace: Trace, target: Target = None) -> Tensor:
    """Grad-CAM of a grad trace at the last block's first norm: b gh gw on the model's last token grid, in [0, 1]."""
    block = trace.blocks[-1]
    if not trace.logits.requires_grad:
        raise ValueError("this trace has no gradients: make it with model.trace(pixels, grad=True)")
    layer = block.normed if block.attends else block.tokens   # the first norm's output, or a CNN block's output
    target = resolve_target(trace.logits, target)
    score = trace.logits.gather(1, target[:, None]).sum()   # images are independent: per-image gradients
    (grad,) = torch.autograd.grad(score, layer, retain_graph=True)
    activations, grad = layer.detach()[:, block.prefix:], grad[:, block.prefix:]
    weights = grad.mean(dim=1)                                                       # b c
    cam = torch.einsum('bnc,bc->bn', activations, weights).clamp(min=0)
    cam = cam - cam.amin(dim=1, keepdim=True)
    cam = cam / (cam.amax(dim=1, keepdim=True) + EPS)
    h, w = block.query_grid
    return rearrange(cam, 'b (h w) -> b h w', h=h, w=w)


def gradcam(model: nn.Module, pixels: Tensor, target: Target = None) -> Tensor:
    """Grad-CAM for `target` (default: each image's top class): b gh gw on the model's last token grid."""
    return gradcam_from_trace(grad_trace(model, pixels), target)
