"""Relevance rules (LRP for transformers, AttnLRP: Achtibat et al., ICML 2024), switched on inside
vitviz's own forward for one pass.

    with relevance_rules(RelevanceRules(gamma_conv=0.25, gamma_linear=0.05)):
        logits = model(pixels)              # same values as a plain forward
    (pixels * torch.autograd.grad(logits[0, c], pixels)[0])   # the relevance of each pixel for class c

Relevance is "modified gradient x input": each rule below changes how the gradient passes one
layer so that, multiplied by that layer's input, it gives the LRP relevance of the input. The
forward values never change. The layers the models build from this module (`GammaLinear`,
`GammaConv2d`, `LayerNorm`, `GELU`, `QuickGELU`, and `attention_inputs` in their attention) behave
exactly as torch's own unless rules are active. Rules are active only inside the `with` block and
only in the thread (or task) that entered it, so a plain forward running beside it, in another
request of the app, is untouched: no torch class is patched.

The rules (lxt's, as in its ViT example; the derivations are the paper's):
- LayerNorm: the standard deviation is detached, so the map is linear, (x - mean) / std * w + b,
  and gradient x input is the LRP-0 rule through it (mean subtraction included).
- GELU (and CvT's QuickGELU): the identity rule, R_in = R_out: the gradient is f(x) / x.
- Linear and Conv2d layers outside the attention (patch and convolutional embeddings, MLP, classifier):
  the generalised Gamma rule (zennit's `Gamma`, Montavon et al. 2019, Andeol et al. 2021). With
  z = xW + b, P = x+W+ + x-W- (the contributions agreeing in sign with the weights' sign pattern
  gamma favours) and N = x+W- + x-W+, an output j with z_j > 0 shares R_j among the inputs in
  proportion to x+(W + gW+) + x-(W + gW-) (bias b + g b+), one with z_j < 0 in proportion to
  x+(W + gW-) + x-(W + gW+) (bias b + g b-):
      R_i = sum_j [x+_i (w + g w+)_ij + x-_i (w + g w-)_ij] R_j [z_j > 0] / (z_j + g (P_j + b+_j))
          + sum_j [x+_i (w + g w-)_ij + x-_i (w + g w+)_ij] R_j [z_j < 0] / (z_j + g (N_j + b-_j)),
  denominators stabilised by 1e-6 with their sign, the input's gradient R_i / x_i (x_i stabilised by
  1e-10), exactly as lxt's zennit patch computes it. gamma = 0 is LRP-0, plain gradient x input.
- The attention's own projections (q/k/v and the output; in CvT also the depthwise convolution +
  BatchNorm in front of q/k/v) keep the plain gradient, LRP-0. torchvision's MultiheadAttention uses
  its projection weights as functions, so in lxt's ViT reference zennit's Gamma never reaches them;
  vitviz does the same, so the two agree. BatchNorm in eval is a per-channel affine map: LRP-0 passes
  relevance through it and its shift (beta - mean * w / sigma) absorbs its share, like any bias.
- Attention, `attention="cp"` (lxt's ViT default, "CP-LRP", Ali et al. 2022): queries and keys are
  detached, so the softmax passes no relevance and all of it flows through the values, out = A v with
  A a constant. `attention="attnlrp"` (the paper's rules): the softmax rule is its gradient x input
  (R_in = x (R_out - s sum R_out)), and the uniform rule for the two bilinear products (q k^T and A v)
  halves the relevance each factor receives; in gradient x input form that is the gradients of q and k
  divided by 4 and of v by 2.

A convolutional network (a ResNet) takes zennit's `EpsilonPlusFlat` composite with its ResNet
canonizer instead (`RelevanceRules(conv="zplus", first_conv="flat", gamma_linear=0)`, the model's
`relevance_rules`): every BatchNorm folded into the convolution before it (zennit's MergeBatchNorm), the
z+ rule on the convolutions (R_i = x+_i (W+^T g) + x-_i (W-^T g), g = R / (x+ W+ + b+ + x- W-)), the
flat rule on the first one (R_i = sum_j R_j / |window of j|: every input of a window alike, its value
ignored), LRP-epsilon with epsilon 1e-6 on the classifier (gamma 0 above), ReLU and max pooling passing
relevance as their gradient does, and the residual sums and the average pool the LRP-0 "norm" rule,
which is the gradient times the input through a sum.

What is conserved: with `attention="cp"`, every rule above conserves relevance up to the
stabilisers, so the relevance of the pixels plus what the biases, LayerNorm shifts, BatchNorm shifts,
position embeddings and prefix tokens (class, distillation, register) absorb equals the target logit.
With all of those zero the pixels hold the whole logit. With `attention="attnlrp"` the softmax rule
is not conservative (it keeps relevance in the softmax's implicit normalisation), so the sum is close
to the logit, not equal.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_RULES = ("cp", "attnlrp")
CONV_RULES = ("gamma", "zplus")
GAMMA_STABILIZER = 1e-6   # zennit's default for the Gamma rule's denominators
INPUT_STABILIZER = 1e-10  # lxt's, dividing relevance by a layer's input


@dataclass(frozen=True)
class RelevanceRules:
    gamma_conv: float = 0.25     # the Gamma rule's gamma on convolutions (token embeddings)
    gamma_linear: float = 0.05   # on linear layers outside the attention (MLP, classifier)
    attention: str = "cp"        # 'cp': relevance through the values only; 'attnlrp': the paper's rules
    conv: str = "gamma"          # the rule on convolutions a BatchNorm follows (a ResNet's): 'gamma' or 'zplus'
    first_conv: str | None = None   # the first of those: 'flat', or None for `conv`

    def __post_init__(self):
        if self.attention not in ATTENTION_RULES:
            raise ValueError(f"attention must be one of {ATTENTION_RULES}, not {self.attention!r}")
        if self.gamma_conv < 0 or self.gamma_linear < 0:
            raise ValueError(f"gamma must be at least 0, not {self.gamma_conv} / {self.gamma_linear}")
        if self.conv not in CONV_RULES or self.first_conv not in (None, *CONV_RULES, "flat"):
            raise ValueError(f"conv rules must be one of {CONV_RULES} (the first also 'flat'), not "
                             f"{self.conv!r} / {self.first_conv!r}")


_ACTIVE: ContextVar[RelevanceRules | None] = ContextVar("vitviz_relevance_rules", default=None)
_FROZEN_NORMS: ContextVar[bool] = ContextVar("vitviz_frozen_norms", default=False)
_FROZEN_ATTENTION: ContextVar[bool] = ContextVar("vitviz_frozen_attention", default=False)


@contextmanager
def relevance_rules(rules: RelevanceRules) -> Iterator[RelevanceRules]:
    """Forward passes inside the block carry `rules` in their backward pass (this thread only)."""
    token = _ACTIVE.set(rules)
    try:
        yield rules
    finally:
        _ACTIVE.reset(token)


@contextmanager
def frozen_norm_scales() -> Iterator[None]:
    """LayerNorms inside the block detach their standard deviation (values unchanged), so the gradient of
    what follows a norm is the linear map with the norm's scale frozen at this pass's value: direct logit
    attribution reads the classifier that way (this thread only; the relevance rules freeze it too)."""
    token = _FROZEN_NORMS.set(True)
    try:
        yield
    finally:
        _FROZEN_NORMS.reset(token)


@contextmanager
def frozen_attention() -> Iterator[None]:
    """Attention inside the block detaches its queries and keys (values unchanged), so every attention pattern is
    a constant of this pass and the gradient flows through the values alone: circuit-tracer's convention for an
    attribution graph's edges (this thread only; CP-LRP does the same for relevance)."""
    token = _FROZEN_ATTENTION.set(True)
    try:
        yield
    finally:
        _FROZEN_ATTENTION.reset(token)


