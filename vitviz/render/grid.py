"""What a token is, drawn on the image: ViT's patch grid with token indices; each stage's token-centre
lattice with a few of its (overlapping) windows, for CvT's convolutional embeddings or any model."""
from __future__ import annotations

import math

import cv2
import numpy as np

from .canvas import Canvas
from .captions import BLACK, HIGHLIGHTS, WHITE, place, put_text, text_box, wrap
from .geometry import Field
from .overlay import mark_point

KIND_NAMES = {"cls": "class token", "dist": "distillation token", "reg": "register"}
GRID_DIM = 0.7     # the image is dimmed under grid drawings so lines and labels stand out
DIM_TABLE = (np.arange(256) * GRID_DIM).astype(np.uint8)   # per value: one lookup per pixel, not a float product
INSET_SIZE = 0.45  # magnified inset of small windows: this fraction of the view's shorter side


def prefix_legend(prefix_kinds: tuple[str, ...], grid: tuple[int, int]) -> str:
    """'token 0: class token; tokens 1-196: the 14x14 patches, row by row' (for the caption's note)."""
    parts = [f"token {k}: {KIND_NAMES.get(kind, kind)}" for k, kind in enumerate(prefix_kinds)]
    first, last = len(prefix_kinds), len(prefix_kinds) + grid[0] * grid[1] - 1
    parts.append(f"tokens {first}-{last}: the {grid[0]}x{grid[1]} patches, row by row")
    return "; ".join(parts)


def dimmed(canvas: Canvas, field: Field) -> np.ndarray:
    """The photo dimmed where the model saw it and shaded where it did not (kept on the canvas: copy it to draw): what a
    grid or a window layout is drawn over."""
    def build():
        out = canvas.shaded(field).copy()
        seen = canvas.seen_slices(field)
        out[seen] = cv2.LUT(out[seen], DIM_TABLE)
        return out
    return canvas.cached(("dimmed", canvas.frame.seen_box(field)), build)


def _box(canvas: Canvas, field: Field, i: int, j: int) -> tuple[int, int, int, int]:
    return tuple(int(round(v)) for v in canvas.frame.box_to_display(field.box(i, j)))


def patch_grid(canvas: Canvas, *, prefix_kinds: tuple[str, ...] = (), stage: int = 0,
               point: tuple[float, float] | None = None) -> np.ndarray:
    """A ViT's non-overlapping patches on the image, each labelled with its index in the token sequence
    (prefix tokens first: see `prefix_legend`); `point` (display x, y) highlights the token under it."""
    field = canvas.fields[stage]
    if field.stride != field.size:
        raise ValueError(f"stage {stage} windows overlap (size {field.size}, stride {field.stride}): "
                         "draw it with stage_grids")
    out = canvas.cached(("patch_grid", field, prefix_kinds),
                        lambda: _draw_patch_grid(canvas, field, prefix_kinds)).copy()
    if point is not None:
        _highlight_patch(out, canvas, field, prefix_kinds, point)
    return out


def _draw_patch_grid(canvas: Canvas, field: Field, prefix_kinds: tuple[str, ...]) -> np.ndarray:
    out, ink, (gh, gw) = dimmed(canvas, field).copy(), canvas.ink, field.grid
    xs, _ = canvas.frame.to_display(field.start(np.arange(gw + 1)), 0.0)
    _, ys = canvas.frame.to_display(0.0, field.start(np.arange(gh + 1)))
    xs, ys = np.round(xs).astype(int), np.round(ys).astype(int)
    lines = out.copy()
    for x in xs:
        cv2.line(lines, (x, ys[0]), (x, ys[-1]), WHITE, ink.line)
    for y in ys:
        cv2.line(lines, (xs[0], y), (xs[-1], y), WHITE, ink.line)
    out = cv2.addWeighted(lines, 0.6, out, 0.4, 0)
    # labels: as large as fits a cell (down to 60% of the body size); thinned out where even that won't fit
    cell = min(np.diff(xs).min(), np.diff(ys).min())
    widest = str(len(prefix_kinds) + gh * gw - 1)
    scale = float(np.clip(0.8 * cell / ink.text_size(widest)[0], 0.6, 1.2))
    every = max(1, math.ceil((ink.text_size(widest, scale)[0] + 4) / cell))
    centres_x, centres_y = canvas.frame.to_display(field.centre(np.arange(gw)), field.centre(np.arange(gh)))
    for i in range(0, gh, every):
        for j in range(0, gw, every):
            centre = int(round(float(centres_x[j]))), int(round(float(centres_y[i])))
            put_text(out, str(len(prefix_kinds) + i * gw + j), centre, ink, scale=scale, anchor="centre")
    return out


