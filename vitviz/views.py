"""The views: what the tabs and the exporter draw of a run, each a function of a `ModelRun` and what is
asked of it (a method, a layer, a head, a point on the image, a share of the attention...).

A view returns captioned h w 3 uint8 images in the original image's frame, drawn by the pure renderers of
`render/` from what the run keeps (its trace, its canvas, the maps `ModelRun.token_map` computed and
cached); the views that need no class return (image, caption) pairs, the caption being what the app shows
as page text. A view keeps nothing: the maps it draws come from the run's cache, the rest from the kept
trace, so redrawing one for a slider move never reruns a model.

    run = session.explain_image(image, [vitviz.load("vit-cifar10")])[0]
    views.map_view(run, "rollout"), views.head_views(run, layer=0, fraction=0.6)

To add a view, write a function of (run, request) here, without touching `ModelRun`: read the run's trace,
canvas and maps (`run.token_map(method, ...)`, `run.attention_map(...)`), draw with `render`, and call it
from the tab (`vitviz/ui/<tab>.py`) and, if it is a file, from the exporter (`vitviz/export.py`). Say in
words why a model cannot be drawn (`run.no_attention`) rather than raising. Then remake the views'
fingerprints (`python -m tests.make_view_fingerprints`) with the new view among them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from einops import rearrange

from . import explain, render
from .render.grid import KIND_NAMES
from .session import ModelRun, centre_token


def map_view(run: ModelRun, method: str, *, values: np.ndarray | None = None, target: int | None = None,
             scale: tuple[float, float] | None = None, mode: str = "bilinear", style: str = "heatmap",
             cmap: str | None = None, **params) -> np.ndarray:
    """A method's map over the image with its colour bar; `values` (e.g. per-uniform units) and
    `scale` (vmin, vmax) let several panels share one colour scale. A signed map (relevance) is drawn
    on a scale symmetric about 0, in `render.SIGNED_CMAP` unless `cmap` says otherwise."""
    m = explain.method(method)
    if not run.applies(method):
        return render.caption(render.notice(run.canvas, run.no_attention(m.title)), model=run.name,
                              method=m.title)
    if values is None:
        values = run.token_map(method, target=target, **params)
    if scale is not None:
        vmin, vmax = scale
    elif m.signed:
        vmax = max(float(np.abs(values).max()), np.finfo(np.float32).tiny)
        vmin = -vmax
    else:
        vmin, vmax = float(values.min()), float(values.max())
    cmap = cmap or (render.SIGNED_CMAP if m.signed else render.DEFAULT_CMAP)
    view = render.overlay(run.canvas, values, mode=mode, style=style, cmap=cmap, vmin=vmin, vmax=vmax)
    view = render.with_colorbar(view, vmin=vmin, vmax=vmax, cmap=cmap)
    if m.targeted and not run.has_classifier:
        explained = run.explained_target(method, point=params.get("point"))
        return render.caption(view, model=run.name, method=f"{m.title} of {explained}")
    label = run.label(run.target(target)) if m.targeted else None
    return render.caption(view, model=run.name, method=m.title, target=label)


def attention_view(run: ModelRun, *, layer: int, head: int | None = None, point: tuple[float, float] | None = None,
                   direction: str = "row", cmap: str = render.DEFAULT_CMAP) -> np.ndarray:
    """One block's raw attention (`ModelRun.attention_map`) over the image with its colour bar: head `head`
    or the heads' mean, for the class token (or the centre token), or the token under the display `point`:
    where it looks, or with direction='column' who looks at it."""
    if not run.attends:
        return render.caption(render.notice(run.canvas, run.no_attention("attention map")), model=run.name,
                              method="attention", layer=layer + 1)
    values = run.attention_map(layer=layer, head=head, point=point, direction=direction)
    block = run.trace.blocks[layer]
    view = render.overlay(run.canvas, values, field=block.stage, cmap=cmap, point=point)
    what = ("who looks at the chosen token" if direction == "column" else
            "where the chosen token looks" if point is not None else
            f"where the {'class token' if block.prefix_kinds[:1] == ('cls',) else 'centre token'} looks")
    view = render.with_colorbar(view, vmin=float(values.min()), vmax=float(values.max()), cmap=cmap)
    return render.caption(view, model=run.name, method=f"attention: {what}", layer=layer + 1,
                          head="mean" if head is None else head + 1,
                          note=f"stage {block.stage + 1}" if len(run.trace.embeddings) > 1 else None)


def grid_views(run: ModelRun, *, point: tuple[float, float] | None = None) -> list[np.ndarray]:
    """How the model cuts the image into tokens: ViT's patch grid, or each CvT stage's lattice, with what
    they show written on them (files that travel alone)."""
    if _patch_grid(run):
        kinds = run.trace.blocks[0].prefix_kinds
        view = render.patch_grid(run.canvas, prefix_kinds=kinds, point=point)
        return [render.caption(view, model=run.name, method="patch grid",
                               note=render.prefix_legend(kinds, run.canvas.fields[0].grid))]
    return [render.caption(view, model=run.name, method=f"stage {i + 1} tokens")
            for i, view in enumerate(render.stage_grids(run.canvas, point=point))]


def grid_gallery(run: ModelRun, *, point: tuple[float, float] | None = None) -> list[tuple[np.ndarray, str]]:
    """`grid_views` for a page: the drawings, with what they say as captions (page text) rather than pixels."""
    if _patch_grid(run):
        kinds = run.trace.blocks[0].prefix_kinds
        return [(render.patch_grid(run.canvas, prefix_kinds=kinds, point=point),
                 f"{run.name} · patch grid · {render.prefix_legend(kinds, run.canvas.fields[0].grid)}")]
    return [(view, f"{run.name} · " + "; ".join(render.stage_lines(run.canvas, i, point=point)))
            for i, view in enumerate(render.stage_grids(run.canvas, point=point, legend=False))]


def _patch_grid(run: ModelRun) -> bool:
    """Whether the model's tokens are one grid of non-overlapping patches (ViT), not overlapping stages."""
    fields = run.canvas.fields
    return len(fields) == 1 and fields[0].stride == fields[0].size


