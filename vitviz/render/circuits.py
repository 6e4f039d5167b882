"""A circuit drawn from its JSON (`vitviz.circuits`, `Circuit.to_json`): blocks as columns, the photo on the left and
the answer on the right, each node a small picture of where it fires on the photo, edges as lines.

Columns: the photo (the input node), then each site in depth order (its concept nodes, strongest first, the group of
its other circuit concepts where there is one, and its error node last), then the metric (the logit node). Each
node is the photo with its map over the site's grid (`cell_overlay`,
on its own scale: where the concept fires, not how strongly against the others), its number and effect on the
metric under it (red for the answer, blue against), then its name. An error node (what the dictionary misses: its
map is its effect at each cell, drawn as |effect|) has a dashed frame, and so has a block's "not read" node (what
the upstream block's nodes pass on past the dictionary: tokens it does not read, what its cells do not see), a group
node (several concepts as one: their codes summed) a double one; a node both models share (a dictionary across
them) a green one; the node picked a yellow one. An edge's width follows its |weight| on one scale for the whole graph
(its effect on the metric), its colour its sign. Edges run between consecutive columns only, as the graph's do: each
leaves its node at the tile's right edge, runs level to the column's edge, crosses the gap, and enters the next tile
level from the left, so no line crosses a node's words.

`graph_layout` places the nodes (the app maps a click to a node with it, `node_at`); `circuit_graph` draws;
`circuit_faithfulness` plots each model's faithfulness against the circuit's size (matplotlib, as every plot)."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from .canvas import Canvas
from .captions import HIGHLIGHTS, STRIP, WHITE, Ink, put_text, wrap
from .concepts import Region, cell_overlay
from .overlay import DEFAULT_CMAP
from .plots import PLOT_COLOURS, figure_to_rgb

Box = tuple[int, int, int, int]   # (x0, y0, x1, y1), px of the drawing
TILE = 72           # px: a node's picture
COLUMN = 144        # px: a block's column, its nodes' words included (the photo's and the answer's: `END`)
END = TILE + 24
GAP = 34            # px between columns, where the edges cross
MARGIN = 14
# the drawing's own ink, whatever the photo's size: shown side by side on a desktop a graph is scaled to about
# 0.6, where this is 10 px text
INK = Ink(font_scale=0.72, text=1, line=2)
NAME_LINES = 1      # of a node's name under its number and effect: the whole name is the app's card's
FOR, AGAINST = HIGHLIGHTS[4], HIGHLIGHTS[1]   # vermillion for the answer, sky blue against (Okabe & Ito)
SHARED, PICKED = HIGHLIGHTS[2], HIGHLIGHTS[3]   # bluish green, yellow
FRAME, MUTED = (110, 110, 118), (175, 175, 182)
WIDEST = 11         # px: the edge of the largest |weight| (OpenCV draws odd widths)
ERROR_CMAP = "cividis"   # an error node's |effect|: not a concept's colours


@dataclass(frozen=True)
class Layout:
    """Where `circuit_graph` puts everything: the drawing's size (h, w), each node's tile and the column it is in
    (x0, x1), each column's header and extent, and where the nodes start (below the title and headers)."""
    size: tuple[int, int]
    boxes: dict[str, Box]
    spans: dict[str, tuple[int, int]]
    columns: list[tuple[str, int, int]]   # (header, x0, x1)
    top: int


def columns_of(graph: Mapping) -> list[tuple[str, list[Mapping]]]:
    """The graph's columns, left to right: (header, nodes in drawing order)."""
    nodes = graph["nodes"]
    columns = [("photo", [n for n in nodes if n["kind"] == "input"])]
    for site in graph["sites"]:
        here = [n for n in nodes if n.get("block") == site["block"]]
        header = f"block {site['block'] + 1}" + (" (across)" if site["across"] else "")
        columns.append((header, [n for kind in ("concept", "group", "error", "unread") for n in here
                                 if n["kind"] == kind]))
    columns.append(("answer", [n for n in nodes if n["kind"] == "logit"]))
    return columns


def title_lines(graph: Mapping) -> list[str]:
    """The drawing's title: the model and its metric; how faithful the circuit is and how large."""
    f, size = graph.get("faithfulness") or {}, graph["size"]
    numbers = [f"F {f['value']:.2f}" if f.get("value") is not None else "F undefined",
               f"completeness {f['completeness']:.2f}" if f.get("completeness") is not None else None,
               f"{size['concept_nodes']} of {f.get('active_concepts', '?')} active concepts, {size['edges']} edges"]
    return [f"{graph['model']}: {graph['metric']} = {graph['value']:.2f}", ", ".join(n for n in numbers if n)]


