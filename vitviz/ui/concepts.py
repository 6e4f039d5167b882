"""Concepts: what each model represents in the photo, one concept of a sparse dictionary at a time. Per model a
dictionary (by default its bundled one), the photo's most active concepts with their maps over the photo, their
top images from the data set of the dictionary's exemplar index and how often they fire, and what removing each
one from the block does to the prediction; with one dictionary across both models, the same concept in both
columns and which of the photo's concepts both use; with two separate ones, their matched pairs. A click on the
photo lists the concepts active there in both models.

One model pass reads it all (`gpu.concepts`, once per photo and pair of dictionaries, kept in the session); the
cards and the click are drawn from what it returned."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import numpy as np

from .. import catalog
from ..render.concepts import cell_overlay, concept_card, exemplar_layout, exemplar_tile, photo_side
from ..session import ModelRun
from . import gpu
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, WHOLE, Page, as_files, run_point, runs, session

TITLE = "Concepts"
UNCHANGED = 5e-4      # a probability that moves less than this is said not to move
WORDS = ("**What each model represents, one concept at a time.** A concept dictionary (a sparse autoencoder) "
         "splits a block's tokens into a few of many learned directions, its concepts. Each card is one of the "
         "photo's most active concepts: its map over the photo (the brighter, the stronger it fires; hatched: what "
         "the model never saw) and its top images from the data set the dictionary's exemplar index was built on, "
         "with where it fires in them; the list under the cards says how strongly and how often each fires and "
         "what removing it from the block (the rest of the model run on what is left) does to the top class. "
         "Choose the same dictionary across both models for both columns (**across-cifar10** for the bundled ones) "
         "to see the same concept in both; click the photo to list the concepts active at that place.")
WAITING = "Press **Explain** first: this panel reads both models on the image."
POINT_WORDS = "Click the photo (the input image at the top) to list the concepts active at that place in both models."


class Shown(NamedTuple):
    note: str
    concepts_a: list
    concepts_b: list
    words_a: str
    words_b: str
    point: str


def dictionaries_for(model: str) -> list[str]:
    """The dictionaries a model's box offers: the bundled ones that read it (those shipped), then the catalog's."""
    name = (model or "").strip()
    return ([e.name for e in catalog.BUNDLED_DICTIONARIES.values() if name in e.models and e.path.is_dir()]
            + [e.name for e in catalog.DICTIONARIES.values() if e.model == name])


def default_dictionary(model: str) -> str:
    """The dictionary a model's column opens with: its own bundled one, else the first it is offered; '' for
    none."""
    offered = dictionaries_for(model)
    own = [name for name in offered if name in catalog.BUNDLED_DICTIONARIES
           and catalog.BUNDLED_DICTIONARIES[name].models == ((model or "").strip(),)]
    return (own or offered or [""])[0]


def dictionary_box(model: str, current: str | None = None) -> gr.Dropdown:
    """A column's dictionary box for `model`: what it offers, keeping `current` where it serves the model or was
    typed in (a Hub id, a folder), else the model's default."""
    offered = dictionaries_for(model)
    current = (current or "").strip()
    known = current in catalog.BUNDLED_DICTIONARIES or current in catalog.DICTIONARIES
    keep = current and (current in offered or not known)
    return gr.Dropdown(choices=offered, value=current if keep else default_dictionary(model), allow_custom_value=True)


def reading(key, dictionary_a, dictionary_b) -> gpu.Concepts:
    """Both models' concepts through the two dictionaries: one `gpu.concepts` call the first time, kept in the
    session per pair of dictionaries."""
    kept = session(key)
    sources = tuple(gpu.dictionary_source(d) for d in (dictionary_a, dictionary_b))

    def compute():
        return gpu.concepts(kept.names, kept.picture, [run.pixels for run in kept.runs], list(sources), kept.prompts)
    return kept.reading(("concepts", *sources), compute)


def percent(p: float, digits: int | None = None) -> str:
    """A share in percent: whole from 10 % up, with one decimal below (or with `digits` decimals)."""
    return f"{100 * p:.{(1 if p < 0.1 else 0) if digits is None else digits}f}%"


def change(before: float, after: float) -> str:
    """'39% -> 44%'; with a decimal more where the two would read the same."""
    digits = None if percent(before) != percent(after) else 1
    return f"{percent(before, digits)} -> {percent(after, digits)}"