def stage_views(run: ModelRun) -> list[np.ndarray]:
    """Per stage: the features' first three principal components as RGB, and the per-token norms."""
    views = []
    for i, features in enumerate(run.trace.features):
        views.append(render.caption(render.stage_pca(run.canvas, features[0], stage=i), model=run.name,
                                    method=f"stage {i + 1} features: PCA as RGB"))
        views.append(render.caption(render.feature_norm(run.canvas, features[0], stage=i), model=run.name,
                                    method=f"stage {i + 1} features: token L2 norm"))
    return views


def channel_view(run: ModelRun, stage: int) -> np.ndarray:
    """The most active channels of stage `stage`'s feature map, each over the image (`render.channel_gallery`)."""
    return render.caption(render.channel_gallery(run.canvas, run.trace.features[stage][0], stage=stage),
                          model=run.name, method=f"stage {stage + 1}: most active channels")


def norm_view(run: ModelRun, layer: int) -> np.ndarray:
    """Each token's L2 norm at block `layer` over the image, with the prefix tokens' norms written beside it."""
    grids, prefixes = explain.token_norms(run.trace)
    block = run.trace.blocks[layer]
    prefix = {name: float(v) for name, v in zip(_prefix_names(block.prefix_kinds), prefixes[layer][0])}
    view = render.token_norm_map(run.canvas, grids[layer][0], field=block.stage, prefix_norms=prefix)
    return render.caption(view, model=run.name, method="token norms", layer=layer + 1)


def _query(run: ModelRun, layer: int, point) -> explain.attention.Token:
    """The token whose attention a view shows: the one under the display `point`, else the class token
    (a model or CvT stage without one: the centre token)."""
    block = run.trace.blocks[layer]
    token = run.token_at(point, block) if point is not None else None
    if token is not None:
        return token
    return "cls" if "cls" in block.prefix_kinds else centre_token(block)


def _token_words(token: explain.attention.Token) -> str:
    return "the class token" if token == "cls" else f"the token at row {token[0]}, column {token[1]}"


