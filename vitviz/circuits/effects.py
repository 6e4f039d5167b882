"""What each node and edge of a circuit does to the answer: attribution patching, integrated gradients, and the
edges between consecutive sites (Marks et al. 2024, "Sparse feature circuits", arXiv 2403.19647).

The metric m is the target's logit, that minus the mean logit (circuit-tracer's default), or its difference to a
contrast class. At each site (`sites.py`) the rows it
reads are rebuilt exactly as decode(z) + ε, and the nodes are the concepts z (one node a concept, its codes summed
over the rows: where it fires is kept as its map) and the error ε (one node a site). A node taken out is set to its
baseline: z₀ = 0, ε₀ = 0 ("zero"), or each row's mean over a data set ("mean": `concepts.analysis.means`).

Attribution patching (one backward pass). With g = ∂m/∂X the model's own gradient at the site's block output and
g_rows = Wᵀ g its gradient at the rows (X' = X + W Δrows), the linear estimate of a node's effect is

    IE(z_c) = Σ_t (∂m/∂z)_{t,c} (z - z₀)_{t,c},   ∂m/∂z = g_rows · ∂decode/∂z   (decode is affine in z)
    IE(ε)   = Σ_t g_rows,t · (ε - ε₀)_t

the effect of the node being there rather than at its baseline, with everything after the site free to respond.
Integrated gradients (`steps` N, midpoints α_k = (k + ½)/N) make it exact in the limit: one site at a time, its
codes and error moved together along z₀ + α (z - z₀), ε₀ + α (ε - ε₀),

    IE_ig(z_c) = (1/N) Σ_k Σ_t ∂m/∂z_{t,c} |_(α_k) (z - z₀)_{t,c}        (and the same for ε)

and a site's node effects then add up to m(x) - m(x with every node of that site at its baseline): the
completeness of integrated gradients, which the tests check. It holds for the model's own gradients only: with
attention held fixed, each point of the path would hold its own patterns, and the effects would add up to no
model's change, so that pair is refused.

Edges. From an upstream node u at site i to a downstream node d at the next site j:

    IE(u → d) = Σ_t' ∇_d m_t' · ∂d_t'/∂u · Δu,      Δu = u - u₀ (summed over u's rows)

a vector-Jacobian product from d's score S_d = Σ_t' ∇_d m_t' · d_t' (∇_d m from the pass above, held fixed)
back to site i's codes and error, through the blocks between as the model runs them and the downstream
dictionary's encoder reading the result (its active set fixed: TopK's gradient). One batched pass computes every
downstream node's row at once. Into the first site every node's value comes from the input, so the input's edge
to a node is that node's effect; out of the last site the edge to the metric is the node's effect.

What a site does not read. The downstream site reads rows R X_j of its block's tokens; the rest, X_j - W R X_j
(tokens no row reads, a class token a patch dictionary leaves out, what cell means do not see), passes on
unmodelled. Its score is S_unread = Σ g_j ⊙ (X_j - W R X_j) with g_j = ∂m/∂X_j, and its edge from u the same
vector-Jacobian product. Because ∂m/∂z = g_rows · ∂decode/∂z, the scores of every downstream concept and the error
add up to g_rows · rows (the encoder's part cancels), so a node's edges into every downstream node plus its edge
into what is not read add up to g_j · ∂X_j/∂u · Δu: its attribution-patching effect (the tests check it).

Integrated gradients' edges. Along the upstream site's path (`Path`: what its integrated-gradients pass saw at the
next site), each step α_k has its own downstream gradients ∇_d m |_(α_k), and

    IE_ig(u → d) = (1/N) Σ_k ∇_d m |_(α_k) · ∂d/∂u |_(α_k) · Δu

one copy a step, every target's backward batched over them. At each step the decomposition above holds, so a
node's edges into every downstream node plus past the site add up to (1/N) Σ_k ∂m/∂u |_(α_k) · Δu: its
integrated-gradients effect.

Attention held fixed or not. With `frozen`, every attention pattern and every LayerNorm's scale are constants of
this photo's pass (`models.relevance.frozen_attention`, `frozen_norm_scales`), circuit-tracer's convention: the
gradients, and so effects and edges, are those of the model linear in everything else. Without, they are the
model's own. A CNN has no attention; its norms are BatchNorms, affine at inference.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from ..concepts.kinds.dictionary import ConceptsError
from ..models.relevance import frozen_attention, frozen_norm_scales
from ..models.trace import Trace
from .sites import Site

BASELINES = ("zero", "mean")
METHODS = ("atp", "ig")   # attribution patching, integrated gradients
IG_STEPS = 10             # Marks et al.'s
TARGETS = 256             # edge targets a batched backward takes at once
FROZEN_IG = ("Integrated gradients with attention held fixed are not offered: each point of the path would hold "
             "its own attention patterns, so the effects would add up to no model's change. Use attribution "
             "patching to hold attention fixed, or integrated gradients with the model's own attention.")


METRICS = ("logit", "logit minus mean", "contrast")


@dataclass(frozen=True)
class Metric:
    """m = logit[target]; with `centred`, logit[target] - the mean logit (circuit-tracer's default, which a shift
    of every logit does not move); with a `contrast`, logit[target] - logit[contrast]."""
    target: int
    contrast: int | None = None
    centred: bool = False

    def __call__(self, logits: Tensor) -> Tensor:
        m = logits[:, self.target]
        if self.contrast is not None:
            return m - logits[:, self.contrast]
        return m - logits.mean(1) if self.centred else m

    @property
    def kind(self) -> str:
        return METRICS[2] if self.contrast is not None else METRICS[1] if self.centred else METRICS[0]

    def describe(self, labels: Sequence[str]) -> str:
        if self.contrast is not None:
            return f"the logit of {labels[self.target]} minus that of {labels[self.contrast]}"
        return f"the logit of {labels[self.target]}" + (" minus the mean logit" if self.centred else "")


def check_metric(metric: Metric, labels: Sequence[str]) -> None:
    """Refuses classes outside the model's labels, in words."""
    for name, value in (("class", metric.target), ("contrast class", metric.contrast)):
        if value is not None and not 0 <= value < len(labels):
            raise ConceptsError(f"This model has {len(labels)} classes (0 to {len(labels) - 1}); there is no "
                                f"{name} {value}.")
    if metric.contrast is not None and metric.centred:
        raise ConceptsError("A metric is the logit minus the mean logit or minus a contrast class's, not both.")
    if metric.contrast is not None and metric.contrast == metric.target:
        raise ConceptsError("The contrast class is the target itself: pick another one, or none.")


