"""Direct logit attribution and token-level direct effects: which heads and MLPs write the class, and which
tokens each head read it from (Elhage et al. 2021's decomposition; Gandelsman et al., ICLR 2024, for CLIP's
image tower; TransformerLens' and ViT-Prisma's names).

The decomposition. A pre-norm transformer adds every block's output to one residual stream: the stream
entering the classifier is

    x_L = x_0 + sum_l (attn_l + mlp_l),   attn_l = sum_h z_lh W_O_lh^T + b_O_l,   z_lh(q) = sum_j A_lh[q, j] v_lh[j]

(x_0 the embedding, `resid_pre` of the first block; z the heads' outputs before the output projection;
LayerScale folded into W_O and b_O). The classifier reads x_L through a LayerNorm, which is not linear;
with its scale 1/sigma frozen at the real forward's value it is, and so is the whole readout,

    m = logit[target] - logit[foil] = sum_q U_q . x_L[q] + bias,

U the gradient of m with respect to x_L under frozen norm scales (`models.relevance.frozen_norm_scales`),
`bias` what is left: the classifier's bias and the norm's shift read through the classifier. The norm's
mean subtraction is linear and sits inside U, so it applies to every part alike and the parts stay
additive: every part of x_L read through U,

    embedding = U . x_0,   heads[l, h] = U . z_lh W_O_lh^T,   attn_bias[l] = U . b_O_l,   mlps[l] = U . mlp_l,

sums to m exactly (up to float rounding). mlp_l is the block's update less its attention's output, which
is what the MLP added; read through U, the attention's output is its heads and its bias,
U . attn_l = sum_h heads[l, h] + attn_bias[l], so mlps[l] = U . (x_l+1 - x_l) - sum_h heads[l, h] - attn_bias[l]
needs no second product with W_O. Which tokens the readout reads is the model's own: the class token; DeiT's
distilled ViT its class and distillation tokens, each through its own head, averaged; a ViT that pools
the grid mean every grid token (each with 1 / n of U); register tokens are never read, so they count only
through the heads that read them. CvT: the blocks of stage 3, where its class token enters (a parameter:
the `embedding` part); whatever stages 1-2 computed reaches the class token through stage 3's heads.
Swin: the blocks of the last stage, every token read (the classifier averages them; the `embedding` part
is what the last patch merging handed on), each head's products taken per window (`windows.py`). A
convolutional block (ConvNeXt) has no heads: its whole update is its `mlps` part.

Token effects. A head's part splits over the key tokens it read,

    token_effects[l, h, j] = sum_q A_lh[q, j] (v_lh[j] W_O_lh^T) . U_q,    sum_j token_effects[l, h, j] = heads[l, h],

a map over the block's keys: for ViT the grid (and prefix tokens); for CvT the stride-2 key grid, carried
to the query grid with the key operator D of `cvt.py` (v . D keeps the sum, rows of D summing to 1), so the
carried map and the prefix entries still sum to the head's part. The top head's map is "which patches,
through which head, wrote the class".

Cost: one traced forward that also keeps the values each block's attention weighed
(`model.trace(pixels, decompose=True)`: the forward computes them anyway), then per block one product the
size of the output projection (U W_O) and one the size of attention-times-values (A^T (U W_O)): about a
tenth of the block's own forward. Nothing is read back: the parts stay on the trace's device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from ..models.relevance import frozen_norm_scales
from ..models.trace import Trace
from .cvt import keys_to_queries
from .gradients import Target, resolve_target
from .windows import from_windows, to_windows, windowed


@dataclass
class Attribution:
    """The target (minus foil) logit of each image split over the components that write it; every part b ..."""

    target: Tensor         # b, the class explained
    foil: Tensor | None    # b, the class subtracted (None: the target logit alone)
    layers: list[int]      # the L blocks decomposed, as indices into trace.blocks (CvT: stage 3's)
    embedding: Tensor      # b, the read tokens' own embedding (ViT: with position embedding; CvT: stage-3 class token)
    heads: Tensor          # b L H, each head's output
    attn_bias: Tensor      # b L, the attention output projection's bias
    mlps: Tensor           # b L
    bias: Tensor           # b, the classifier's bias and the final norm's shift
    logit: Tensor          # b, the real value (the target minus the foil logit)
    token_effects: Tensor  # b L H nk, `heads` split by the key token each head read from (prefix keys first)

    @property
    def attention(self) -> Tensor:
        """b L: each layer's attention (its heads and its bias)."""
        return self.heads.sum(dim=-1) + self.attn_bias

    def total(self) -> Tensor:
        """b: the sum of the parts, which is `logit` up to float rounding."""
        return self.embedding + self.attention.sum(dim=-1) + self.mlps.sum(dim=-1) + self.bias

    def top_head(self, image: int = 0) -> tuple[int, int] | None:
        """(position in `layers`, head) of the head that writes the most for the class in image `image`; None for
        a model without heads (a convolutional network)."""
        if not self.heads.shape[-1]:
            return None
        flat = int(self.heads[image].argmax())
        return divmod(flat, self.heads.shape[-1])


    def table(self, image: int = 0, labels: Sequence[str] | None = None) -> dict:
        """One image's parts as plain numbers (decide.json, the app's figures): every layer's attention, bias,
        MLP and heads, and the top head; `layer` indexes trace.blocks."""
        def number(x: Tensor) -> float:
            return round(float(x), 6)

        def named(classes: Tensor | None) -> dict:
            if classes is None:
                return {"index": None}
            index = int(classes[image])
            return {"index": index, **({"label": labels[index]} if labels is not None else {})}

        top = self.top_head(image)
        top_head = None if top is None else {"layer": self.layers[top[0]], "head": top[1],
                                             "value": number(self.heads[image, top[0], top[1]])}
        return {"target": named(self.target), "foil": named(self.foil), "logit": number(self.logit[image]),
                "sum_of_parts": number(self.total()[image]), "embedding": number(self.embedding[image]),
                "bias": number(self.bias[image]),
                "layers": [{"layer": block, "attention": number(self.attention[image, k]),
                            "attn_bias": number(self.attn_bias[image, k]), "mlp": number(self.mlps[image, k]),
                            "heads": [number(h) for h in self.heads[image, k]]} for k, block in enumerate(self.layers)],
                "top_head": top_head}


