"""The HTML every page of the atlas shares: escaping, the page's frame, numbers in words, pictures as data.

Everything a page embeds from outside the code (class names from a person's folders, concept names made of
them, image ids, model and dictionary names) goes through `text` (html.escape, quotes included) or, inside a
script, `script_json` (JSON with <, >, & and the line separators JavaScript does not allow written as \\u
escapes), so a folder named `<b onmouseover=alert(1)>` shows as those characters. Every file a page refers to is
relative to it (`root`: the way up to the site's top folder), so the site opens from file:// and from any static
host; no page fetches anything from elsewhere.
"""
from __future__ import annotations

import base64
import html
import json

import numpy as np

from ..files import png_bytes
from ..render.concepts import OPACITY
from ..render.overlay import colorize, normalise

TITLE = "vitviz concept atlas"
CSS, JS, SEARCH = "atlas.css", "atlas.js", "search-index.js"   # the site's shared files, in its top folder


def text(value) -> str:
    """Any value as HTML text (also safe inside a quoted attribute)."""
    return html.escape(str(value), quote=True)


def script_json(value) -> str:
    """`value` as JSON that can stand inside a <script> element: nothing in it can close the element."""
    out = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        out = out.replace(raw, escaped)
    return out


def page(*, title: str, root: str, body: str, heading: str | None = None) -> str:
    """A whole page: its title, the site's stylesheet and scripts (relative to `root`), a header with the way
    home and the search box, and `body` (HTML already escaped)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{text(title)} · {TITLE}</title>
<link rel="stylesheet" href="{root}{CSS}">
</head>
<body data-root="{text(root)}">
<header class="top">
<a class="home" href="{root}index.html">{TITLE}</a>
<form class="search" role="search">
<input id="search" type="search" placeholder="Find a concept: 613, cat, shared…"
 aria-label="Find a concept by number, name or class" autocomplete="off">
<ol id="found" class="found" aria-live="polite"></ol>
</form>
</header>
<main>
<h1>{text(heading or title)}</h1>
{body}
</main>
<script src="{root}{SEARCH}"></script>
<script src="{root}{JS}"></script>
</body>
</html>
"""


def percent(share: float) -> str:
    """0.0123 -> '1.2 %'; tiny shares keep two significant digits."""
    value = 100 * share
    return f"{value:.2g} %" if 0 < value < 0.1 else f"{value:.1f} %"


def signed(value: float, half: float | None = None) -> str:
    """An effect with its sign, and its interval's half width where there is one: '+0.263 ± 0.041'."""
    words = f"{value:+.3g}"
    return words if half is None else f"{words} ± {half:.2g}"


def map_png(values: np.ndarray, *, vmax: float) -> str:
    """A concept's codes on its grid (gh gw) as a data: URI of a gh x gw RGBA PNG: the colour map's colour, its
    opacity growing with the code as on the app's cards (`render.concepts`), to lie over the image it was read
    from (the page scales it up, each cell a block)."""
    unit = normalise(np.asarray(values, np.float32), 0.0, vmax) if vmax > 0 else np.zeros(np.shape(values), np.float32)
    rgba = np.concatenate([colorize(unit), np.round(unit * OPACITY * 255).astype(np.uint8)[..., None]], -1)
    return "data:image/png;base64," + base64.b64encode(png_bytes(rgba)).decode()


def table(heads: list[str], rows: list[list[str]], *, numbers: set[int] = frozenset(), caption: str = "") -> str:
    """A table of cells already in HTML; the columns in `numbers` right-aligned."""
    head = "".join(f'<th{" class=num" if i in numbers else ""}>{h}</th>' for i, h in enumerate(heads))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numbers else ""}>{cell}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    caption = f"<caption>{caption}</caption>" if caption else ""
    return f'<div class="scroll"><table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