@contextmanager
def gradients(frozen: bool) -> Iterator[None]:
    """The gradients of the passes inside: the model's own, or with attention patterns and norm scales frozen."""
    with ExitStack() as stack:
        if frozen:
            stack.enter_context(frozen_attention())
            stack.enter_context(frozen_norm_scales())
        yield


@dataclass
class Path:
    """What a site's integrated-gradients pass saw at the next site: at each step α_k of its path, ∂m at the next
    block's tokens, and from it at the next site's rows and codes (the downstream gradients of its edges)."""
    alphas: Tensor            # N
    token_gradient: Tensor    # N T d
    row_gradient: Tensor      # N rows d
    code_gradient: Tensor     # N rows n


@dataclass
class SiteState:
    """One site on the photo: its rows, codes and error (1 rows ·), the gradient of m at its rows and codes, the
    baseline, and each node's effect per row (`set_effects`) and summed over its rows."""
    rows: Tensor
    codes: Tensor
    error: Tensor
    token_gradient: Tensor   # 1 N d: ∂m/∂X at the block's tokens, what the site reads and what it does not
    row_gradient: Tensor
    code_gradient: Tensor
    codes_baseline: Tensor
    error_baseline: Tensor
    concept_effects: Tensor | None = None   # rows n: each concept's effect at each row
    error_effects: Tensor | None = None     # rows: the error's
    effects: Tensor | None = None           # n: each concept node's effect (summed over its rows)
    error_effect: Tensor | None = None      # the error node's (0-d: on the device, read with the rest)
    path: Path | None = None                # the next site along this site's integrated-gradients path

    def set_effects(self, concept_effects: Tensor, error_effects: Tensor) -> None:
        self.concept_effects, self.error_effects = concept_effects, error_effects
        self.effects, self.error_effect = concept_effects.sum(0), error_effects.sum()