def readout(model: nn.Module, trace: Trace, target: Tensor, foil: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(U b n c, bias b, m b): m = sum U * last block's tokens + bias, the classifier with its norms' scales frozen."""
    last = trace.blocks[-1]
    tokens = last.tokens.detach().requires_grad_(True)
    with torch.enable_grad(), frozen_norm_scales():
        logits = model.forward_from(len(trace.blocks), tokens, last.query_grid)
        m = logits.gather(1, target[:, None])[:, 0]
        if foil is not None:
            m = m - logits.gather(1, foil[:, None])[:, 0]
        (direction,) = torch.autograd.grad(m.sum(), tokens)   # images are independent: per-image gradients
    return direction, m.detach() - (direction * tokens.detach()).sum(dim=(1, 2)), m.detach()


def direct_logit_attribution(model: nn.Module, trace: Trace, target: Target = None, *,
                             foil: Target = None) -> Attribution:
    """Direct logit attribution of a trace made with `model.trace(pixels, decompose=True)`, with token effects.

    target: the class (default: each image's top prediction); foil: a class whose logit is subtracted.
    """
    if not trace.residual_stream:
        raise ValueError("this model's blocks do not add to one residual stream (a ReLU follows each addition, as "
                         "in a ResNet), so its logit is no sum of the blocks' parts and direct logit attribution does "
                         "not apply; activation patching does")
    blocks = trace.blocks
    last_stage = blocks[-1].stage
    layers = [i for i, block in enumerate(blocks) if block.stage == last_stage]
    if any((blocks[i].parts is None and blocks[i].attends) or blocks[i].inputs is None for i in layers):
        raise ValueError("this trace does not keep how the heads write: make it with "
                         "model.trace(pixels, decompose=True)")
    target = resolve_target(trace.logits, target)
    foil = None if foil is None else resolve_target(trace.logits, foil)
    if foil is not None and bool((foil == target).any()):
        raise ValueError("the foil class is the target class: their logit difference is always 0")
    u, bias, _ = readout(model, trace, target, foil)   # b n c, zero on the tokens the classifier does not read
    heads, attn_bias, mlps, effects = [], [], [], []
    with torch.no_grad():
        for i in layers:
            block, parts = blocks[i], blocks[i].parts
            written = (u * (block.tokens.detach() - block.inputs.detach())).sum(dim=(1, 2))   # U . the block's update
            if not block.attends:   # a convolutional block: its whole update is one part
                effects.append(written.new_zeros(written.shape[0], 0, 0))
                heads.append(written.new_zeros(written.shape[0], 0))
                attn_bias.append(written.new_zeros(written.shape[0]))
                mlps.append(written)
                continue
            attn = windowed(block.attn.detach(), block)                          # b nw h tq tk
            values = windowed(parts.values.detach(), block)                      # b nw h tk d
            per_head = rearrange(to_windows(u, block) @ parts.weight, 'b w q (h d) -> b w h q d', h=attn.shape[2])
            effect = ((attn.transpose(-1, -2) @ per_head) * values).sum(dim=-1)  # b nw h tk: U_q W_O_h, per key
            effects.append(rearrange(from_windows(rearrange(effect, 'b w h k -> b w k h'), block), 'b n h -> b h n'))
            heads.append(effects[-1].sum(dim=-1))
            attn_bias.append((u * parts.bias).sum(dim=(1, 2)))
            mlps.append(written - heads[-1].sum(dim=-1) - attn_bias[-1])   # less U . attn_l: its heads and its bias
        embedding = (u * blocks[layers[0]].inputs.detach()).sum(dim=(1, 2))
        logits = trace.logits.detach()
        logit = logits.gather(1, target[:, None])[:, 0]
        if foil is not None:
            logit = logit - logits.gather(1, foil[:, None])[:, 0]
    return Attribution(target=target, foil=foil, layers=layers, embedding=embedding, heads=torch.stack(heads, dim=1),
                       attn_bias=torch.stack(attn_bias, dim=1), mlps=torch.stack(mlps, dim=1), bias=bias,
                       logit=logit, token_effects=torch.stack(effects, dim=1))


def token_effect_maps(attribution: Attribution, trace: Trace) -> Tensor:
    """b L H gh gw: each head's token effects on its block's query grid (CvT: carried from the key grid with D),
    prefix keys left out (`token_effects[..., :prefix]` holds them)."""
    block = trace.blocks[attribution.layers[0]]   # every decomposed block has one geometry
    b, layers, heads, keys = attribution.token_effects.shape
    if not heads:   # a convolutional network: no head read any token
        return attribution.token_effects.new_zeros(b, layers, 0, *trace.blocks[attribution.layers[0]].query_grid)
    carried = keys_to_queries(attribution.token_effects.reshape(-1, keys), block)[:, block.prefix:]
    h, w = block.query_grid
    return rearrange(carried, '(b l k) (h w) -> b l k h w', b=b, l=layers, k=heads, h=h, w=w)