def moved(removal: gpu.Removal, concept: int) -> str | None:
    """What removing `concept` does to the top class, in words (None where it was not measured)."""
    if concept not in removal.without:
        return None
    probability, top = removal.without[concept]
    if abs(probability - removal.probability) < UNCHANGED and top == removal.target:
        return f"without it {removal.target} stays at {percent(removal.probability)}"
    words = f"without it {removal.target} {change(removal.probability, probability)}"
    return words + (f", the top class becomes {top}" if top != removal.target else "")


def card_note(found: gpu.Concepts, side: int, k: int) -> str:
    """What the list under a column's cards says of its k-th concept: how strongly and how often it fires, on the
    photo and over the data set, at the class token, in the other model, and what removing it does."""
    column = found.columns[side]
    concept = int(column.concepts[k])
    parts = [f"mean code {column.activation[k]:.2f}, on {percent(column.on_photo[k])} of the photo's cells"
             if column.on_photo[k] > 0 else "it does not fire on the photo's cells"]
    if column.frequency is not None:
        parts.append(f"fires on {percent(column.frequency[k])} of the tokens of {Path(column.data).name}")
    at_class = dict(column.class_top or ())
    if concept in at_class:
        parts.append(f"at the class token {at_class[concept]:.2f}")
    if found.both is not None:
        parts.append("both models use it" if concept in found.both else "only this model uses it")
    if column.partners is not None:
        partner = column.partners[k]
        other = found.columns[1 - side].model
        parts.append(f"{other} has no match for it" if partner is None else
                     f"matched to {other}'s concept {partner[0]} (correlation {partner[1]:.2f}, mean code here "
                     f"{partner[2]:.2f})")
    removal = column.removal and moved(column.removal, concept)
    return "; ".join(parts + ([removal] if removal else []))


def card_photo(run: ModelRun, column: gpu.ConceptReading) -> np.ndarray:
    """The photo every card of a column draws its concept's map on, at the size the card shows it, the part the
    model never saw shaded."""
    canvas = run.canvas.thumbnail(photo_side(run.canvas.size))
    return canvas.shaded(canvas.fields[run.trace.blocks[column.block].stage])


def card(run: ModelRun, column: gpu.ConceptReading, k: int, base: np.ndarray | None = None) -> np.ndarray:
    """The card of a column's k-th shown concept: its map over the photo (`base`, `card_photo`'s, made here if not
    given), its top images under it."""
    base = card_photo(run, column) if base is None else base
    values = column.maps[k]
    photo = cell_overlay(base, values, column.region, vmax=float(values.max()))
    images = () if column.exemplars is None else tuple(column.exemplars[k])
    tiles = exemplar_tiles(images, exemplar_layout(len(images))[1]) if images else ()
    return concept_card(photo, tiles, title=f"concept {int(column.concepts[k])}")


@lru_cache(maxsize=256)   # a concept's top images are the same whatever the photo: drawn once a process
def exemplar_tiles(images: tuple[gpu.ConceptImage, ...], side: int) -> tuple[np.ndarray, ...]:
    """A concept's top images drawn as tiles of `side` px, each map on the strongest's scale (read-only: kept)."""
    tiles = tuple(exemplar_tile(e.thumbnail, e.map, e.region, vmax=images[0].value, side=side,
                                label=f"{e.label or ''} {e.value:.2g}".strip()) for e in images)
    for drawn in tiles:
        drawn.setflags(write=False)
    return tiles


def cards(run: ModelRun, found: gpu.Concepts, side: int) -> tuple[list, str]:
    """A column's cards for its gallery, each captioned with its concept, and what each says, numbered in gallery
    order, as page text (a gallery cuts a caption to its thumbnail's width)."""
    column = found.columns[side]
    if isinstance(column, str):
        return [], ""
    base = card_photo(run, column)
    items = [(card(run, column, k, base), f"{int(c)}") for k, c in enumerate(column.concepts)]
    words = "\n".join(f"{k}. **concept {int(c)}**: {card_note(found, side, k - 1)}"
                      for k, c in enumerate(column.concepts, 1))
    return items, f"**{run.name}**\n\n{words}"


def listed(concepts: list[tuple[int, float]]) -> str:
    return ", ".join(f"{c} ({code:.2f})" for c, code in concepts) or "none"