def splice(site: Site, tokens: Tensor, codes: Tensor, error: Tensor, rows: Tensor) -> Tensor:
    """The block's tokens with the site's rows rebuilt from `codes` and `error`: X + W (decode(z) + ε - rows)."""
    return site.put(tokens, site.dictionary.decode(codes, rows) + error - rows)


def read(site: Site, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, codes, error) of a site on its block's tokens."""
    rows = site.rows(tokens)
    codes = site.dictionary.encode(rows)
    return rows, codes, rows - site.dictionary.decode(codes, rows)


def traced(loaded, pixels: Tensor, edit: Callable[[int, Tensor], Tensor] | None, *, grad: bool) -> Trace:
    """One traced forward with `edit`, no attention maps kept."""
    return loaded.model.trace(pixels, grad=grad, attention=False, edit=edit)


def attribution(loaded, pixels: Tensor, sites: Sequence[Site], metric: Metric, *, baseline: str = "zero",
                frozen: bool = False, on_host: bool = True) -> tuple[float | Tensor, list[SiteState]]:
    """(m on the photo, each site's state with attribution patching's effects) from one forward and backward; m
    read to the host, or without `on_host` left on the device (a 0-d tensor: work over many images reads once)."""
    if baseline not in BASELINES:
        raise ConceptsError(f"The baseline must be one of {', '.join(BASELINES)}, not {baseline!r}.")
    at = {site.block: position for position, site in enumerate(sites)}
    outputs: list[Tensor | None] = [None] * len(sites)

    def keep(index: int, tokens: Tensor) -> Tensor:
        if index in at:
            outputs[at[index]] = tokens
        return tokens

    with gradients(frozen):
        trace = traced(loaded, pixels[:1], keep, grad=True)
        m = metric(trace.logits)
        grads = [torch.zeros_like(t) if g is None else g   # a block the metric does not read
                 for t, g in zip(outputs, torch.autograd.grad(m.sum(), outputs, allow_unused=True))]
    states = []
    for site, tokens, grad in zip(sites, outputs, grads):
        with torch.no_grad():
            rows, codes, error = (t.detach() for t in read(site, tokens.detach()))
            row_gradient = site.row_gradient(grad)
        leaf = codes.clone().requires_grad_(True)
        with torch.enable_grad():
            (code_gradient,) = torch.autograd.grad(site.dictionary.decode(leaf, rows), leaf, row_gradient)
        codes_baseline, error_baseline = site.baseline(baseline, codes, error)
        state = SiteState(rows=rows, codes=codes, error=error, token_gradient=grad.detach(), row_gradient=row_gradient,
                          code_gradient=code_gradient, codes_baseline=codes_baseline, error_baseline=error_baseline)
        state.set_effects((code_gradient * (codes - codes_baseline))[0],
                          (row_gradient * (error - error_baseline)).sum(-1)[0])
        states.append(state)
    return float(m.detach()[0]) if on_host else m.detach()[0], states


def integrated_gradients(loaded, pixels: Tensor, sites: Sequence[Site], states: Sequence[SiteState],
                         metric: Metric, *, steps: int = IG_STEPS, frozen: bool = False) -> None:
    """Each site's node effects by integrated gradients (`steps` points on the straight path from the baseline),
    written into `states` in place of attribution patching's, with the next site's gradients along the path
    (`SiteState.path`, for the edges): a site's are one forward of the photo to it, of one copy a step from there
    on, and one backward."""
    if steps < 1:
        raise ConceptsError(f"Integrated gradients needs at least 1 step, not {steps}.")
    if frozen:
        raise ConceptsError(FROZEN_IG)
    alphas = (torch.arange(steps, dtype=torch.float32, device=pixels.device) + 0.5) / steps
    for position, (site, state) in enumerate(zip(sites, states)):
        along = alphas[:, None, None].to(state.codes)
        codes = (state.codes_baseline + along * (state.codes - state.codes_baseline)).requires_grad_(True)
        error = (state.error_baseline + along * (state.error - state.error_baseline)).requires_grad_(True)
        following = sites[position + 1] if position + 1 < len(sites) else None
        ahead: list[Tensor] = []   # the next site's block tokens, a copy a step

        def move(index: int, tokens: Tensor, site=site, codes=codes, error=error, following=following,
                 ahead=ahead) -> Tensor:
            if index == site.block:
                with torch.enable_grad():   # the photo up to the site, a copy a step from there
                    tokens = tokens.detach().expand(steps, *tokens.shape[1:])
                    return splice(site, tokens, codes, error, site.rows(tokens))
            if following is not None and index == following.block:
                ahead.append(tokens)
            return tokens

        m = metric(traced(loaded, pixels[:1], move, grad=True).logits)
        code_grads, error_grads, *token_grads = torch.autograd.grad(m.sum(), [codes, error, *ahead])
        state.set_effects((code_grads.mean(0) * (state.codes - state.codes_baseline)[0]).detach(),
                          (error_grads.mean(0) * (state.error - state.error_baseline)[0]).sum(-1).detach())
        if following is not None:
            state.path = _path(following, alphas, ahead[0].detach(), token_grads[0].detach())