def _highlight_patch(out: np.ndarray, canvas: Canvas, field: Field, prefix_kinds, point) -> None:
    ink = canvas.ink
    token = canvas.token_at(point, field)
    if token is None:
        mark_point(out, point, ink)
        text_box(out, ["this point was cropped away:", "the model never saw it"], ink)
        return
    i, j = token
    box = _box(canvas, field, i, j)
    cv2.rectangle(out, box[:2], box[2:], BLACK, 2 * ink.line + 3)
    cv2.rectangle(out, box[:2], box[2:], HIGHLIGHTS[0], 2 * ink.line + 1)
    index = len(prefix_kinds) + i * field.grid[1] + j
    text_box(out, [f"token {index}: row {i}, column {j} of {field.grid[0]}x{field.grid[1]}"], ink, near=box)


def stage_grids(canvas: Canvas, *, point: tuple[float, float] | None = None, legend: bool = True) -> list[np.ndarray]:
    """Per stage, the token-centre lattice and the receptive fields of a 2x2 block of neighbouring
    tokens (so their overlap shows; magnified in an inset when small), with `legend` the stage's
    embedding, effective stride and receptive field written on it (`stage_lines`: the same in words,
    for page text). The block starts at the token under `point` (display x, y: the same point picks
    the matching token in every stage and every model), else near the centre of what the model saw."""
    return [_draw_stage(canvas, stage, point, legend) for stage in range(len(canvas.fields))]


def stage_lines(canvas: Canvas, stage: int, *, point: tuple[float, float] | None = None) -> list[str]:
    """What `stage_grids` writes on stage `stage`'s lattice: its tokens, embedding window, effective stride
    and receptive field, and which token the block starts at."""
    anchor, cropped = _anchor(canvas, canvas.fields[stage], point)
    return _stage_lines(canvas, stage, anchor) + (["(the chosen point was cropped away)"] if cropped else [])


def _draw_stage(canvas: Canvas, stage: int, point, legend: bool) -> np.ndarray:
    field, ink, (h, w) = canvas.fields[stage], canvas.ink, canvas.size
    base = canvas.cached(("lattice", field), lambda: _lattice(canvas, field, dimmed(canvas, field), 0, 0, 1.0))
    out = base.copy()
    anchor, _ = _anchor(canvas, field, point)
    block = _block(field, anchor)
    _draw_windows(out, canvas, field, block, 0, 0, 1.0)
    # the region around the block, magnified in a corner when the windows are too small to read
    boxes = [_box(canvas, field, i, j) for i, j in block]
    pad = field.stride * (w / canvas.frame.transform.resized_size(canvas.frame.image_size)[1])
    region = (max(0, min(b[0] for b in boxes) - pad), max(0, min(b[1] for b in boxes) - pad),
              min(w, max(b[2] for b in boxes) + pad), min(h, max(b[3] for b in boxes) + pad))
    region = tuple(int(round(v)) for v in region)
    avoid = [region]
    side = max(region[2] - region[0], region[3] - region[1])
    if side < INSET_SIZE * min(h, w) / 2:
        zoom = INSET_SIZE * min(h, w) / side
        inset = _inset(canvas, field, block, region, zoom)
        x0, y0, x1, y1 = place((inset.shape[1], inset.shape[0]), (h, w), avoid=avoid, margin=ink.line * 2)
        out[y0:y1, x0:x1] = inset[:y1 - y0, :x1 - x0]
        cv2.rectangle(out, region[:2], region[2:], WHITE, 1)
        avoid.append((x0, y0, x1, y1))
    if legend:
        text_box(out, stage_lines(canvas, stage, point=point), ink, avoid=avoid, scale=0.9)
    return out


def _anchor(canvas: Canvas, field: Field, point) -> tuple[tuple[int, int], bool]:
    """(the token under `point`, else the one nearest the centre of what the model saw; whether
    `point` was given but cropped away)."""
    token = canvas.token_at(point, field) if point is not None else None
    if token is not None:
        return token, False
    (gh, gw), (x0, y0, x1, y1) = field.grid, canvas.frame.seen_box(field)
    return (int(np.clip(field.index((y0 + y1) / 2), 0, gh - 1)),
            int(np.clip(field.index((x0 + x1) / 2), 0, gw - 1))), point is not None


def _block(field: Field, anchor: tuple[int, int]) -> list[tuple[int, int]]:
    """The anchor token and its right, lower and diagonal neighbours (leftwards/upwards at the edge)."""
    (gh, gw), (i, j) = field.grid, anchor
    di, dj = (1 if i + 1 < gh else -1), (1 if j + 1 < gw else -1)
    return list(dict.fromkeys([(i, j), (i, j + dj), (i + di, j), (i + di, j + dj)]))