def head_views(run: ModelRun, *, layer: int = -1, point: tuple[float, float] | None = None,
               fraction: float | None = None, style: str = "outline") -> tuple[list[tuple[np.ndarray, str]], str]:
    """Every head of block `layer` (default the last): where the class token (or the token under the display
    `point`) looks, each head on its own colour scale, their mean first. With `fraction`, each map's
    smallest token set holding that share of its attention (`explain.mass_threshold`), drawn as `style`:
    'outline' or 'mask'. -> (the views with short captions, one line that says what they all show)."""
    layer = range(len(run.trace.blocks))[layer]
    if not run.attends:
        return [(render.notice(run.canvas, run.no_attention("attention head")), "no attention")], \
            run.no_attention("attention head")
    block, token = run.trace.blocks[layer], _query(run, layer, point)
    maps = explain.head_attention(run.trace, layer=layer, query=token, on_query_grid=True)[0]   # h gh gw
    maps = torch.cat([maps.mean(dim=0, keepdim=True), maps])
    masks = explain.mass_threshold(maps, fraction).numpy() if fraction else [None] * len(maps)
    views = []
    for k, (values, mask) in enumerate(zip(maps.numpy(), masks)):
        image = render.head_tile(run.canvas, values, field=block.stage, mask=mask, style=style, point=point)
        head = f"mean of the {len(maps) - 1} heads" if k == 0 else f"head {k}"
        views.append((image, head if mask is None else f"{head} · {int(mask.sum())} of {mask.size} tokens"))
    kept = "" if fraction is None else (f"; {'outlined' if style == 'outline' else 'unmasked'}: the fewest tokens "
                                        f"holding {fraction:.0%} of each map's attention")
    return views, (f"{run.name}, layer {layer + 1}: where {_token_words(token)} looks, every head on its own "
                   f"colour scale{kept}")


def model_view(run: ModelRun, *, point: tuple[float, float] | None = None, fraction: float | None = None,
               style: str = "outline", side: int = 160) -> list[tuple[np.ndarray, str]]:
    """Every layer x head (the "model view"): per layer, its heads as `side`-px tiles in one row, head 1
    on the left, for the class token or the token under the display `point` (`head_views`' options)."""
    if not run.attends:
        return [(render.notice(run.canvas, run.no_attention("attention head")), "no attention")]
    views = []
    for layer, block in enumerate(run.trace.blocks):
        token = _query(run, layer, point)
        maps = explain.head_attention(run.trace, layer=layer, query=token, on_query_grid=True)[0]
        masks = explain.mass_threshold(maps, fraction).numpy() if fraction else None
        strip = render.layer_strip(run.canvas, maps.numpy(), field=block.stage, masks=masks, style=style, side=side)
        views.append((strip, f"layer {layer + 1}: heads 1-{len(maps)}, left to right; {_token_words(token)}"))
    return views


def window_views(run: ModelRun, *, layer: int,
                 point: tuple[float, float] | None = None) -> list[tuple[np.ndarray, str]]:
    """Block `layer`'s windows (`render.window_view`) and the grid as it partitions it after its roll
    (`render.rolled_view`), the token under the display `point` with the keys it sees; a model whose
    attention is global, or that has none, gets one view saying so."""
    block = run.trace.blocks[layer]
    part = block.windows
    if part is None:
        what = (run.no_attention("attention window") if not run.attends else
                f"{run.name} attends globally: every token of a block sees every other one (one window "
                f"of the whole {block.key_grid[0]}x{block.key_grid[1]} key grid).")
        return [(render.notice(run.canvas, what), what)]
    stride = run.canvas.fields[block.stage].stride
    shifted = (f"shifted by {part.shift} tokens ({part.shift * stride} px): the windows of the last row and "
               f"column wrap around the edges, and the parts of one window (the same number) are kept apart by "
               f"the mask" if part.shift else "regular windows (no shift)")
    return [(render.window_view(run.canvas, part, stage=block.stage, point=point),
             f"{run.name} · layer {layer + 1}: {part.count[0] * part.count[1]} windows of {part.size}x{part.size} "
             f"tokens ({part.size * stride} px), {shifted}"),
            (render.rolled_view(run.canvas, part, stage=block.stage, point=point),
             f"{run.name} · layer {layer + 1}: the {part.grid[0]}x{part.grid[1]} grid as the block cuts it"
             + (f", after rolling it by -{part.shift} tokens on both axes; dashed: where the rows and columns the "
                f"roll wrapped around begin" if part.shift else " (this block does not roll it)"))]