def _path(site: Site, alphas: Tensor, tokens: Tensor, token_gradient: Tensor) -> Path:
    """The gradients at `site`'s rows and codes of each step's copy, from ∂m at its block's tokens."""
    with torch.no_grad():
        rows, codes, _ = read(site, tokens)
        row_gradient = site.row_gradient(token_gradient)
    leaf = codes.clone().requires_grad_(True)
    with torch.enable_grad():
        (code_gradient,) = torch.autograd.grad(site.dictionary.decode(leaf, rows), leaf, row_gradient)
    return Path(alphas=alphas, token_gradient=token_gradient, row_gradient=row_gradient, code_gradient=code_gradient)


class _Reached(Exception):
    """Carries the downstream scores out of a forward that need not go further."""

    def __init__(self, scores: Tensor):
        super().__init__()
        self.scores = scores


def edges_between(loaded, pixels: Tensor, upstream: tuple[Site, SiteState], downstream: tuple[Site, SiteState],
                  targets: Sequence[int | Sequence[int] | None], *, unread: bool = False, frozen: bool = False,
                  cells: bool = False) -> tuple[Tensor, Tensor]:
    """The edges into each of `targets` (a downstream concept id, several standing as one node whose score is their
    sum, or None: the error node) and, with `unread`, into what the downstream site does not read (one more row,
    the last), from every upstream node: (rows x n concept edges, rows error edges). Attribution patching's, or
    integrated gradients' where the upstream state holds its `path`. One forward of the photo (of one copy a step of
    the path from the upstream site on) to the downstream site, where every downstream node's score is read and the
    pass stops, and one backward batched over the targets (`TARGETS` at a time): no copy a target.

    With `cells`, the nodes are per position (`positions.py`): a target is a downstream row t's concept c or its
    error (c = n), index t (n + 1) + c, and the sources are every upstream row's concepts and error: (targets x
    upstream rows x n concept edges, targets x upstream rows error edges). The same pass: each upstream row gets
    its own scale, each downstream row's scores are read apart, so the edges per position sum to the edges above."""
    (up, up_state), (down, down_state) = upstream, downstream
    along = up_state.path
    n = down_state.codes.shape[-1]
    # a node's scale s (1 on the photo): its codes (or error) at a step are the baseline + (α - 1 + s) Δ, so ∂S/∂s is
    # ∂S/∂u · Δu summed over its rows, the edge
    if along is None:
        alphas = torch.ones(1, device=pixels.device)
        code_gradient, row_gradient, token_gradient = (down_state.code_gradient, down_state.row_gradient,
                                                       down_state.token_gradient)
    else:
        alphas = along.alphas
        code_gradient, row_gradient, token_gradient = along.code_gradient, along.row_gradient, along.token_gradient
    steps = len(alphas)
    moved_codes = up_state.codes - up_state.codes_baseline
    moved_error = up_state.error - up_state.error_baseline
    along_path = alphas[:, None, None].to(moved_codes) - 1
    width = moved_codes.shape[1] if cells else 1   # one scale a row, or one for all of a node's rows
    scale = torch.ones(steps, width, moved_codes.shape[-1], device=pixels.device, dtype=moved_codes.dtype,
                       requires_grad=True)
    error_scale = torch.ones(steps, width, 1, device=pixels.device, dtype=moved_error.dtype, requires_grad=True)

    def edit(index: int, tokens: Tensor) -> Tensor:
        with torch.enable_grad():
            if index == up.block:   # one photo up to here, then one copy a step
                tokens = tokens.detach().expand(steps, *tokens.shape[1:])
                codes = up_state.codes_baseline + (along_path + scale) * moved_codes
                error = up_state.error_baseline + (along_path + error_scale) * moved_error
                return splice(up, tokens, codes, error, up.rows(tokens))
            if index == down.block:   # every downstream node's score: steps x (concepts, the error, the unread)
                rows = down.rows(tokens)
                codes = down.dictionary.encode(rows)
                missed = rows - down.dictionary.decode(codes, rows)
                passed = tokens - down.put(torch.zeros_like(tokens), rows)   # X - W R X
                nodes = torch.cat([codes * code_gradient, (missed * row_gradient).sum(2, keepdim=True)], 2)
                nodes = nodes.flatten(1) if cells else nodes.sum(1)
                raise _Reached(torch.cat([nodes, (passed * token_gradient).sum((1, 2))[:, None]], 1))
        return tokens

    width_down = down_state.codes.shape[1] * (n + 1) if cells else n + 1
    picks = torch.zeros(len(targets) + unread, width_down + 1, device=pixels.device, dtype=moved_codes.dtype)
    for row, target in enumerate(targets):
        picks[row, n if target is None else list(target) if isinstance(target, Sequence) else target] = 1
    if unread:
        picks[-1, -1] = 1
    with gradients(frozen):
        try:
            traced(loaded, pixels[:1], edit, grad=True)
        except _Reached as reached:
            scores = reached.scores
        else:   # pragma: no cover - the downstream site is always a block of the trace
            raise AssertionError("the forward never reached the downstream site")
        concept_edges, error_edges = [], []
        for start in range(0, len(picks), TARGETS):
            part = picks[start:start + TARGETS]
            by_code, by_error = torch.autograd.grad(scores, [scale, error_scale], part[:, None].expand(-1, steps, -1),
                                                    retain_graph=True, is_grads_batched=True)
            concept_edges.append(by_code.mean(1) if cells else by_code.mean(1)[:, 0])
            error_edges.append(by_error.mean(1)[..., 0] if cells else by_error.mean(1).reshape(-1))
    return torch.cat(concept_edges).detach(), torch.cat(error_edges).detach()


