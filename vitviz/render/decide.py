"""Figures of "what decides" (`vitviz.explain.decide` and `patching`): contributions per layer as bars, layer x
head and layer x position heatmaps on a colour scale symmetric about 0 (red for the class, blue against),
and a head's token effects over the image. Each figure's title says what it shows."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..explain.patching import Patching
from .canvas import Canvas
from .overlay import SIGNED_CMAP, overlay, with_colorbar
from .plots import PLOT_COLOURS, figure_to_rgb

MAX_WIDTH = 12.0   # inches: the widest heatmap


def _symmetric(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def contribution_bars(tables: Mapping[str, dict]) -> np.ndarray:
    """Each layer's attention (heads and bias) and MLP contribution to the class logit, one panel per model
    (model name -> `Attribution.table(...)`), side by side."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(tables), 3.4), dpi=100)
    for k, (name, table) in enumerate(tables.items()):
        ax = fig.add_subplot(1, len(tables), k + 1)
        layers = [row["layer"] for row in table["layers"]]
        x = np.arange(len(layers))
        ax.bar(x - 0.2, [row["attention"] for row in table["layers"]], 0.4, color=PLOT_COLOURS[1], label="attention")
        ax.bar(x + 0.2, [row["mlp"] for row in table["layers"]], 0.4, color=PLOT_COLOURS[0], label="MLP")
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(x, [str(layer + 1) for layer in layers], fontsize=8)
        ax.set_xlabel("block")
        ax.set_ylabel("contribution to the logit")
        target = table["target"].get("label", table["target"]["index"])
        ax.set_title(f"{name}: what each block writes for {target!r}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_to_rgb(fig)


def signed_heatmap(values, *, title: str, xlabel: str, ylabel: str = "block",
                   rows: Sequence[str] | None = None, columns: Sequence[str] | None = None) -> np.ndarray:
    """A rows x columns map of signed values (NaN: no such entry, left blank) on a scale symmetric about 0."""
    from matplotlib.figure import Figure

    values = np.asarray(values, dtype=float)
    limit = _symmetric(values)
    # a cell per column up to a page's width: CvT-13's first stage has 3,136 positions
    width = min(MAX_WIDTH, max(3.2, 0.35 * values.shape[1] + 1.8))
    fig = Figure(figsize=(width, max(2.6, 0.3 * values.shape[0] + 1.2)), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap=SIGNED_CMAP, vmin=-limit, vmax=limit, aspect="auto",
                      interpolation="nearest")
    ax.set_yticks(range(values.shape[0]), rows or [str(i + 1) for i in range(values.shape[0])], fontsize=7)
    if columns is not None:
        ax.set_xticks(range(values.shape[1]), columns, fontsize=7, rotation=90)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.05)
    fig.tight_layout()
    return figure_to_rgb(fig)


def head_heatmap(heads, *, title: str, rows: Sequence[str] | None = None) -> np.ndarray:
    """Layer x head: `Attribution.heads[image]` (what each head writes for the class) or `Patching.heads`
    (how much of the answer each head carries)."""
    return signed_heatmap(heads, title=title, xlabel="head", rows=rows,
                          columns=[str(h + 1) for h in range(np.asarray(heads).shape[1])])


def position_table(patching: Patching) -> np.ndarray:
    """Layer x position for residual patching: each block's prefix tokens, then its grid squares row-major
    (CvT's stages have different grids: the shorter rows end in NaN)."""
    rows = [np.concatenate([p.cpu().numpy(), g.flatten().cpu().numpy()])
            for p, g in zip(patching.prefix, patching.grid)]
    table = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, row in enumerate(rows):
        table[i, :len(row)] = row
    return table


def token_effect_view(canvas: Canvas, effect_map, *, stage: int = -1, mode: str = "nearest") -> np.ndarray:
    """A head's token effects (gh gw, on the grid of `stage`) over the image: red patches wrote for the class
    through that head, blue against, on a scale symmetric about 0."""
    values = np.asarray(effect_map, dtype=float)
    limit = _symmetric(values)
    view = overlay(canvas, values, field=stage % len(canvas.fields), mode=mode, cmap=SIGNED_CMAP,
                   vmin=-limit, vmax=limit)
    return with_colorbar(view, vmin=-limit, vmax=limit, cmap=SIGNED_CMAP, label="token effect")
