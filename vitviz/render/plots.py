"""What every matplotlib plot of vitviz shares: its line colours and the figure drawn into an RGB array (the views are
arrays; a plot is drawn off-screen with Agg, never shown)."""
from __future__ import annotations

import numpy as np

from .captions import HIGHLIGHTS

# plot line colours, one per model or method: vermillion, sky blue, bluish green, orange, purple (Okabe & Ito)
PLOT_COLOURS = tuple(np.array(HIGHLIGHTS[k]) / 255 for k in (4, 1, 2, 0, 5))


def figure_to_rgb(fig) -> np.ndarray:
    """A matplotlib figure drawn by Agg as an h w 3 uint8 array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