def feature_pca_view(run: ModelRun) -> tuple[np.ndarray, str]:
    """The DINOv2 paper's picture of the last layer's patch features (`render.foreground_pca`): a ViT's
    patch tokens through the final norm, as DINOv2 shows them; a CvT's stage-3 feature map."""
    stage = len(run.trace.features) - 1
    if run.trace.final_tokens is not None:
        block = run.trace.blocks[-1]
        h, w = block.query_grid
        features = rearrange(run.trace.final_tokens[0, block.prefix:], '(h w) c -> c h w', h=h, w=w)
    else:
        features = run.trace.features[stage][0]
    view, foreground = render.foreground_pca_view(run.canvas, features, stage=stage)
    return view, (f"{run.name} · last layer's patch features: the first three principal components of the "
                  f"{int(foreground.sum())} foreground tokens (of {foreground.size}) as red, green and blue; the "
                  f"background (black) is the side of the first component's mean that holds more of the border")


def artefact_views(run: ModelRun, *,
                   layer: int = -1) -> tuple[list[tuple[np.ndarray, str]], list[tuple[np.ndarray, str]], str]:
    """The high-norm artefact tokens of block `layer` (`explain.artefact_tokens`): (the token norms with them
    ringed and the class token's attention (head mean) with them ringed; each register's own attention,
    [] without registers; a summary in words: their count, the share of the class token's attention on them)."""
    layer = range(len(run.trace.blocks))[layer]
    block = run.trace.blocks[layer]
    field = run.canvas.fields[block.stage]
    grids, prefixes = explain.token_norms(run.trace)
    norms = grids[layer][0].numpy()
    artefacts = explain.artefact_tokens(run.trace, layer=layer)[0].numpy()
    count, median = int(artefacts.sum()), float(np.median(norms))
    found = {0: "no high-norm tokens", 1: "1 high-norm token"}.get(count, f"{count} high-norm tokens")
    prefix = ", ".join(f"{name} {float(v):.3g}" for name, v in zip(_prefix_names(block.prefix_kinds),
                                                                   prefixes[layer][0]))
    views = [(render.token_norm_map(run.canvas, norms, field=field, legend=False),
              f"{run.name} · token norms at layer {layer + 1}: median {median:.3g}, largest {norms.max():.3g}; "
              f"{found}" + (" (ringed)" if count else "") + (f"; {prefix}" if prefix else ""))]
    summary = (f"**{run.name}**, layer {layer + 1}: **{found}** (a norm more than {explain.OUTLIER_Z:g} robust "
               f"standard deviations above the median, {median:.3g})")
    if "cls" in block.prefix_kinds:
        attention = explain.query_attention(run.trace, layer=layer, query="cls", on_query_grid=True)[0].numpy()
        view = render.overlay(run.canvas, attention, field=field)
        render.ring_tokens(view, run.canvas, artefacts, field=field)
        share = float(attention[artefacts].sum() / attention.sum())
        on_them = f": {share:.0%} of it on the {found} (ringed)" if count else ""
        views.append((view, f"{run.name} · where the class token looks at layer {layer + 1} (head mean){on_them}"))
        summary += f", which draw {share:.0%} of the class token's attention" if count else ""
    registers = []
    for n, k in enumerate(k for k, kind in enumerate(block.prefix_kinds) if kind == "reg"):
        attention = explain.query_attention(run.trace, layer=layer, query=k, on_query_grid=True)[0].numpy()
        registers.append((render.overlay(run.canvas, attention, field=field),
                          f"{run.name} · where register {n + 1} looks at layer {layer + 1} (head mean)"))
    summary += f"; {len(registers)} register tokens" if registers else "; no register tokens"
    return views, registers, summary + "."


def _prefix_names(kinds: Sequence[str]) -> list[str]:
    """'class token', 'register 1', 'register 2', ...: the prefix tokens by kind, numbered where a kind repeats."""
    names = [KIND_NAMES.get(k, k) for k in kinds]
    return [f"{name} {names[:i + 1].count(name)}" if names.count(name) > 1 else name for i, name in enumerate(names)]