def ablated(loaded, pixels: Tensor, sites: Sequence[Site], keep: Sequence[Tensor], *, baseline: str,
            keep_errors: Tensor | Sequence[Tensor] | bool = True, parents: Sequence[Tensor] | None = None) -> Tensor:
    """m's logits with, at every site in depth order, the concepts where `keep[s]` (b_s n bool, or b_s rows n: per
    row) is False set to their baseline (the others computed from the patched pass), and the errors kept (True, or
    b x sites bool; with `parents`, per site b_s bool, or b_s rows: per row) or at theirs: one forward of the photo
    to the first site, of b_s copies from each site on. `parents[s]` (b_s, for every site after the first) says which
    copy arriving at site s each of its copies continues, so copies alike up to a site run as one until there;
    without, every site has the same b copies.
    -> b_last x classes logits."""
    at = {site.block: position for position, site in enumerate(sites)}

    def errors_at(s: int, b: int) -> Tensor:
        if parents is not None:
            return keep_errors[s]
        if isinstance(keep_errors, Tensor):
            return keep_errors[:, s]
        return torch.full((b,), bool(keep_errors), device=pixels.device)

    def edit(index: int, tokens: Tensor) -> Tensor:
        if index not in at:
            return tokens
        s = at[index]
        site = sites[s]
        b = keep[s].shape[0]
        rows, codes, error = read(site, tokens)   # once for each copy arriving (the photo alone at the first site)
        if s > 0 and parents is not None:
            rows, codes, error, tokens = (t[parents[s]] for t in (rows, codes, error, tokens))
        codes_baseline, error_baseline = site.baseline(baseline, codes[:1], error[:1])   # the same for every copy
        rows, codes, error, tokens = (t.expand(b, *t.shape[1:]) for t in (rows, codes, error, tokens))
        kept, errors = keep[s], errors_at(s, b)
        codes = torch.where(kept if kept.ndim == 3 else kept[:, None, :], codes, codes_baseline)
        error = torch.where(errors[:, :, None] if errors.ndim == 2 else errors[:, None, None], error, error_baseline)
        return splice(site, tokens, codes, error, rows)

    with torch.inference_mode():
        return traced(loaded, pixels[:1], edit, grad=False).logits