def column_words(run: ModelRun, column: gpu.ConceptReading | str) -> str:
    """A column's paragraph: its dictionary, the photo's concepts, the class token's, and what removal does."""
    if isinstance(column, str):
        return f"**{run.name}**: {column}"
    tokens = {"patch": "patch tokens", "patch+cls": "patch and class tokens", "cls": "class token",
              "position": "positions"}.get(column.tokens, column.tokens)
    activation = dict(zip(column.concepts.tolist(), column.activation.tolist()))
    lines = [f"**{run.name}** through **{column.source}** (block {column.block + 1}'s {tokens}, {column.n_concepts} "
             f"concepts, on a {column.grid[0]} x {column.grid[1]} grid): the photo's most active concepts (mean "
             f"code) {listed([(c, activation[c]) for c in column.top.tolist()])}."]
    if column.class_top is not None:
        lines.append(f"At the class token, which its classifier reads: {listed(column.class_top)}.")
    if column.removal is not None:
        changes = {c: p - column.removal.probability for c, (p, _) in column.removal.without.items()}
        strongest = max(changes, key=lambda c: abs(changes[c]))
        if abs(changes[strongest]) < UNCHANGED:
            lines.append(f"Removing any one of them leaves {column.removal.target} at "
                         f"{percent(column.removal.probability)}.")
        else:
            lines.append(f"Removing concept {strongest} moves the prediction most: {moved(column.removal, strongest)}.")
    elif column.removal_words:
        lines.append(f"No removal: {column.removal_words}")
    if column.exemplars is None:
        lines.append(f"No exemplar images: {column.exemplar_words}")
    return " ".join(lines)


def shared_words(runs_: list[ModelRun], found: gpu.Concepts) -> str:
    """The line on the concepts both models use (one dictionary across both), or on their matched pairs."""
    if found.both is not None:
        (a, b), (only_a, only_b) = runs_, found.only
        return (f"One dictionary across both models, so a concept is the same in both columns. Both fire on this "
                f"photo: {', '.join(map(str, found.both)) or 'none of them'}; only {a.name}: "
                f"{', '.join(map(str, only_a)) or 'none'}; only {b.name}: {', '.join(map(str, only_b)) or 'none'}.")
    if found.match_words:
        return f"Two separate dictionaries: {found.match_words}"
    column = found.columns[0]
    if isinstance(column, str) or column.partners is None:
        return ""
    pairs = [f"{c} ~ {p[0]} ({p[1]:.2f})" for c, p in zip(column.concepts, column.partners) if p is not None]
    return (f"Two separate dictionaries, matched by the correlation of their concepts' maps: {runs_[0].name}'s "
            f"concept ~ {runs_[1].name}'s (correlation): {', '.join(pairs) or 'none of these has a match'}.")


def render_concepts(key, dictionary_a, dictionary_b) -> Shown:
    """Both models' concepts on the photo through the two dictionaries (a model pass the first time, through
    `gpu.concepts`; kept afterwards): the cards of each column and the words."""
    if key is None:
        return Shown(WAITING, [], [], "", "", "")
    runs_, found = runs(key), reading(key, dictionary_a, dictionary_b)
    (cards_a, words_a), (cards_b, words_b) = (cards(run, found, side) for side, run in enumerate(runs_))
    lines = [column_words(run, column) for run, column in zip(runs_, found.columns)] + [shared_words(runs_, found)]
    return Shown("\n\n".join(line for line in lines if line), cards_a, cards_b, words_a, words_b, POINT_WORDS)


def cell_at(column: gpu.ConceptReading, where: tuple[float, float]) -> int | None:
    """The cell (row-major) of a column's grid under a point at (y, x), fractions of the photo; None outside."""
    y0, x0, y1, x1 = column.region
    (gh, gw), (y, x) = column.grid, where
    if not (y0 <= y < y1 and x0 <= x < x1):
        return None
    return int((y - y0) / (y1 - y0) * gh) * gw + int((x - x0) / (x1 - x0) * gw)


