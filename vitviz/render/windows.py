"""Windowed attention on the photo (Swin): the windows a block attends within, the shifted windows and the
sub-windows their mask keeps apart, and the grid as the block sees it after its roll.

`window_view` colours every token by its window on the image as it is: a regular block's windows are
squares; a shifted block's are the same squares moved by the shift, and those of its last row and column
wrap around the edges, holding tokens from both sides of the image, which the mask keeps apart (drawn as
dashed borders inside one colour). `rolled_view` draws what the block partitions: the token grid rolled by
-shift (`torch.roll`), where every window is a plain square again. A clicked token gets its window (the
keys it can see) outlined in both.
"""
from __future__ import annotations

import cv2
import numpy as np

from ..models.trace import WindowPartition
from .canvas import Canvas
from .captions import BLACK, HIGHLIGHTS, WHITE, put_text, text_box
from .geometry import Field
from .grid import dimmed

FILL = 0.35   # opacity of the window colours over the photo
PALETTE = np.array(HIGHLIGHTS, np.uint8)


def token_windows(part: WindowPartition) -> tuple[np.ndarray, np.ndarray]:
    """(h w window index of every token, h w mask region inside its window): two tokens attend to each other
    iff both agree. Regions are timm's bands on the padded, rolled grid (0 everywhere without a shift)."""
    (h, w), index = part.grid, part.index.numpy()
    window = np.empty(h * w + 1, np.int64)
    window[index] = np.arange(len(index))[:, None]
    region = np.zeros(h * w + 1, np.int64)
    if part.shift:
        hp, wp = part.padded
        bands = [np.zeros(n, np.int64) for n in (hp, wp)]
        for band, n in zip(bands, (hp, wp)):
            band[n - part.size:n - part.shift], band[n - part.shift:] = 1, 2
        rows, cols = np.arange(h), np.arange(w)   # token (i, j) sits at ((i - shift) % h, (j - shift) % w) rolled
        rolled = bands[0][(rows - part.shift) % h][:, None] * 3 + bands[1][(cols - part.shift) % w][None, :]
        region[:h * w] = rolled.reshape(-1)
    return window[:h * w].reshape(h, w), region[:h * w].reshape(h, w)


def _colours(windows: np.ndarray, count: tuple[int, int]) -> np.ndarray:
    """h w 3: neighbouring windows in different colours (a 2x3 tiling of the palette over window rows, columns)."""
    rows, cols = windows // count[1], windows % count[1]
    return PALETTE[(rows % 2) * 3 + cols % 3]


def window_view(canvas: Canvas, part: WindowPartition, *, stage: int, point: tuple[float, float] | None = None
                ) -> np.ndarray:
    """The block's windows over the photo; a shifted block's wrapped windows with their mask's borders dashed;
    `point` (display x, y) outlines the token under it and the keys it sees."""
    field = canvas.fields[stage]
    windows, regions = token_windows(part)
    out = dimmed(canvas, field).copy()
    boxes = _token_boxes(canvas, field)
    fill = out.copy()
    colours = _colours(windows, part.count)
    for i, j in np.ndindex(*windows.shape):
        x0, y0, x1, y1 = boxes[i, j]
        cv2.rectangle(fill, (x0, y0), (x1, y1), tuple(int(c) for c in colours[i, j]), -1)
    out = cv2.addWeighted(fill, FILL, out, 1 - FILL, 0)
    ink = canvas.ink
    _borders(out, boxes, windows, regions, ink.line)
    _label_wrapped(out, boxes, windows, regions, ink)
    if point is not None:
        _highlight(out, canvas, field, boxes, windows, regions, point)
    return out