def node_height() -> int:
    """A node's pitch in its column: its tile, the line under it, its name, a gap."""
    return TILE + (1 + NAME_LINES) * INK.line_height() + INK.line_height() // 2


def graph_layout(graph: Mapping) -> Layout:
    """Each node's tile and each column's place (the module docstring), from the graph alone."""
    columns = columns_of(graph)
    line = INK.line_height()
    top = MARGIN + len(title_lines(graph)) * INK.line_height(1.15) + 2 * line   # the title, the headers
    rows = max(len(nodes) for _, nodes in columns)
    widths = [END if k in (0, len(columns) - 1) else COLUMN for k in range(len(columns))]
    height = top + rows * node_height() + 2 * line + MARGIN   # the legend under the nodes
    width = 2 * MARGIN + sum(widths) + (len(columns) - 1) * GAP
    boxes, spans, placed = {}, {}, []
    x0 = MARGIN
    for (header, nodes), span in zip(columns, widths):
        placed.append((header, x0, x0 + span))
        y = top + (rows - len(nodes)) * node_height() // 2   # each column centred on the tallest
        for node in nodes:
            left = x0 + (span - TILE) // 2
            boxes[node["id"]], spans[node["id"]] = (left, y, left + TILE, y + TILE), (x0, x0 + span)
            y += node_height()
        x0 += span + GAP
    return Layout(size=(height, width), boxes=boxes, spans=spans, columns=placed, top=top)


def node_at(layout: Layout, point: tuple[float, float]) -> str | None:
    """The node whose tile or words hold the point (x, y) of the drawing, or None."""
    x, y = point
    for node, (_, y0, _, _) in layout.boxes.items():
        x0, x1 = layout.spans[node]
        if x0 <= x < x1 and y0 <= y < y0 + node_height():
            return node
    return None


