"""The faithfulness evaluation over a data set as one figure: per test, every method's mean curve with
its 95 % band, the random map's as grey dashes (`vitviz.evaluate` computes them)."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .captions import HIGHLIGHTS
from .plots import PLOT_COLOURS, figure_to_rgb

# one colour per method: the five plot colours, then Okabe & Ito's blue, black and yellow
COLOURS = (*PLOT_COLOURS, np.array((0, 114, 178)) / 255, np.zeros(3), np.array(HIGHLIGHTS[3]) / 255)
Band = Mapping[str, Sequence[float]]   # {'mean': [...], 'low': [...], 'high': [...]}, one value per x


def evaluation_plot(panels: Mapping[str, Mapping[str, Band]], *, fractions: Mapping[str, Sequence[float]],
                    titles: Mapping[str, str], ylabels: Mapping[str, str], title: str) -> np.ndarray:
    """panels: test -> method -> its mean curve and band over `fractions[test]`; methods named
    'random' are drawn as grey dashes. One panel per test, the legend in the last cell."""
    columns = 3
    rows = -(-(len(panels) + 1) // columns)
    from matplotlib.figure import Figure  # matplotlib only where a plot is drawn
    fig = Figure(figsize=(4.2 * columns, 3.3 * rows), dpi=100)
    handles = {}
    for k, (test, curves) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, columns, k + 1)
        x = np.asarray(fractions[test], dtype=float)
        for c, (name, band) in enumerate(curves.items()):
            mean, low, high = (np.asarray(band[key], dtype=float) for key in ("mean", "low", "high"))
            if mean.shape != x.shape:
                raise ValueError(f"{test}: curve {name!r} has {mean.shape} points for {x.shape} fractions")
            random = "random" in name.lower()
            colour = "0.5" if random else COLOURS[c % len(COLOURS)]
            handles[name], = ax.plot(x, mean, ls="--" if random else "-", lw=1.5, color=colour, label=name)
            ax.fill_between(x, low, high, color=colour, alpha=0.15 if random else 0.2, lw=0)
        ax.set_title(titles.get(test, test), fontsize=9)
        ax.set_xlabel("fraction removed" if test != "insertion" else "fraction inserted", fontsize=8)
        ax.set_ylabel(ylabels.get(test, ""), fontsize=8)
        ax.set_xlim(x.min(), x.max())
        ax.set_ylim(0, None)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    legend = fig.add_subplot(rows, columns, rows * columns)
    legend.axis("off")
    legend.legend(handles.values(), handles.keys(), loc="center", fontsize=9, title="mean and 95 % interval")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return figure_to_rgb(fig)