def _inset(canvas: Canvas, field: Field, block, region, zoom: float) -> np.ndarray:
    x0, y0, x1, y1 = region
    crop = dimmed(canvas, field)[y0:y1, x0:x1]
    inset = cv2.resize(crop, (round((x1 - x0) * zoom), round((y1 - y0) * zoom)), interpolation=cv2.INTER_NEAREST)
    inset = _lattice(canvas, field, inset, x0, y0, zoom)
    _draw_windows(inset, canvas, field, block, x0, y0, zoom)
    cv2.rectangle(inset, (0, 0), (inset.shape[1] - 1, inset.shape[0] - 1), WHITE, canvas.ink.line)
    return inset


def _lattice(canvas: Canvas, field: Field, image: np.ndarray, x0: float, y0: float, zoom: float) -> np.ndarray:
    """White dots at every token centre of `field`, drawn on a copy of `image`, which shows the display
    from (x0, y0) magnified by `zoom`; dots shrink to single pixels where the lattice is dense."""
    out, (gh, gw) = image.copy(), field.grid
    xs, ys = canvas.frame.to_display(field.centre(np.arange(gw)), field.centre(np.arange(gh)))
    xs, ys = (np.asarray(xs) - x0) * zoom, (np.asarray(ys) - y0) * zoom
    xs, ys = xs[(xs >= 0) & (xs < out.shape[1])], ys[(ys >= 0) & (ys < out.shape[0])]
    spacing = min(np.diff(xs).min() if len(xs) > 1 else np.inf, np.diff(ys).min() if len(ys) > 1 else np.inf)
    if spacing < 7:
        px, py = np.meshgrid(xs.astype(int), ys.astype(int))
        out[py, px] = WHITE
        return cv2.addWeighted(out, 0.7, image, 0.3, 0)
    radius = 1 if spacing < 16 else 2 + canvas.ink.line // 2
    for y in np.round(ys).astype(int):
        for x in np.round(xs).astype(int):
            cv2.circle(out, (x, y), radius, WHITE, -1, cv2.LINE_AA)
    return cv2.addWeighted(out, 0.75, image, 0.25, 0)


def _draw_windows(out: np.ndarray, canvas: Canvas, field: Field, block, x0: float, y0: float, zoom: float) -> None:
    """The receptive fields of the `block` tokens, translucent fills and outlines, in place."""
    ink = canvas.ink

    def px(box):
        return tuple(int(round((v - o) * zoom)) for v, o in zip(box, (x0, y0, x0, y0)))
    boxes = [px(canvas.frame.box_to_display(field.box(i, j))) for i, j in block]
    # the fills blended inside the rectangle around them only: elsewhere the blend of a pixel with itself is itself
    h, w = out.shape[:2]
    left, top = max(0, min(b[0] for b in boxes)), max(0, min(b[1] for b in boxes))
    right, bottom = min(w, max(b[2] for b in boxes) + 1), min(h, max(b[3] for b in boxes) + 1)
    if right > left and bottom > top:
        region = out[top:bottom, left:right]
        fill = region.copy()
        for k, b in enumerate(boxes):
            cv2.rectangle(fill, (b[0] - left, b[1] - top), (b[2] - left, b[3] - top), HIGHLIGHTS[k], -1)
        region[:] = cv2.addWeighted(fill, 0.2, region, 0.8, 0)
    for k, ((i, j), b) in enumerate(zip(block, boxes)):
        cv2.rectangle(out, b[:2], b[2:], HIGHLIGHTS[k], ink.line, cv2.LINE_AA)
        x, y = canvas.frame.to_display(field.centre(j), field.centre(i))
        centre = px((float(x), float(y), 0.0, 0.0))[:2]
        cv2.circle(out, centre, ink.line + 1 + round(zoom > 1), HIGHLIGHTS[k], -1, cv2.LINE_AA)


def _stage_lines(canvas: Canvas, stage: int, anchor: tuple[int, int]) -> list[str]:
    field, window = canvas.fields[stage], canvas.embeddings[stage].window
    over = f"stage {stage} tokens" if stage else "pixels"
    (_, w), (_, rw) = canvas.frame.image_size, canvas.frame.transform.resized_size(canvas.frame.image_size)
    return [f"stage {stage + 1}: {field.grid[0]}x{field.grid[1]} tokens; orange = token {anchor}",
            f"{window.kernel}x{window.kernel} window, stride {window.stride}, pad {window.padding} on {over}",
            f"effective stride {field.stride} px, receptive field {field.size} px",
            f"(model-input px; 1 px = {w / rw:.2f} px of the original)"]


def notice(canvas: Canvas, text: str) -> np.ndarray:
    """The photo, dimmed, with `text` written across it: a view that says why there is nothing to draw (a
    convolutional network's attention), so the other model's column still shows its own."""
    field = canvas.fields[-1]
    out = (dimmed(canvas, field) * 0.6).astype(np.uint8)
    ink = canvas.ink
    width = int(0.8 * canvas.size[1])
    text_box(out, wrap(text, width, ink), ink)
    return out