def fitted(photo: np.ndarray, side: int) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """`photo` scaled to fit a `side` px square, on the strip's colour; and where it sits in the square (y, x, h,
    w)."""
    h, w = photo.shape[:2]
    scale = side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    scaled = cv2.resize(photo, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    out = np.empty((side, side, 3), np.uint8)
    out[:] = STRIP
    y, x = (side - size[1]) // 2, (side - size[0]) // 2
    out[y:y + size[1], x:x + size[0]] = scaled
    return out, (y, x, size[1], size[0])


def node_picture(node: Mapping, base: np.ndarray, region: Region, *, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """A node's tile: its map over the site's grid on `base` (its photo at tile size), on its own scale."""
    values = np.abs(np.asarray(node["map"], np.float32)).reshape(node["grid"])
    vmax = float(values.max())
    return cell_overlay(base, values, region, vmax=vmax, cmap=ERROR_CMAP if node["kind"] == "error" else cmap)


def node_words(node: Mapping) -> tuple[str, str]:
    """(the line under a tile: its number or kind and its effect; its name, '' where it has none but its number)."""
    if node["kind"] == "input":
        return "", ""
    if node["kind"] == "logit":
        return f"{node['effect']:.2f}", ""
    effect = f"{node['effect']:+.2f}"
    if node["kind"] == "error":
        return f"error {effect}", "" if node.get("in_circuit", True) else "not in circuit"
    if node["kind"] == "group":
        return f"+{len(node['concepts'])} {effect}", "more concepts"
    if node["kind"] == "unread":
        return f"bypass {effect}", ""
    number = f"#{node['concept']}"
    name = node["name"]
    return f"{number} {effect}", name[len(number):].strip() if name.startswith(number) else ""


def dashed_rectangle(image: np.ndarray, box: Box, colour, width: int, dash: int = 7) -> None:
    """A rectangle of dashes, in place."""
    x0, y0, x1, y1 = box
    for a, b in (((x0, y0), (x1, y0)), ((x1, y0), (x1, y1)), ((x1, y1), (x0, y1)), ((x0, y1), (x0, y0))):
        length = max(abs(b[0] - a[0]), abs(b[1] - a[1]))
        for start in range(0, length, 2 * dash):
            end = min(start + dash, length)
            p = (a[0] + (b[0] - a[0]) * start // length, a[1] + (b[1] - a[1]) * start // length)
            q = (a[0] + (b[0] - a[0]) * end // length, a[1] + (b[1] - a[1]) * end // length)
            cv2.line(image, p, q, colour, width, cv2.LINE_AA)


def draw_edges(out: np.ndarray, graph: Mapping, layout: Layout) -> None:
    """Every edge, weakest first (the strong ones on top), blended a little so crossings stay readable."""
    edges = sorted(graph["edges"], key=lambda e: abs(e["weight"]))
    largest = max((abs(e["weight"]) for e in edges), default=0.0)
    if largest == 0:
        return
    layer = out.copy()
    for edge in edges:
        source, target = layout.boxes[edge["source"]], layout.boxes[edge["target"]]
        width = max(1, round(WIDEST * abs(edge["weight"]) / largest))
        colour = FOR if edge["weight"] > 0 else AGAINST
        y_out, y_in = (source[1] + source[3]) // 2, (target[1] + target[3]) // 2
        right, left = layout.spans[edge["source"]][1], layout.spans[edge["target"]][0]
        points = np.array([(source[2], y_out), (right, y_out), (left, y_in), (target[0], y_in)], np.int32)
        cv2.polylines(layer, [points], False, colour, width, cv2.LINE_AA)
    cv2.addWeighted(layer, 0.85, out, 0.15, 0, dst=out)


def unread_picture() -> np.ndarray:
    """The tile of what a block's dictionary does not read: no map (it is no concept), a dark ground and its words."""
    tile = np.empty((TILE, TILE, 3), np.uint8)
    tile[:] = (36, 36, 42)
    for k, text in enumerate(("not", "read")):
        put_text(tile, text, (TILE / 2, TILE / 2 + (k - 0.5) * INK.line_height(0.9)), INK, scale=0.9, anchor="centre",
                 color=MUTED, outline=None)
    return tile


def logit_picture(graph: Mapping) -> np.ndarray:
    """The answer's tile: the target class (minus the contrast class), on a lighter ground."""
    tile = np.empty((TILE, TILE, 3), np.uint8)
    tile[:] = (48, 48, 56)
    lines = [graph["target_label"]]
    if graph.get("contrast") is not None:   # `Metric.describe`: '... minus that of <contrast>'
        lines += ["minus", graph["metric"].split(" minus that of ")[-1]]
    lines = [text for words in lines for text in wrap(words, TILE - 8, INK)][:4]
    line = INK.line_height()
    for k, text in enumerate(lines):
        put_text(tile, text, (TILE / 2, TILE / 2 + (k - (len(lines) - 1) / 2) * line), INK, anchor="centre",
                 outline=None)
    return tile


def circuit_graph(graph: Mapping, canvas: Canvas, places: Mapping[int, tuple[int, Region]], *,
                  shared: Collection[str] = (), picked: str | None = None, cmap: str = DEFAULT_CMAP) -> np.ndarray:
    """The graph drawn (the module docstring): `canvas` the photo as the model saw it, `places` each site's block ->
    (its stage, where its grid lies on the photo: `circuits.pair.places`), `shared` the node ids both models share,
    `picked` the node to frame."""
    layout = graph_layout(graph)
    height, width = layout.size
    out = np.empty((height, width, 3), np.uint8)
    out[:] = STRIP
    line = INK.line_height()
    y = MARGIN
    for k, text in enumerate(title_lines(graph)):
        y += INK.line_height(1.15)
        put_text(out, text, (MARGIN, y - INK.text_size("g", 1.15)[2]), INK, scale=1.15 if k == 0 else 1.0,
                 color=WHITE if k == 0 else MUTED, outline=None)
    for header, x0, x1 in layout.columns:
        put_text(out, header, ((x0 + x1) / 2, layout.top - line), INK, anchor="centre", color=MUTED, outline=None)
    draw_edges(out, graph, layout)
    thumbnail = canvas.thumbnail(TILE)
    photos = {}
    for block, (stage, _) in places.items():
        photos[block] = fitted(np.asarray(thumbnail.shaded(canvas.fields[stage])), TILE)
    for node in graph["nodes"]:
        x0, y0, x1, y1 = layout.boxes[node["id"]]
        if node["kind"] == "input":
            tile = fitted(np.asarray(thumbnail.image), TILE)[0]
        elif node["kind"] == "logit":
            tile = logit_picture(graph)
        elif node["kind"] == "unread":
            tile = unread_picture()
        else:
            (base, (dy, dx, h, w)), (y0_, x0_, y1_, x1_) = photos[node["block"]], places[node["block"]][1]
            in_tile = ((dy + y0_ * h) / TILE, (dx + x0_ * w) / TILE, (dy + y1_ * h) / TILE, (dx + x1_ * w) / TILE)
            tile = node_picture(node, base, in_tile, cmap=cmap)
        out[y0:y1, x0:x1] = tile
        framed = (x0 - 2, y0 - 2, x1 + 1, y1 + 1)
        if node["id"] == picked:
            cv2.rectangle(out, framed[:2], framed[2:], PICKED, 4)
        elif node["id"] in shared:
            cv2.rectangle(out, framed[:2], framed[2:], SHARED, 3)
        elif node["kind"] in ("error", "unread"):
            dashed_rectangle(out, framed, MUTED, 2)
        elif node["kind"] == "group":
            cv2.rectangle(out, framed[:2], framed[2:], FRAME, 1)
            cv2.rectangle(out, (framed[0] - 4, framed[1] - 4), (framed[2] + 4, framed[3] + 4), FRAME, 1)
        else:
            cv2.rectangle(out, framed[:2], framed[2:], FRAME, 1)
        head, name = node_words(node)
        centre = (x0 + x1) / 2
        baseline = y1 + line - INK.text_size("g")[2]
        sign = node.get("effect") or 0
        colour = WHITE if node["kind"] in ("input", "logit") else FOR if sign > 0 else AGAINST
        put_text(out, head, (centre, baseline - INK.text_size(head)[1] / 2), INK, anchor="centre", color=colour,
                 outline=None)
        room = layout.spans[node["id"]][1] - layout.spans[node["id"]][0] - 4
        for k, text in enumerate(clipped(wrap(name, room, INK, 0.9), NAME_LINES, room)):
            put_text(out, text, (centre, baseline + (k + 1) * line - INK.text_size(text, 0.9)[1] / 2), INK,
                     scale=0.9, anchor="centre", color=MUTED, outline=None)
    legend(out, shared=bool(shared))
    return out


def clipped(lines: Sequence[str], most: int, width: int) -> list[str]:
    """At most `most` lines, the last ending in '...' where some were left out (cut to `width` px)."""
    if len(lines) <= most:
        return list(lines)
    last = lines[most - 1]
    while last and INK.text_size(last + "...", 0.9)[0] > width:
        last = last[:-1]
    return [*lines[:most - 1], last.rstrip(" ,") + "..."]


def legend(out: np.ndarray, *, shared: bool) -> None:
    """What the colours and frames mean, along the bottom."""
    height = out.shape[0]
    y = height - MARGIN - INK.line_height() // 2
    x = MARGIN
    entries = [("line", FOR, "for the answer"), ("line", AGAINST, "against"), ("dash", MUTED, "error node")]
    if shared:
        entries.append(("box", SHARED, "in both models"))
    entries.append(("box", PICKED, "picked"))
    for kind, colour, words in entries:
        if kind == "line":
            cv2.line(out, (x, y), (x + 28, y), colour, 4, cv2.LINE_AA)
        elif kind == "dash":
            dashed_rectangle(out, (x, y - 8, x + 28, y + 8), colour, 2, dash=4)
        else:
            cv2.rectangle(out, (x, y - 8), (x + 28, y + 8), colour, 3)
        put_text(out, words, (x + 36, y + INK.text_size(words, 0.9)[1] / 2), INK, scale=0.9, color=MUTED,
                 outline=None)
        x += 36 + INK.text_size(words, 0.9)[0] + 28


def circuit_faithfulness(faithfulness: Mapping[str, Mapping]) -> np.ndarray:
    """Each model's faithfulness F against the circuit's size (model -> its circuit's `faithfulness`): F for every
    prefix of the model's nodes ranked by |effect|, as a share of them (models rank different numbers of nodes);
    the star is the circuit drawn, the smallest prefix reaching the target (the dashed level). F is drawn from -1 to
    2: beyond, a ratio is dominated by a small denominator."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.4, 3.0), dpi=100)
    ax = fig.add_subplot()
    for k, (name, measured) in enumerate(faithfulness.items()):
        colour = PLOT_COLOURS[k % len(PLOT_COLOURS)]
        curve = measured.get("curve") or []
        ranked = max(measured.get("ranked_nodes") or 0, 1)
        points = [(p["nodes"] / ranked, p["faithfulness"]) for p in curve if p["faithfulness"] is not None]
        if points:
            ax.plot(*zip(*points), lw=1.6, color=colour, label=f"{name} ({ranked} nodes ranked)")
        if measured.get("value") is not None:
            ax.plot([measured["nodes"] / ranked], [measured["value"]], marker="*", ms=13, color=colour, mec="black",
                    mew=0.6, ls="none", label=f"{name}: the circuit drawn, {measured['nodes']} nodes, "
                                              f"F {measured['value']:.2f}")
    targets = {m.get("target") for m in faithfulness.values() if m.get("target") is not None}
    for target in targets:
        ax.axhline(target, color="0.4", lw=1, ls="--")
    for level in (0, 1):
        ax.axhline(level, color="0.7", lw=0.8)
    ax.set_xlabel("share of the ranked nodes kept, strongest |effect| first (the circuit's size)", fontsize=9)
    ax.set_ylabel("faithfulness F", fontsize=9)
    ax.set_title("F = (m(C) − m(∅)) / (m(M) − m(∅)); ∅: every concept and error node at its baseline", fontsize=9,
                 loc="left")
    ax.set_xlim(0, 1)
    ax.set_ylim(-1.05, 2.05)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    fig.tight_layout()
    return figure_to_rgb(fig)
