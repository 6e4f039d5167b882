"""Class-specific maps from attention gradients: gradient-weighted rollout and Chefer et al. 2021.

Both weigh each block's attention A by the gradient of the target-class logit with respect to
that same block's attention (vit-explain pairs block i with block L-1-i's gradient; we do not)
and keep the positive part, in each method's own order:

- Gradient rollout (jacobgil's method, fixed): average over heads, then clip,
  Ā = clamp(mean_h(∂y/∂A ⊙ A), min=0), rolled out like attention: Ã = (I + Ā·D) / rowsum.
- Chefer et al. 2021, "Generic Attention-model Explainability": clip per head, then average,
  Ā = mean_h(clamp(∂y/∂A ⊙ A, min=0)); R = I, R <- R + Ā·D·R per block in forward order; the map
  is R's class row.

D = I for ViT and Swin and the key-to-query operator of `cvt.py` for CvT; a windowed block's products
are taken per window (`windows.py`), and the readout of a model without a class token (Swin) is the mean
over its final tokens, as in rollout. The `*_from_trace` functions take
a trace made with `model.trace(pixels, grad=True)` and leave its graph intact, so one traced
forward serves every method; the plain names run that forward themselves.

CLIP. With prompts a CLIP model is a classifier whose logit is exp(logit_scale) times the cosine of
the image and prompt features (`models/clip.py`), which is what Chefer et al.'s CLIP notebook
(Transformer-MM-Explainability, `CLIP_explainability.ipynb`, `interpret`) differentiates:
`logits_per_image` of the image and its prompt. Their notebook starts the image relevance at the last
block (`start_layer` 11 of ViT-B's 12; -1 in its later form): `CLIP_START_LAYER`, which a negative
`start_layer` expresses for any depth (it counts from the last block, -1 being the last alone).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..models.trace import BlockTrace, KeptAttention, Trace
from .cvt import keys_to_queries
from .rollout import blocks_in_range, class_column, discard_lowest, needs_attention, propagate, rollout_step
from .windows import attend

Target = int | Sequence[int] | Tensor | None
CLIP_START_LAYER = -1   # Chefer et al.'s CLIP notebook: the last block's relevance alone


def first_block(trace: Trace, start_layer: int) -> int:
    """`start_layer` as an index of `trace.blocks`: a negative one counts from the end (-1: the last block)."""
    return start_layer + len(trace.blocks) if -len(trace.blocks) <= start_layer < 0 else start_layer


def resolve_target(logits: Tensor, target: Target) -> Tensor:
    """b classes logits, target -> b class indices: None = each image's top prediction; an int = for every image."""
    batch, classes = logits.shape
    if not classes:
        raise ValueError("the model has no classifier, so there is no class to explain: explain "
                         "`explain.SimilarityTarget(model, direction)` of it instead")
    if target is None:
        return logits.detach().argmax(dim=-1)
    target = torch.as_tensor(target, device=logits.device).long().reshape(-1)
    if target.numel() == 1:
        target = target.expand(batch)
    if target.numel() != batch:
        raise ValueError(f"target has {target.numel()} entries for a batch of {batch} images")
    if ((target < 0) | (target >= classes)).any():
        raise ValueError(f"target classes {target.tolist()} are out of range for a {classes}-class model")
    return target


def attention_gradients(trace: Trace, target: Target, blocks: Sequence[int]) -> dict[int, Tensor]:
    """{block index: ∂ target logit / ∂ attention (shaped as the attention)}, each image's own target; the graph
    is kept."""
    needs_attention(trace, "a method that weighs attention by its gradient")
    if not trace.logits.requires_grad:
        raise ValueError("this trace has no gradients: make it with model.trace(pixels, grad=True)")
    target = resolve_target(trace.logits, target)
    score = trace.logits.gather(1, target[:, None]).sum()   # images are independent: the sum's gradient is per image
    grads = torch.autograd.grad(score, [trace.blocks[i].attn for i in blocks], retain_graph=True)
    return dict(zip(blocks, grads))


def mean_then_clip(attn: Tensor, grad: Tensor) -> Tensor:
    """Gradient rollout's Ā = clamp(mean_h(grad ⊙ A), min=0): b (nw) h nq nk -> b (nw) nq nk."""
    return (grad * attn.detach()).mean(dim=-3).clamp(min=0)


def clip_then_mean(attn: Tensor, grad: Tensor) -> Tensor:
    """Chefer's Ā = mean_h(clamp(grad ⊙ A, min=0)): b (nw) h nq nk -> b (nw) nq nk."""
    return (grad * attn.detach()).clamp(min=0).mean(dim=-3)


def gradient_rollout_from_trace(trace: Trace, target: Target = None, *, discard_ratio: float = 0.0,
                                start_layer: int = 0, to_stage: int = -1) -> Tensor:
    """Gradient-weighted rollout of a grad trace: b gh gw on the model's last token grid."""
    grads = attention_gradients(trace, target, blocks_in_range(trace, start_layer=start_layer, to_stage=to_stage))

    def matrix(i: int) -> Tensor:
        block = trace.blocks[i]
        weighted = mean_then_clip(block.attn, grads[i])
        return discard_lowest(weighted, discard_ratio, keep_column=class_column(block)) if discard_ratio else weighted

    return propagate(trace, matrix, rollout_step, start_layer=start_layer, to_stage=to_stage)


def chefer_step(row: Tensor, weighted: Tensor, block: BlockTrace) -> Tensor:
    """r·(I + Ā·D): one block of R <- R + Ā·D·R, carried as the readout row."""
    return row + keys_to_queries(attend(row, weighted, block), block)


def chefer_relevance_from_trace(trace: Trace, target: Target = None, *, start_layer: int = 0,
                                to_stage: int = -1) -> Tensor:
    """Chefer et al. 2021 relevance of a grad trace: b gh gw on the model's last token grid (`start_layer` < 0:
    counted from the last block)."""
    start_layer = first_block(trace, start_layer)
    grads = attention_gradients(trace, target, blocks_in_range(trace, start_layer=start_layer, to_stage=to_stage))
    return propagate(trace, lambda i: clip_then_mean(trace.blocks[i].attn, grads[i]), chefer_step,
                     start_layer=start_layer, to_stage=to_stage)


def grad_trace(model: nn.Module, pixels: Tensor, attention: KeptAttention = True) -> Trace:
    """A traced forward that keeps the graph (and the `attention` maps asked for), for the methods that backpropagate
    a target through it; refused for a model in training mode."""
    if model.training:
        raise ValueError("call model.eval() first: in training mode BatchNorm mixes the images of a batch "
                         "and the trace would update its running statistics")
    return model.trace(pixels, grad=True, attention=attention)


def gradient_rollout(model: nn.Module, pixels: Tensor, target: Target = None, *, discard_ratio: float = 0.0,
                     start_layer: int = 0, to_stage: int = -1) -> Tensor:
    """Gradient-weighted rollout for `target` (default: each image's top class): b gh gw, last token grid."""
    return gradient_rollout_from_trace(grad_trace(model, pixels), target, discard_ratio=discard_ratio,
                                       start_layer=start_layer, to_stage=to_stage)


def chefer_relevance(model: nn.Module, pixels: Tensor, target: Target = None, *, start_layer: int = 0,
                     to_stage: int = -1) -> Tensor:
    """Chefer et al. 2021 relevance for `target` (default: each image's top class): b gh gw, last token grid."""
    return chefer_relevance_from_trace(grad_trace(model, pixels), target, start_layer=start_layer,
                                       to_stage=to_stage)
