"""Text on views, sized to stay legible at any image size; caption strips; tiling panels together."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import cv2
import numpy as np

FONT = cv2.FONT_HERSHEY_SIMPLEX
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
STRIP = (24, 24, 28)   # caption strip background
# Okabe & Ito's colour-blind-safe palette: orange, sky blue, bluish green, yellow, vermillion, purple
HIGHLIGHTS = ((230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (213, 94, 0), (204, 121, 167))


@dataclass(frozen=True)
class Ink:
    """Font scale and line widths for an image of a given size: they grow with it."""

    font_scale: float
    text: int   # text stroke, px
    line: int   # line width, px

    @classmethod
    def for_size(cls, size: tuple[int, int], *, scale: float = 1.0) -> "Ink":
        """The ink of a view of `size` (h, w); `scale` times larger for a view shown smaller than its pixels."""
        unit = scale * max(max(size), 384) / 512   # 1.0 at a 512 px long side; never below 0.75, to stay legible
        return cls(font_scale=0.42 * unit, text=max(1, round(unit)), line=max(1, round(1.5 * unit)))

    def text_size(self, text: str, scale: float = 1.0) -> tuple[int, int, int]:
        """(width, height above baseline, depth below) in px."""
        return _text_size(text, self.font_scale * scale, self.text)

    def line_height(self, scale: float = 1.0) -> int:
        _, h, base = self.text_size("Ag", scale)
        return int(round((h + base) * 1.35))


@lru_cache(maxsize=4096)
def _text_size(text: str, font_scale: float, stroke: int) -> tuple[int, int, int]:
    # kept: a view measures the same few strings (tick values, 'Ag', captions) many times over
    (w, h), base = cv2.getTextSize(text, FONT, font_scale, stroke)
    return w, h, base


def put_text(image: np.ndarray, text: str, org: tuple[float, float], ink: Ink, *, scale: float = 1.0,
             color=WHITE, outline=BLACK, anchor: str = "left") -> None:
    """Draw `text` in place with its baseline at `org`, outlined so it reads on any background.
    anchor: 'left', 'centre' (text centred on org, vertically too) or 'right'."""
    w, h, _ = ink.text_size(text, scale)
    x, y = org
    if anchor == "centre":
        x, y = x - w / 2, y + h / 2
    elif anchor == "right":
        x = x - w
    org = (int(round(x)), int(round(y)))
    fs = ink.font_scale * scale
    if outline is not None:   # shifted copies, not a thicker stroke: OpenCV spaces thick glyphs wider
        for dx, dy in ((-1, -1), (-1, 1), (1, -1), (1, 1), (-1, 0), (1, 0), (0, -1), (0, 1)):
            cv2.putText(image, text, (org[0] + dx, org[1] + dy), FONT, fs, outline, ink.text, cv2.LINE_AA)
    cv2.putText(image, text, org, FONT, fs, color, ink.text, cv2.LINE_AA)


Box = tuple[float, float, float, float]   # (x0, y0, x1, y1), px


def text_box(image: np.ndarray, lines: Sequence[str], ink: Ink, *, avoid: Sequence[Box] = (),
             near: Box | None = None, scale: float = 1.0, opacity: float = 0.72) -> Box:
    """Lines of text on a translucent dark box, in place. Placed like a tooltip just above (else below)
    the box `near`; otherwise in the first corner (top-left, top-right, bottom-left, bottom-right) that
    overlaps none of the `avoid` boxes (else the least overlapping one). Returns the box drawn."""
    pad, lh = ink.line_height(scale) // 3 + 2, ink.line_height(scale)
    size = (max(ink.text_size(line, scale)[0] for line in lines) + 2 * pad, lh * len(lines) + pad)
    if near is not None:
        x0, y0, x1, y1 = tooltip(size, image.shape[:2], near, gap=ink.line + 2)
    else:
        x0, y0, x1, y1 = place(size, image.shape[:2], avoid=avoid)
    region = image[y0:y1, x0:x1]
    if region.size:
        region[:] = cv2.LUT(region, _box_shade(opacity))
    for k, line in enumerate(lines):
        put_text(image, line, (x0 + pad, y0 + pad + lh * k + ink.text_size("A", scale)[1]), ink, scale=scale,
                 outline=None)
    return x0, y0, x1, y1


@lru_cache(maxsize=8)
def _box_shade(opacity: float) -> np.ndarray:
    """256 1 3 uint8: each value v of each channel -> v * (1 - opacity) + STRIP's value * opacity, truncated (a box's
    shading as a table lookup, not a float product per pixel)."""
    return (np.arange(256)[:, None] * (1 - opacity) + np.array(STRIP) * opacity).astype(np.uint8)[:, None]


def tooltip(size: tuple[int, int], image_size: tuple[int, int], near: Box, *, gap: int) -> Box:
    """(x0, y0, x1, y1) of a (w, h) box centred above `near` (below it where there is no room), inside the image."""
    (w, h), (ih, iw) = size, image_size
    w, h = min(w, iw), min(h, ih)
    x = int(np.clip((near[0] + near[2]) / 2 - w / 2, 0, iw - w))
    y = near[1] - gap - h if near[1] - gap - h >= 0 else min(near[3] + gap, ih - h)
    return x, int(y), x + w, int(y) + h


def place(size: tuple[int, int], image_size: tuple[int, int], *, avoid: Sequence[Box] = (), margin: int = 0) -> Box:
    """(x0, y0, x1, y1) of a (w, h) box in a corner of an image of (h, w), overlapping `avoid` least."""
    (w, h), (ih, iw) = size, image_size
    w, h = min(w, iw), min(h, ih)
    left, top, right, bottom = margin, margin, iw - w - margin, ih - h - margin
    corners = [(left, top), (right, top), (left, bottom), (right, bottom)]

    def overlap(x, y):
        return sum(max(0, min(x + w, a[2]) - max(x, a[0])) * max(0, min(y + h, a[3]) - max(y, a[1])) for a in avoid)
    x, y = min(corners, key=lambda c: (overlap(*c) > 0, overlap(*c)))   # first free corner, in order
    return int(x), int(y), int(x + w), int(y + h)


def wrap(text: str, width: int, ink: Ink, scale: float = 1.0) -> list[str]:
    """Greedy word wrap of `text` to lines at most `width` px wide."""
    lines, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and ink.text_size(candidate, scale)[0] > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return lines + [line] if line else lines


def caption_text(*, model: str, method: str, layer: int | str | None = None, head: int | str | None = None,
                 target: str | None = None) -> str:
    """The one caption format: 'ViT-B/16 · attention rollout · layer 12 · head mean · class: tabby'."""
    parts = [model, method]
    parts += [f"layer {layer}"] if layer is not None else []
    parts += [f"head {head}"] if head is not None else []
    parts += [f"class: {target}"] if target is not None else []
    return "  |  ".join(parts)


def caption(image: np.ndarray, *, model: str, method: str, layer: int | str | None = None,
            head: int | str | None = None, target: str | None = None, note: str | None = None,
            text_scale: float = 1.0) -> np.ndarray:
    """`image` with a caption strip *under* it (so clicks on the image keep their coordinates): the
    model, method, layer/head and target class in bold, an optional note in smaller type; the text `text_scale`
    times a view's size (a video's, shown small on a phone, larger)."""
    title = caption_text(model=model, method=method, layer=layer, head=head, target=target)
    return np.vstack([image, caption_strip(image.shape[:2], title, note, text_scale)])


@lru_cache(maxsize=64)
def caption_strip(size: tuple[int, int], title: str, note: str | None = None, text_scale: float = 1.0) -> np.ndarray:
    """The strip `caption` puts under an image of `size` (h, w), read-only: kept, since an export writes the same
    captions under every photo of one size."""
    ink = Ink.for_size(size, scale=text_scale)
    width = size[1]
    margin = max(4, ink.line_height() // 3)
    title = wrap(title, width - 2 * margin, ink)
    small = wrap(note, width - 2 * margin, ink, 0.85) if note else []
    height = margin * 2 + ink.line_height() * len(title) + ink.line_height(0.85) * len(small)
    strip = np.empty((height, width, 3), np.uint8)
    strip[:] = STRIP
    y = margin
    for line, scale, color in [(t, 1.0, WHITE) for t in title] + [(s, 0.85, (200, 200, 205)) for s in small]:
        y += ink.line_height(scale)
        put_text(strip, line, (margin, y - ink.text_size("g", scale)[2] - ink.line_height(scale) * 0.15), ink,
                 scale=scale, color=color, outline=None)
    strip.flags.writeable = False
    return strip


def tile(images: Sequence[np.ndarray], *, cols: int, gap: int = 4, background=STRIP) -> np.ndarray:
    """Images in a grid, row by row, each cell the size of the largest image (smaller ones top-left)."""
    if not images:
        raise ValueError("nothing to tile")
    rows = -(-len(images) // cols)
    ch, cw = max(im.shape[0] for im in images), max(im.shape[1] for im in images)
    out = np.empty((rows * ch + (rows + 1) * gap, cols * cw + (cols + 1) * gap, 3), np.uint8)
    out[:] = background
    for k, im in enumerate(images):
        r, c = divmod(k, cols)
        y, x = gap + r * (ch + gap), gap + c * (cw + gap)
        out[y:y + im.shape[0], x:x + im.shape[1]] = im
    return out