def rolled_view(canvas: Canvas, part: WindowPartition, *, stage: int, point: tuple[float, float] | None = None,
                side: int = 512) -> np.ndarray:
    """The block's token grid as it partitions it: rolled by -shift on both axes, cut into plain windows; the
    token under `point` marked where the roll put it, with its window."""
    field = canvas.fields[stage]
    (h, w), ink = part.grid, canvas.ink
    cell = max(2, side // max(h, w))
    rows, cols = canvas.seen_slices(field)
    seen = cv2.resize(canvas.image[rows, cols], (w * cell, h * cell), interpolation=cv2.INTER_AREA)
    rolled = np.roll(seen, shift=(-part.shift * cell, -part.shift * cell), axis=(0, 1))
    hp, wp = part.padded
    out = np.full((hp * cell, wp * cell, 3), 40, np.uint8)   # padding positions: dark
    out[:h * cell, :w * cell] = (rolled * 0.75).astype(np.uint8)
    for k in range(0, hp + 1, part.size):
        cv2.line(out, (0, k * cell), (wp * cell, k * cell), WHITE, ink.line)
    for k in range(0, wp + 1, part.size):
        cv2.line(out, (k * cell, 0), (k * cell, hp * cell), WHITE, ink.line)
    if part.shift:   # where the rows and columns the roll wrapped around begin: the mask's borders
        y, x = (h - part.shift) * cell, (w - part.shift) * cell
        _dashed(out, (0, y), (wp * cell, y), HIGHLIGHTS[4], ink.line)
        _dashed(out, (x, 0), (x, hp * cell), HIGHLIGHTS[4], ink.line)
    token = canvas.token_at(point, field) if point is not None else None
    if token is not None:
        i, j = (token[0] - part.shift) % h, (token[1] - part.shift) % w
        wi, wj = i // part.size * part.size, j // part.size * part.size
        cv2.rectangle(out, (wj * cell, wi * cell), ((wj + part.size) * cell, (wi + part.size) * cell), HIGHLIGHTS[0],
                      2 * ink.line + 1)
        cv2.rectangle(out, (j * cell, i * cell), ((j + 1) * cell, (i + 1) * cell), BLACK, 2 * ink.line + 2)
        cv2.rectangle(out, (j * cell, i * cell), ((j + 1) * cell, (i + 1) * cell), HIGHLIGHTS[3], 2 * ink.line)
        text_box(out, [f"token ({token[0]}, {token[1]}) sits at ({i}, {j}) after the roll"], ink)
    return out


def _token_boxes(canvas: Canvas, field: Field) -> np.ndarray:
    """h w 4 int: each token's cell (x0, y0, x1, y1) in display pixels (Swin's tokens tile the input)."""
    (gh, gw) = field.grid
    xs, _ = canvas.frame.to_display(field.start(np.arange(gw + 1)), 0.0)
    _, ys = canvas.frame.to_display(0.0, field.start(np.arange(gh + 1)))
    xs, ys = np.round(np.asarray(xs)).astype(int), np.round(np.asarray(ys)).astype(int)
    boxes = np.empty((gh, gw, 4), int)
    boxes[..., 0], boxes[..., 2] = xs[None, :-1], xs[None, 1:]
    boxes[..., 1], boxes[..., 3] = ys[:-1, None], ys[1:, None]
    return boxes


def _borders(out: np.ndarray, boxes: np.ndarray, windows: np.ndarray, regions: np.ndarray, line: int) -> None:
    """White lines between windows; dashed vermillion ones between the sub-windows of one window."""
    h, w = windows.shape
    for i in range(h):
        for j in range(w):
            x0, y0, x1, y1 = boxes[i, j]
            for di, dj, a, b in ((0, 1, (x1, y0), (x1, y1)), (1, 0, (x0, y1), (x1, y1))):
                if i + di >= h or j + dj >= w:
                    continue
                if windows[i, j] != windows[i + di, j + dj]:
                    cv2.line(out, a, b, WHITE, line)
                elif regions[i, j] != regions[i + di, j + dj]:
                    _dashed(out, a, b, HIGHLIGHTS[4], line)


def _label_wrapped(out: np.ndarray, boxes: np.ndarray, windows: np.ndarray, regions: np.ndarray, ink) -> None:
    """A shifted block's windows that wrap around the edges hold parts far apart on the photo: each part gets
    its window's number, so the parts of one window (kept apart by its mask) read as one."""
    for number, window in enumerate(np.unique(windows), start=1):
        parts = np.unique(regions[windows == window])
        if len(parts) < 2:
            continue
        for part in parts:
            rows, cols = np.nonzero((windows == window) & (regions == part))
            x = (boxes[rows, cols, 0].min() + boxes[rows, cols, 2].max()) / 2
            y = (boxes[rows, cols, 1].min() + boxes[rows, cols, 3].max()) / 2
            put_text(out, str(number), (x, y), ink, scale=0.8, anchor="centre")


def _dashed(out: np.ndarray, a, b, colour, line: int, dash: int = 6) -> None:
    (x0, y0), (x1, y1) = a, b
    length = max(abs(x1 - x0), abs(y1 - y0), 1)
    for width, ink in ((line + 2, BLACK), (line, colour)):   # outlined, to read on any colour
        for start in range(0, length, 2 * dash):
            t0, t1 = start / length, min(start + dash, length) / length
            cv2.line(out, (round(x0 + (x1 - x0) * t0), round(y0 + (y1 - y0) * t0)),
                     (round(x0 + (x1 - x0) * t1), round(y0 + (y1 - y0) * t1)), ink, width)


def _highlight(out, canvas: Canvas, field: Field, boxes, windows, regions, point) -> None:
    ink = canvas.ink
    token = canvas.token_at(point, field)
    if token is None:
        text_box(out, ["this point was cropped away:", "the model never saw it"], ink)
        return
    i, j = token
    sees = (windows == windows[i, j]) & (regions == regions[i, j])
    for (a, b) in zip(*np.nonzero(sees)):
        x0, y0, x1, y1 = boxes[a, b]
        cv2.rectangle(out, (x0, y0), (x1, y1), HIGHLIGHTS[0], max(1, ink.line))
    x0, y0, x1, y1 = boxes[i, j]
    cv2.rectangle(out, (x0, y0), (x1, y1), BLACK, 2 * ink.line + 2)
    cv2.rectangle(out, (x0, y0), (x1, y1), HIGHLIGHTS[3], 2 * ink.line)
    text_box(out, [f"token ({i}, {j}) sees the {int(sees.sum())} tokens outlined"], ink, near=(x0, y0, x1, y1))
