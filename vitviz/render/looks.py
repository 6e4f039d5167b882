"""What a concept, unit or channel looks like, drawn (the pictures of `vitviz.looks`): a picture as a labelled tile,
the row of a concept card that holds them, a picture and its transparency map enlarged, and the objective's curve.

A card's row holds the picture that excites the concept in every model at once first, then, for a dictionary across
models, each model's own, each labelled with its model, so a glance says whether the families see the concept alike;
its tiles lie as the card's exemplar tiles under them do, a picture above a top image. A picture is small (the bundled
models' are 32 px): it is enlarged by cubic interpolation, as the exemplar tiles are, and its label is written on
it, outlined, as theirs are.

A transparency map (Horama's: the absolute gradient on the canvas over the steps, 1 at its largest) is drawn in the
colour map of every vitviz map, 0 dark and 1 bright: where the objective cared.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from .canvas import as_map, as_rgb
from .captions import STRIP, Ink, put_text, tile
from .overlay import DEFAULT_CMAP, colorize
from .plots import PLOT_COLOURS, figure_to_rgb

GAP = 3                # px between a card's pictures, and round them (as between its exemplar tiles)
VIEW_SIDE = 256        # px: a picture or map shown on its own
NONE_WORDS = "no picture yet: pick the card, then Draw this concept"


def picture_pixels(image) -> np.ndarray:
    """A picture as `vitviz.looks` returns it (floats in [0, 1]) or as it is shipped (uint8) -> h w 3 uint8."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.round(np.clip(array, 0.0, 1.0) * 255).astype(np.uint8)
    return as_rgb(array)


def enlarged(image: np.ndarray, side: int) -> np.ndarray:
    """An h w 3 uint8 image scaled to `side` px on its longer side (cubic up, area down)."""
    h, w = image.shape[:2]
    scale = side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_CUBIC if scale > 1 else cv2.INTER_AREA)


def picture_tile(image, *, side: int, label: str = "") -> np.ndarray:
    """A picture as a square tile of `side` px, `label` on its lower left (as an exemplar tile's)."""
    out = np.empty((side, side, 3), np.uint8)
    out[:] = STRIP
    picture = enlarged(picture_pixels(image), side)
    y, x = (side - picture.shape[0]) // 2, (side - picture.shape[1]) // 2
    out[y:y + picture.shape[0], x:x + picture.shape[1]] = picture
    if label:
        ink = Ink.for_size((side, side))
        put_text(out, label, (ink.line + 1, side - ink.text_size(label)[2] - ink.line - 1), ink)
    return out


def picture_row(pictures: Sequence[tuple[str, np.ndarray]], *, side: int, per_row: int, width: int) -> np.ndarray:
    """A concept card's row of pictures, `width` px wide: its (label, picture) pairs as tiles of `side` px, `per_row`
    to a row from the left (as the card's exemplar tiles lie under them); none: a line saying so, and how to draw
    them."""
    if not pictures:
        ink = Ink.for_size((side, width))
        out = np.empty((ink.line_height() + 2 * GAP, width, 3), np.uint8)
        out[:] = STRIP
        put_text(out, NONE_WORDS, (width / 2, out.shape[0] / 2), ink, anchor="centre", color=(200, 200, 205),
                 outline=None)
        return out
    tiles = [picture_tile(image, side=side, label=label) for label, image in pictures]
    strip = tile(tiles, cols=min(len(tiles), per_row), gap=GAP)
    out = np.empty((strip.shape[0], width, 3), np.uint8)
    out[:] = STRIP
    x = max(0, (width - (per_row * side + (per_row + 1) * GAP)) // 2)   # where the exemplar tiles' grid begins
    out[:, x:x + strip.shape[1]] = strip[:, :width - x]
    return out


def picture_view(image, *, side: int = VIEW_SIDE) -> np.ndarray:
    """A picture enlarged to `side` px, to be seen on its own."""
    return enlarged(picture_pixels(image), side)


def alpha_view(alpha, *, side: int = VIEW_SIDE, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """A transparency map (h w in [0, 1], or uint8 as shipped) in colour, enlarged to `side` px."""
    values = np.asarray(alpha)
    values = values / 255.0 if values.dtype == np.uint8 else as_map(values)
    return enlarged(colorize(np.clip(values, 0.0, 1.0).astype(np.float32), cmap), side)


def curve_plot(curves: Mapping[str, Sequence[float]], *, title: str = "") -> np.ndarray:
    """Each picture's objective before every step of its optimisation, one line per label: a curve still rising at
    its end asks for more steps."""
    from matplotlib.figure import Figure  # matplotlib only where a plot is drawn
    fig = Figure(figsize=(5.2, 3.2), dpi=100)
    ax = fig.add_subplot()
    for k, (label, curve) in enumerate(curves.items()):
        curve = np.asarray(curve, dtype=float)
        ax.plot(np.arange(1, len(curve) + 1), curve, color=PLOT_COLOURS[k % len(PLOT_COLOURS)], lw=1.6, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("objective")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return figure_to_rgb(fig)