def concepts_at(key, point, dictionary_a, dictionary_b) -> str:
    """A click on the input image: the concepts active at that place in both models, from the kept reading (with
    one dictionary across both, those active there in both are marked)."""
    if key is None:
        return WAITING
    if point is None:
        return POINT_WORDS
    kept = session(key)
    found = kept.reading(("concepts", *(gpu.dictionary_source(d) for d in (dictionary_a, dictionary_b))))
    if found is None:
        return "Press **Read the concepts** first, then click the photo."
    active = []
    for run, column in zip(kept.runs, found.columns):
        if isinstance(column, str):
            active.append(None)
            continue
        x, y = run_point(run, point)
        h, w = run.canvas.size
        cell = cell_at(column, (y / h, x / w))
        active.append(None if cell is None else (cell, column.at_cells[cell]))
    lines = []
    for side, (run, column, here) in enumerate(zip(kept.runs, found.columns, active)):
        if isinstance(column, str):
            continue
        if here is None:
            lines.append(f"**{run.name}** never saw that point (it is outside its crop).")
            continue
        cell, there = here
        other = active[1 - side]
        both = {c for c, _ in other[1]} if found.both is not None and other is not None else set()
        items = [f"{c} ({code:.2f}{', both' if c in both else ''})" for c, code in there]
        lines.append(f"**{run.name}**, cell ({cell // column.grid[1] + 1}, {cell % column.grid[1] + 1}) of its "
                     f"{column.grid[0]} x {column.grid[1]}: {', '.join(items) or 'no concept fires there'}.")
    return "\n\n".join(lines)


def concepts_open(evt: gr.SelectData) -> bool:
    """Whether the top-level tab just selected is this one (an Explain then reads the concepts at once)."""
    return evt.value == TITLE


def after_explain(key, dictionary_a, dictionary_b) -> tuple:
    """A new Explain: each column's dictionary box for its model, and nothing drawn of the last photo."""
    names = session(key).names
    return (dictionary_box(names[0], dictionary_a), dictionary_box(names[1], dictionary_b), "", [], [], "", "",
            POINT_WORDS)


def concepts_if_open(key, dictionary_a, dictionary_b, is_open: bool) -> Shown:
    return render_concepts(key, dictionary_a, dictionary_b) if is_open else Shown(*(gr.skip(),) * len(Shown._fields))


@dataclass
class ConceptsTab:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None
    on_point: tuple       # (handler, inputs, outputs) for a click on the input image


def layout(page: Page) -> ConceptsTab:
    key, point = page.key, page.point
    info = "a bundled or catalog dictionary, a Hub id (owner/name), or a folder the server's owner allows"
    with gr.Tab(TITLE, id="concepts") as tab:
        gr.Markdown(WORDS)
        with gr.Row(equal_height=True):
            dictionary_a, dictionary_b = (
                gr.Dropdown(dictionaries_for(model.value), value=default_dictionary(model.value),
                            allow_custom_value=True, label=f"{side}: dictionary", info=info, scale=2,
                            elem_id=f"concepts-dictionary-{letter}")
                for side, letter, model in (("left", "a", page.model_a), ("right", "b", page.model_b)))
            read = gr.Button("Read the concepts", variant="primary", scale=1, elem_id="concepts-read")
        note = gr.Markdown(label="what each model finds", elem_id="concepts-note")
        point_words = gr.Markdown(POINT_WORDS, label="at the clicked place", elem_id="concepts-point")
        with gr.Row(equal_height=False):
            with gr.Column():
                concepts_a = gr.Gallery(label="left: the photo's concepts", columns=2, **WHOLE, elem_id="concepts-a")
                words_a = gr.Markdown(label="left: each concept", elem_id="concepts-words-a")
            with gr.Column():
                concepts_b = gr.Gallery(label="right: the photo's concepts", columns=2, **WHOLE, elem_id="concepts-b")
                words_b = gr.Markdown(label="right: each concept", elem_id="concepts-words-b")

    with tab:   # not among the top-level Tabs' children, which Gradio's frontend counts as its tabs' indices
        is_open = gr.State(False)
    inputs, outputs = [key, dictionary_a, dictionary_b], [note, concepts_a, concepts_b, words_a, words_b, point_words]
    read.click(as_files(render_concepts), inputs=inputs, outputs=outputs, api_name="concepts", **MODEL_EVENTS)
    tab.select(as_files(render_concepts), inputs=inputs, outputs=outputs, api_name=None, **MODEL_EVENTS, **HIDDEN)
    page.tabs.select(concepts_open, outputs=[is_open], api_name="concepts_open", **INSTANT, **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain: each column's dictionary for its model, the last photo's cards cleared and, with this
        tab open, the new photo's concepts (a model pass)."""
        chosen = event.success(after_explain, inputs=inputs, outputs=[dictionary_a, dictionary_b, *outputs],
                               api_name=None, **INSTANT, **HIDDEN)
        chosen.success(as_files(concepts_if_open), inputs=[*inputs, is_open], outputs=outputs, api_name=None,
                       **MODEL_EVENTS, **HIDDEN)

    on_point = (concepts_at, [key, point, dictionary_a, dictionary_b], [point_words])
    return ConceptsTab(explained=explained, on_point=on_point)
