"""LeGrad (Bousselham et al. 2024), exactly as torchcam 0.5's `LeGrad` computes it, for ViT and CvT.

The method. Each chosen block l gets a class score of its own: the model's classifier applied to
the final norm of the mean of the block's output tokens X_l (every token, prefix tokens included,
as torchcam does for torchvision's ViT). Its gradient with respect to that same block's
post-softmax attention A_l (b h nq nk), positive part only, averaged over heads and queries, is a
map over the block's keys; the prefix keys are dropped and the layers averaged:

    s_l = head(norm(mean_n X_l))                       b classes (`pooled_logits` of the model)
    m_l = mean_{h,q} max(∂ s_l[target] / ∂ A_l, 0)     b nk
    map = mean_l m_l[grid keys],   map <- (map - min) / (max(map - min) + 1e-8)   per image

Unlike gradient rollout and Chefer's rule, the attention values are not multiplied in and nothing
is rolled out: each layer speaks for itself, through its own score. DeiT's distilled ViT scores
with the mean of its two heads, as its logits are.

CvT. Only the last stage's blocks have the classifier's width (and the class token), so only they
get a score: LeGrad reads those (`start_layer` indexes `trace.blocks`, as for the other methods;
blocks of earlier stages are never read). Their keys are not the query grid: key j is a strided
depthwise convolution of the query-grid tokens in its window W(j) (3x3, stride 2, padding 1), so
m_l lives on the coarser key grid. It is carried to the query grid with the key operator D of
`cvt.py` (D[j, i] = 1 / |W(j)| if query-grid token i is in W(j), else 0; D[cls, cls] = 1) and
divided by D's column sums, before the prefix is dropped:

    m_l <- (m_l · D) / (1 · D)          1: the all-ones row over the keys

"The score is sensitive to attending to key j" becomes "to the tokens key j was made of", each
query token taking the D-weighted mean of the keys built from it (the per-channel convolution
weights give no single scalar share, so D shares uniformly). Why the division: rows of D sum to 1,
which rollout needs (its matrices stay row-stochastic), but columns do not. With 3x3 windows at
stride 2 a query token lies in 1, 2 or 4 windows, so m_l · D alone turns a flat key map into a
fixed 1:2:4 checkerboard drawn by the geometry, not by the model: two unrelated random CvTs then
gave maps with rank correlation about 0.6 (Adebayo et al.'s randomisation check; 128 px, the
tests' tiny CvTs), about 0.1 with the division. A flat key map now stays flat, and LeGrad's min-max
normalisation has no use for the total that D would keep. The map has the key grid's resolution
(CvT-13 at 224 px: 7x7 keys under the 14x14 stage-3 grid). Every block of a stage has the same D,
so averaging layers before or after carrying is the same. For ViT D = I and this is torchcam's
formula.

Swin. No class token: the classifier reads the mean of the last stage's tokens through the final norm,
and LeGrad's score of a layer is its mean token through that norm and the classifier, as for every
model here. Only the last stage's blocks have the classifier's width, so only they get a score (at
224 px stage 4 is one 7x7 window, and its attention is global over its grid). A windowed block's
gradient is kept per window; the mean over queries counts every query of the block, a query that did
not see a key adding 0 to it, which is the dense matrix's column mean (`windows.key_means`).

Cost. One traced forward keeps the attention maps and the graph of the blocks from `start_layer` on
(`trace(attention=slice(start_layer, None))`: the blocks before run as a plain forward, fused attention
and no graph, which is what legrad_torch's frozen early blocks buy it); then, per layer,
`torch.autograd.grad(s_l, A_l)` runs only the backward tail from that layer's score to its attention
(the classifier, the block's MLP, output projection and attention-times-values): autograd executes
only the nodes on a path to the requested tensor and prunes everything else, and no weight gradient
is formed. The tails of all layers together cost about one more forward: LeGrad over all 12 blocks
of ViT-B/16 takes 1.9 plain forwards (`benchmarks/bench.py --only attribution`), torchcam's 2.1.

CLIP, as the LeGrad authors compute it (legrad_torch 1.1, `LeWrapper.compute_legrad_clip`). A CLIP
model with prompts is a ViT whose head is the zero-shot head (`models/clip.py`), so `pooled_logits`
is their per-layer score: the mean of all the layer's tokens through ln_post and the projection, its
cosine to the prompt's text embedding, times exp(logit_scale). That positive constant scales the
gradient, which the ReLU, the means and the min-max normalisation all pass through, so the map is
theirs. They sum the layers where torchcam averages them (the same after min-max), read only the
last two blocks (`LeWrapper(layer_index=-2)`: `CLIP_START_LAYER`, a negative `start_layer` counting
from the last block) and upsample each layer's map to the pixels bilinearly before the min-max;
bilinear interpolation is linear and keeps constants, so upsampling vitviz's token map and min-maxing
it again gives their pixel map exactly (the tests do). Their normalisation has no 1e-8 (one part in
10^8 of the range apart).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor, nn

from ..models.trace import Trace
from .cvt import keys_to_queries
from .gradients import Target, first_block, grad_trace, resolve_target
from .rollout import blocks_in_range, needs_attention
from .windows import key_means

Classifier = Callable[[Tensor], Tensor]   # a block's b n c tokens -> b classes (the models' `pooled_logits`)
EPS = 1e-8   # torchcam's `_CAM._normalize`
CLIP_START_LAYER = -2   # legrad_torch's `LeWrapper(layer_index=-2)`: the last two blocks


def legrad_from_trace(trace: Trace, classifier: Classifier, target: Target = None, *, start_layer: int = 0) -> Tensor:
    """LeGrad of a grad trace, each block scored by `classifier`: b gh gw on the model's last token grid, in [0, 1]
    (`start_layer` < 0: counted from the last block)."""
    needs_attention(trace, "LeGrad")
    if not trace.logits.requires_grad:
        raise ValueError("this trace has no gradients: make it with model.trace(pixels, grad=True)")
    target = resolve_target(trace.logits, target)[:, None]
    maps = []
    for i in blocks_in_range(trace, start_layer=first_block(trace, start_layer), to_stage=-1):   # CvT: last stage
        block = trace.blocks[i]
        score = classifier(block.tokens).gather(1, target).sum()   # images are independent: per-image gradients
        (grad,) = torch.autograd.grad(score, block.attn, retain_graph=True)
        keys = key_means(grad.clamp(min=0).mean(dim=-3), block)     # b (nw) h nq nk -> b nk
        carried = keys_to_queries(keys, block) / keys_to_queries(torch.ones_like(keys), block)   # (m·D) / (1·D)
        maps.append(carried[:, block.prefix:])
    h, w = trace.blocks[-1].query_grid
    cam = rearrange(torch.stack(maps).mean(dim=0), 'b (h w) -> b h w', h=h, w=w)
    cam = cam - cam.amin(dim=(1, 2), keepdim=True)
    return cam / (cam.amax(dim=(1, 2), keepdim=True) + EPS)


def legrad(model: nn.Module, pixels: Tensor, target: Target = None, *, start_layer: int = 0) -> Tensor:
    """LeGrad for `target` (default: each image's top class) over the blocks from `start_layer` on:
    b gh gw on the model's last token grid, min-max normalised per image."""
    trace = grad_trace(model, pixels, attention=slice(start_layer, None))   # the attention and graph it reads
    return legrad_from_trace(trace, model.pooled_logits, target, start_layer=start_layer)
