"""The logit lens and the residual stream's share: when does each model commit to its answer, and how
much of each block's output is what it was handed?

Logit lens (nostalgebraist 2020; per patch as ViT-Prisma draws it). Each block's output (TransformerLens'
`resid_post`) is read as if it were the last block's: through the model's own final norm and
classifier, nothing trained for the purpose,

    lens_l = head(norm(X_l))        read where the classifier reads: the class token (b C)
    lens_l[i] = head(norm(X_l[i]))  every grid token i on its own (b gh gw C, per_patch=True)

so the last row is the model's logits. Only blocks whose tokens the classifier can read get a row:
those of the last stage (ViT: every block; CvT: the last stage's, the only ones with the classifier's
width and a class token: CvT-13's 10 of 13 blocks). Details of the readout are the model's own
(`head_logits`): a ViT that pools the grid mean (timm's global_pool='avg') reads the grid mean through
`fc_norm`, not its class token; DeiT's distilled ViT reads the class token through `head` and the
distillation token through `head_dist` and averages the two, as its logits do. Per patch, every grid
token goes through the final norm(s) and the classifier (DeiT: the mean of both heads on the token).

Residual share (Raghu et al. 2021). A pre-norm block computes X_out = X_in + f(X_in); per
token, how large the skip connection's part is against the block's own addition,

    share_l = ||X_in|| / ||X_out - X_in||       (L2 norm over channels)

for the class token, and for the grid tokens (their mean of the per-token ratio). Above 1 the block
mostly passes its input on. X_in is the trace's `inputs` (the previous block's output; for a
stage's first block the stage's embedding). A block without a class token (CvT's first two stages)
has NaN there, and a block that halves its grid itself (a ResNet's first of a stage) NaN for both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from ..models.trace import Trace


def lens_layers(trace: Trace) -> list[int]:
    """The indices into `trace.blocks` the logit lens has a row for (the last stage's blocks)."""
    last = trace.blocks[-1].stage
    return [i for i, block in enumerate(trace.blocks) if block.stage == last]


def relative_depth(trace: Trace, layers: list[int] | None = None) -> list[float]:
    """Depth of each block in `layers` (default: all) as a fraction of the model's blocks: (i + 1) / L,
    so two models of different depths share one axis and the last block of each sits at 1."""
    total = len(trace.blocks)
    return [(i + 1) / total for i in (range(total) if layers is None else layers)]


def _needs_classifier(trace: Trace) -> None:
    if not trace.has_classifier:
        raise ValueError("this model has no classifier (a self-supervised backbone such as DINO or DINOv2 "
                         "outputs features, not classes): the logit lens reads blocks through the classifier")


def logit_lens(model: nn.Module, trace: Trace, *, per_patch: bool = False) -> Tensor:
    """Each lens block's logits through the model's own final norm and head (see the module docstring):
    b L C, or with per_patch b L gh gw C (every grid token on its own). L: `lens_layers(trace)`."""
    _needs_classifier(trace)
    rows = []
    with torch.inference_mode():   # no map of this module needs a gradient
        for i in lens_layers(trace):
            block = trace.blocks[i]
            if per_patch:
                grid = rearrange(block.tokens[:, block.prefix:], 'b n c -> (b n) 1 c')
                logits = model.pooled_logits(grid)   # the mean of one token: that token through norm and head
                rows.append(rearrange(logits, '(b h w) k -> b h w k', b=block.tokens.shape[0],
                                      h=block.query_grid[0], w=block.query_grid[1]))
            else:   # the rest of the forward from past the last block: the final norm and the classifier
                rows.append(model.forward_from(len(trace.blocks), block.tokens, block.query_grid))
    return torch.stack(rows, dim=1).float()


def final_class_probability(model: nn.Module, trace: Trace) -> Tensor:
    """b L: after each lens block, the lens's probability of the class the model finally predicts (the
    curve of 'when does it commit'; plot it over `relative_depth(trace, lens_layers(trace))`)."""
    probs = logit_lens(model, trace).softmax(dim=-1)              # b L C
    final = probs[:, -1].argmax(dim=-1)                           # the last row is the model's logits
    return probs.gather(2, final[:, None, None].expand(-1, probs.shape[1], 1))[..., 0]


def patch_top_class(model: nn.Module, trace: Trace, layer: int) -> tuple[Tensor, Tensor]:
    """The per-patch lens at block `layer` (an index into `trace.blocks`, one of `lens_layers`): each grid
    token's top class and its probability, b gh gw each."""
    layers = lens_layers(trace)
    if layer not in layers:
        raise ValueError(f"block {layer} has no logit-lens reading: the lens reads blocks {layers[0]} to "
                         f"{layers[-1]} (the last stage's, whose tokens the classifier can read)")
    probs = logit_lens(model, trace, per_patch=True)[:, layers.index(layer)].softmax(dim=-1)
    top = probs.max(dim=-1)
    return top.indices, top.values


@dataclass(frozen=True)
class ResidualShare:
    """How much of each block's output is what it was handed, per image and block: ||X_in|| / ||X_out - X_in||
    for the class token and, averaged, for the grid tokens (above 1 the block mostly passes its input on)."""
    cls: Tensor     # b L: the class token's ||X_in|| / ||X_out - X_in||; NaN where a block has none
    grid: Tensor    # b L: the mean over grid tokens of their ratio


def residual_share(trace: Trace) -> ResidualShare:
    """Per block, the skip connection's norm against the block's addition (see the module docstring)."""
    cls, grid = [], []
    for i, block in enumerate(trace.blocks):
        if block.inputs is None:
            raise ValueError(f"block {i} of this trace has no inputs: make the trace with the model's own trace()")
        x_in, x_out = block.inputs.float(), block.tokens.float()
        if x_in.shape != x_out.shape:   # a block that halves the grid itself (a ResNet's): no skip of the same shape
            cls.append(torch.full((x_out.shape[0],), float("nan"), device=x_out.device))
            grid.append(cls[-1].clone())
            continue
        ratio = x_in.norm(dim=-1) / (x_out - x_in).norm(dim=-1)   # b n
        grid.append(ratio[:, block.prefix:].mean(dim=1))
        cls.append(ratio[:, block.prefix_kinds.index("cls")] if "cls" in block.prefix_kinds
                   else torch.full_like(grid[-1], float("nan")))
    return ResidualShare(cls=torch.stack(cls, dim=1), grid=torch.stack(grid, dim=1))