def _stabilized(x: Tensor, epsilon: float) -> Tensor:
    """x moved away from 0 by epsilon, with its sign (+ for 0): zennit's `stabilize`."""
    return x + ((x == 0).to(x) + x.sign()) * epsilon


# ---- the rules as autograd functions: forward values unchanged, gradients modified ----------------

class _Gamma(torch.autograd.Function):
    """The generalised Gamma rule for an affine map z = A(x) + b (a linear layer or a convolution).

    `apply_weights(x, w)` computes x's image under weights w without bias; `transpose(g, w)` its
    transpose applied to an output gradient. The forward also computes P = A+(x+) + A-(x-), with
    which both denominators follow from z (N = z - b - P), so the rule costs two extra products
    forward and three backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, gamma, apply_weights, transpose):
        pos_w, neg_w = weight.clamp(min=0), weight.clamp(max=0)
        pos_x, neg_x = x.clamp(min=0), x.clamp(max=0)
        linear = apply_weights(x, weight)
        agreeing = apply_weights(pos_x, pos_w) + apply_weights(neg_x, neg_w)   # P
        z = linear if bias is None else linear + bias
        pos_b, neg_b = (0.0, 0.0) if bias is None else (bias.clamp(min=0), bias.clamp(max=0))
        denom_pos = z + gamma * (agreeing + pos_b)
        denom_neg = z + gamma * (linear - agreeing + neg_b)
        ctx.save_for_backward(x, weight, z, denom_pos, denom_neg)
        ctx.gamma, ctx.transpose = gamma, transpose
        return z

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, z, denom_pos, denom_neg = ctx.saved_tensors
        relevance = grad_out * z
        g_pos = torch.where(z > 0, relevance / _stabilized(denom_pos, GAMMA_STABILIZER), 0.0)
        g_neg = torch.where(z < 0, relevance / _stabilized(denom_neg, GAMMA_STABILIZER), 0.0)
        transpose = ctx.transpose
        pos_w, neg_w = weight.clamp(min=0), weight.clamp(max=0)
        plain = transpose(g_pos + g_neg, weight)                               # W^T (g+ + g-)
        favoured = transpose(g_pos, pos_w) + transpose(g_neg, neg_w)           # W+^T g+ + W-^T g-
        relevance_in = x * plain + ctx.gamma * (x.clamp(min=0) * favoured + x.clamp(max=0) * (plain - favoured))
        return relevance_in / _stabilized(x, INPUT_STABILIZER), None, None, None, None, None


class _ZPlus(torch.autograd.Function):
    """zennit's ZPlus (alpha 1, beta 0) for a convolution z = conv(x, W) + b: the relevance of an output goes to
    the contributions x+ W+ (with b+) and x- W-, in proportion."""

    @staticmethod
    def forward(ctx, x, weight, bias, conv, transpose):
        pos_w, neg_w = weight.clamp(min=0), weight.clamp(max=0)
        favoured = conv(x.clamp(min=0), pos_w) + bias.clamp(min=0) + conv(x.clamp(max=0), neg_w)
        z = conv(x, weight) + bias
        ctx.save_for_backward(x, weight, z, favoured)
        ctx.transpose = transpose
        return z

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, z, favoured = ctx.saved_tensors
        g = grad_out * z / _stabilized(favoured, GAMMA_STABILIZER)
        relevance_in = (x.clamp(min=0) * ctx.transpose(g, weight.clamp(min=0))
                        + x.clamp(max=0) * ctx.transpose(g, weight.clamp(max=0)))
        return relevance_in / _stabilized(x, INPUT_STABILIZER), None, None, None, None


class _Flat(torch.autograd.Function):
    """zennit's Flat rule for a convolution: an output's relevance shared equally among its window's inputs
    (all-ones weights, no bias, the inputs' values ignored)."""

    @staticmethod
    def forward(ctx, x, weight, bias, conv, transpose):
        ones = torch.ones_like(weight)
        z = conv(x, weight) + bias
        ctx.save_for_backward(x, ones, conv(torch.ones_like(x), ones), z)
        ctx.transpose = transpose
        return z

    @staticmethod
    def backward(ctx, grad_out):
        x, ones, count, z = ctx.saved_tensors
        relevance_in = ctx.transpose(grad_out * z / _stabilized(count, GAMMA_STABILIZER), ones)
        return relevance_in / _stabilized(x, INPUT_STABILIZER), None, None, None, None


class _Norm(torch.autograd.Function):
    """zennit's Norm rule (LRP-0 with its 1e-6 stabiliser) for a sum or a mean z of the inputs: R_i = x_i R / z. In
    gradient x input form the gradient is the output's, scaled by z / stabilised z."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        z = fn(*inputs)
        ctx.fn = fn
        ctx.save_for_backward(z, *inputs)
        return z

    @staticmethod
    def backward(ctx, grad_out):
        z, *inputs = ctx.saved_tensors
        scaled = grad_out * z / _stabilized(z, GAMMA_STABILIZER)
        with torch.enable_grad():   # the fn's own gradient (a sum: 1, a mean: 1 / n) for the scaled signal
            leaves = [x.detach().requires_grad_(True) for x in inputs]
            grads = torch.autograd.grad(ctx.fn(*leaves), leaves, scaled)
        return None, *grads


class _Identity(torch.autograd.Function):
    """R_in = R_out through an element-wise non-linearity f: the gradient is f(x) / x (lxt's form)."""

    @staticmethod
    def forward(ctx, fn, x):
        y = fn(x)
        ctx.save_for_backward(y / (x + INPUT_STABILIZER))
        return y

    @staticmethod
    def backward(ctx, grad_out):
        ratio, = ctx.saved_tensors
        return None, ratio * grad_out


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the gradient divided by `factor` (the uniform rule of a bilinear product)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out / ctx.factor, None


# ---- the layers the models are built from ----------------------------------------------------------

class GammaLinear(nn.Linear):
    """nn.Linear; under relevance rules, the Gamma rule with `gamma_linear`."""

    def forward(self, x: Tensor) -> Tensor:
        rules = _ACTIVE.get()
        if rules is None:
            return F.linear(x, self.weight, self.bias)
        return _Gamma.apply(x, self.weight, self.bias, rules.gamma_linear, _linear, _linear_transpose)


class GammaConv2d(nn.Conv2d):
    """nn.Conv2d; under relevance rules, the Gamma rule with `gamma_conv`."""

    def forward(self, x: Tensor) -> Tensor:
        rules = _ACTIVE.get()
        if rules is None:
            return self._conv_forward(x, self.weight, self.bias)
        size = x.shape

        def apply_weights(inputs: Tensor, weight: Tensor) -> Tensor:
            return F.conv2d(inputs, weight, None, self.stride, self.padding, self.dilation, self.groups)

        def transpose(grad: Tensor, weight: Tensor) -> Tensor:
            return torch.nn.grad.conv2d_input(size, weight, grad, self.stride, self.padding, self.dilation,
                                              self.groups)

        bias = None if self.bias is None else self.bias[:, None, None]
        return _Gamma.apply(x, self.weight, bias, rules.gamma_conv, apply_weights, transpose)


def conv_bn(x: Tensor, conv: nn.Conv2d, bn: nn.BatchNorm2d, *, first: bool = False) -> Tensor:
    """bn(conv(x)) (eval-mode BatchNorm); under relevance rules, the two as one convolution (zennit's
    MergeBatchNorm) taking `rules.conv`, or for the network's first convolution `rules.first_conv`."""
    rules = _ACTIVE.get()
    if rules is None:
        return bn(conv(x))
    scale = bn.weight / (bn.running_var + bn.eps).sqrt()
    weight = conv.weight * scale[:, None, None, None]
    bias = (bn.bias - bn.running_mean * scale + (0 if conv.bias is None else conv.bias * scale))[:, None, None]
    size = x.shape

    def apply_weights(inputs: Tensor, w: Tensor) -> Tensor:
        return F.conv2d(inputs, w, None, conv.stride, conv.padding, conv.dilation, conv.groups)

    def transpose(grad: Tensor, w: Tensor) -> Tensor:
        return torch.nn.grad.conv2d_input(size, w, grad, conv.stride, conv.padding, conv.dilation, conv.groups)

    rule = (rules.first_conv or rules.conv) if first else rules.conv
    if rule == "gamma":
        return _Gamma.apply(x, weight, bias, rules.gamma_conv, apply_weights, transpose)
    return (_Flat if rule == "flat" else _ZPlus).apply(x, weight, bias, apply_weights, transpose)


def relu(x: Tensor) -> Tensor:
    """F.relu, in place where no relevance rule keeps the tensor it would overwrite (a ResNet's activations: in
    place, as torchvision's and timm's, saves an allocation per activation); under relevance rules the rules
    keep the convolutions' outputs, so a copy."""
    return F.relu(x, inplace=_ACTIVE.get() is None)


def norm_sum(a: Tensor, b: Tensor) -> Tensor:
    """a + b (a residual addition); under a convolutional composite's rules, zennit's Norm rule for it."""
    rules = _ACTIVE.get()
    if rules is None or rules.conv == "gamma":
        return a + b
    return _Norm.apply(torch.add, a, b)


def norm_mean(x: Tensor) -> Tensor:
    """b c h w -> b c, the global average pool; under a convolutional composite's rules, zennit's Norm rule."""
    rules = _ACTIVE.get()
    if rules is None or rules.conv == "gamma":
        return x.mean(dim=(2, 3))
    return _Norm.apply(_spatial_mean, x)


def _spatial_mean(x: Tensor) -> Tensor:
    return x.mean(dim=(2, 3))


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    return F.linear(x, weight)


def _linear_transpose(grad: Tensor, weight: Tensor) -> Tensor:
    return grad @ weight


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm; under relevance rules or `frozen_norm_scales`, with its standard deviation detached."""

    def forward(self, x: Tensor) -> Tensor:
        if _ACTIVE.get() is None and not _FROZEN_NORMS.get():
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        centred = x - x.mean(dim=-1, keepdim=True)
        std = (centred.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt()
        return centred / std.detach() * self.weight + self.bias


class GELU(nn.GELU):
    """nn.GELU (exact); under relevance rules, the identity rule."""

    def forward(self, x: Tensor) -> Tensor:
        if _ACTIVE.get() is None:
            return F.gelu(x)
        return _Identity.apply(F.gelu, x)


class QuickGELU(nn.Module):
    """x sigmoid(1.702 x) (Microsoft's CvT); under relevance rules, the identity rule."""

    def forward(self, x: Tensor) -> Tensor:
        if _ACTIVE.get() is None:
            return _quick_gelu(x)
        return _Identity.apply(_quick_gelu, x)


def _quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


def attention_inputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values as the attention should see them: unchanged, or with the active rule."""
    rules = _ACTIVE.get()
    if rules is None:
        return (q.detach(), k.detach(), v) if _FROZEN_ATTENTION.get() else (q, k, v)
    if rules.attention == "cp":
        return q.detach(), k.detach(), v
    return _ScaleGradient.apply(q, 4.0), _ScaleGradient.apply(k, 4.0), _ScaleGradient.apply(v, 2.0)
