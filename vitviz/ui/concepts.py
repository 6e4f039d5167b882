"""Concepts: what each model represents in the photo, one concept of a sparse dictionary at a time. Per model a
dictionary (by default its bundled one), the photo's most active concepts with their maps over the photo, their
top images from the data set of the dictionary's exemplar index and how often they fire, and what removing each
one from the block does to the prediction; with one dictionary across both models, the same concept in both
columns and which of the photo's concepts both use; with two separate ones, their matched pairs. A click on the
photo lists the concepts active there in both models.

One model pass reads it all (`gpu.concepts`, once per photo and pair of dictionaries, kept in the session); the
cards and the click are drawn from what it returned. Each card shows what its concept looks like too (`pictures.py`:
shipped beside its dictionary, or drawn here by "Draw this concept" once the card is picked; its variants and
negative by "Draw variants")."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import gradio as gr
import numpy as np

from .. import catalog
from ..render.concepts import cell_overlay, concept_card, exemplar_layout, exemplar_tile, photo_side
from ..session import ModelRun
from . import gpu, pictures
from .concept_words import column_words, shared_words, table
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, WHOLE, Page, as_files, run_point, runs, session

TITLE = "Concepts"
WORDS = ("**What each model represents, one concept at a time.** A concept dictionary (a sparse autoencoder) splits "
         "a block's tokens into many learned directions, its concepts; each card is one of the photo's most active, "
         "where it fires on the photo (hatched: unseen) over its top images from a data set, and the table under "
         "the cards gives its numbers. One dictionary for both (**across-cifar10**) shows the same concept in both.")
WAITING = "Press **Explain** first: this panel reads both models on the image."
POINT_WORDS = "Click the photo (the input image at the top) to list the concepts active at that place in both models."
PICK_WORDS = "Click a card to pick its concept: where its pictures come from, or **Draw this concept** where none ship."
PINNED_WORDS = ("Opened on **concept {concept}** of **{dictionary}**: explain any photo and its card comes first in "
                "each column that reads {dictionary}, where it fires on the photo over its top images.")


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
    """A column's dictionary box for `model`: what it offers, and the model's default where `current` neither
    serves the model nor was typed in (a Hub id, a folder). Otherwise its value is left alone: `current` is what the
    box held when the event began, and a dictionary typed in since then must stay."""
    offered = dictionaries_for(model)
    current = (current or "").strip()
    known = current in catalog.BUNDLED_DICTIONARIES or current in catalog.DICTIONARIES
    if current and (current in offered or not known):
        return gr.Dropdown(choices=offered, allow_custom_value=True)
    return gr.Dropdown(choices=offered, value=default_dictionary(model), allow_custom_value=True)


def reading(key, dictionary_a, dictionary_b, pinned=None, *, compute: bool = True) -> gpu.Concepts | None:
    """Both models' concepts through the two dictionaries, a link's `pinned` concept first (`linked.py`): one
    `gpu.concepts` call the first time, kept per dictionaries and pin (without `compute`, the kept one or None)."""
    kept = session(key)
    sources = tuple(gpu.dictionary_source(d) for d in (dictionary_a, dictionary_b))
    pin = None if not pinned else (gpu.dictionary_source(pinned[0]), int(pinned[1]))

    def read():
        return gpu.concepts(kept.names, kept.picture, [run.pixels for run in kept.runs], list(sources), kept.prompts,
                            pin)
    return kept.reading(("concepts", *sources, pin), read if compute else None)


def card_photo(run: ModelRun, column: gpu.ConceptReading) -> np.ndarray:
    """The photo every card of a column draws its concept's map on, at the size the card shows it, the part the
    model never saw shaded."""
    canvas = run.canvas.thumbnail(photo_side(run.canvas.size))
    return canvas.shaded(canvas.fields[run.trace.blocks[column.block].stage])


def card(run: ModelRun, column: gpu.ConceptReading, k: int, base: np.ndarray | None = None,
         shown: list | None = None) -> np.ndarray:
    """The card of a column's k-th shown concept: its map over the photo (`base`, `card_photo`'s, made here if not
    given), under it its pictures (`shown`: `pictures.card_pictures`' pairs; None as []: none yet), then its top
    images."""
    base = card_photo(run, column) if base is None else base
    values = column.maps[k]
    photo = cell_overlay(base, values, column.region, vmax=float(values.max()))
    images = () if column.exemplars is None else tuple(column.exemplars[k])
    tiles = exemplar_tiles(images, exemplar_layout(len(images))[1]) if images else ()
    return concept_card(photo, tiles, title=column.names[k].title, pictures=shown or [])


def card_asked(key, found: gpu.Concepts, side: int, concept: int) -> pictures.Asked:
    """What the pictures of a column's card for `concept` are of: its dictionary's concept, on the column's model, or
    on both models where one dictionary across both is read in both columns."""
    names = session(key).names
    return pictures.Asked(source=found.columns[side].source, concept=int(concept),
                          models=tuple(names) if found.both is not None else (names[side],))


@lru_cache(maxsize=256)   # a concept's top images are the same whatever the photo: drawn once a process
def exemplar_tiles(images: tuple[gpu.ConceptImage, ...], side: int) -> tuple[np.ndarray, ...]:
    """A concept's top images drawn as tiles of `side` px, each map on the strongest's scale (read-only: kept)."""
    tiles = tuple(exemplar_tile(e.thumbnail, e.map, e.region, vmax=images[0].value, side=side,
                                label=f"{e.label or ''} {e.value:.2g}".strip()) for e in images)
    for drawn in tiles:
        drawn.setflags(write=False)
    return tiles


def cards(key, run: ModelRun, found: gpu.Concepts, side: int) -> tuple[list, str]:
    """A column's cards for its gallery, each captioned with its concept, and their table as page text (a gallery
    cuts a caption to its thumbnail's width)."""
    column = found.columns[side]
    if isinstance(column, str):
        return [], ""
    base = card_photo(run, column)
    items = [(card(run, column, k, base, pictures.card_pictures(key, card_asked(key, found, side, c))), f"{int(c)}")
             for k, c in enumerate(column.concepts)]
    return items, table(run, found, side)


def render_concepts(key, dictionary_a, dictionary_b, pinned=None) -> Shown:
    """Both models' concepts on the photo through the two dictionaries (a model pass the first time, through
    `gpu.concepts`; kept afterwards): the cards of each column and the words."""
    if key is None:
        return Shown(WAITING, [], [], "", "", "")
    runs_, found = runs(key), reading(key, dictionary_a, dictionary_b, pinned)
    (cards_a, words_a), (cards_b, words_b) = (cards(key, run, found, side) for side, run in enumerate(runs_))
    lines = [column_words(run, column) for run, column in zip(runs_, found.columns)] + [shared_words(found)]
    return Shown("\n\n".join(line for line in lines if line), cards_a, cards_b, words_a, words_b, POINT_WORDS)


def cell_at(column: gpu.ConceptReading, where: tuple[float, float]) -> int | None:
    """The cell (row-major) of a column's grid under a point at (y, x), fractions of the photo; None outside."""
    y0, x0, y1, x1 = column.region
    (gh, gw), (y, x) = column.grid, where
    if not (y0 <= y < y1 and x0 <= x < x1):
        return None
    return int((y - y0) / (y1 - y0) * gh) * gw + int((x - x0) / (x1 - x0) * gw)


def concepts_at(key, point, dictionary_a, dictionary_b, pinned=None) -> str:
    """A click on the input image: the concepts active at that place in both models, from the kept reading (with
    one dictionary across both, those active there in both are marked)."""
    if key is None:
        return WAITING
    if point is None:
        return POINT_WORDS
    kept, found = session(key), reading(key, dictionary_a, dictionary_b, pinned, compute=False)
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


def picked_at(side: int) -> Callable:
    """The handler of a click on one column's card: its concept picked ((side, concept)), the line on its pictures,
    and the draw buttons shown where there is something to draw (`pictures.buttons`)."""
    def pick(key, dictionary_a, dictionary_b, pinned, evt: gr.SelectData):
        found = None if key is None else reading(key, dictionary_a, dictionary_b, pinned, compute=False)
        if found is None or isinstance(found.columns[side], str):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        column, k = found.columns[side], int(evt.index)
        asked = card_asked(key, found, side, column.concepts[k])
        what = f"**{column.names[k].title}** ({runs(key)[side].name})"
        return ((side, int(column.concepts[k])), pictures.words(key, asked, what), *pictures.buttons(key, asked))
    return pick


def drawer(drawing: Callable, button: str) -> Callable:
    """The handler of a draw button (`button`, its words) on the picked card: `drawing(key, asked, progress)`
    (`pictures.draw`: "Draw this concept"; `pictures.draw_variants`: "Draw variants"; a GPU call the first time,
    kept in the session), and both columns' cards drawn again with what it drew."""
    def handler(key, dictionary_a, dictionary_b, pinned, picked, progress=gr.Progress()) -> tuple:
        found = None if key is None else reading(key, dictionary_a, dictionary_b, pinned, compute=False)
        if found is None or not picked:
            raise gr.Error(f"Read the concepts and click a card first, then press {button}.")
        side, concept = picked
        column = found.columns[side]
        asked = card_asked(key, found, side, concept)
        drawn = drawing(key, asked, progress)
        shown = render_concepts(key, dictionary_a, dictionary_b, pinned)
        what = f"**{column.names[list(column.concepts).index(concept)].title}** ({runs(key)[side].name})"
        return (shown.concepts_a, shown.concepts_b, pictures.drawn_words(drawn, what),
                *pictures.buttons(key, asked))
    return handler


draw_picked = drawer(pictures.draw, "Draw this concept")
draw_variants_picked = drawer(pictures.draw_variants, "Draw variants")


def pick_line(pinned) -> str:
    """The line above the cards while none is picked: what to click, or the concept a link pinned."""
    return PICK_WORDS if not pinned else PINNED_WORDS.format(dictionary=pinned[0], concept=pinned[1])


def concepts_open(evt: gr.SelectData) -> bool:
    """Whether the top-level tab just selected is this one (an Explain then reads the concepts at once)."""
    return evt.value == TITLE


def after_explain(key, dictionary_a, dictionary_b, pinned=None) -> tuple:
    """A new Explain: each column's dictionary box for its model, and nothing drawn of the last photo."""
    names = session(key).names
    return (dictionary_box(names[0], dictionary_a), dictionary_box(names[1], dictionary_b), "", [], [], "", "",
            POINT_WORDS)


def concepts_if_open(key, dictionary_a, dictionary_b, pinned, is_open: bool) -> Shown:
    skipped = Shown(*(gr.skip(),) * len(Shown._fields))
    return render_concepts(key, dictionary_a, dictionary_b, pinned) if is_open else skipped


@dataclass
class ConceptsTab:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None
    on_point: tuple       # (handler, inputs, outputs) for a click on the input image
    linked: tuple         # what a link to a concept sets (`linked.py`): the dictionary boxes, pin, pick line, is_open


def layout(page: Page) -> ConceptsTab:
    key, point = page.key, page.point
    info = "bundled, from the catalog, a Hub id (owner/name) or a folder the server allows"
    with gr.Tab(TITLE, id="concepts") as tab:
        gr.Markdown(WORDS)
        with gr.Row(equal_height=True):
            dictionary_a, dictionary_b = (
                gr.Dropdown(dictionaries_for(model.value), value=default_dictionary(model.value),
                            allow_custom_value=True, label=f"{side}: dictionary", info=info, scale=2,
                            min_width=260, elem_id=f"concepts-dictionary-{letter}")
                for side, letter, model in (("left", "a", page.model_a), ("right", "b", page.model_b)))
            read = gr.Button("Read the concepts", variant="primary", scale=1, elem_id="concepts-read")
        note = gr.Markdown(label="what each model finds", elem_id="concepts-note")
        point_words = gr.Markdown(POINT_WORDS, label="at the clicked place", elem_id="concepts-point")
        with gr.Row(equal_height=True):
            pick_words = gr.Markdown(PICK_WORDS, elem_id="concepts-pick")
            draw = gr.Button("Draw this concept", visible=False, scale=0, min_width=180, elem_id="concepts-draw")
            variants = gr.Button("Draw variants", visible=False, scale=0, min_width=150, elem_id="concepts-variants")
        with gr.Row(equal_height=False):
            with gr.Column():
                concepts_a = gr.Gallery(label="left: the photo's concepts", columns=2, **WHOLE, elem_id="concepts-a")
                words_a = gr.Markdown(label="left: each concept", elem_id="concepts-words-a",
                                      elem_classes="concept-table")
            with gr.Column():
                concepts_b = gr.Gallery(label="right: the photo's concepts", columns=2, **WHOLE, elem_id="concepts-b")
                words_b = gr.Markdown(label="right: each concept", elem_id="concepts-words-b",
                                      elem_classes="concept-table")

    with tab:   # not among the top-level Tabs' children, which Gradio's frontend counts as its tabs' indices
        is_open, picked, pinned = gr.State(False), gr.State(None), gr.State(None)
    inputs, outputs = [key, dictionary_a, dictionary_b, pinned], [note, concepts_a, concepts_b, words_a, words_b,
                                                                  point_words]
    unpicked = dict(fn=lambda pin: (None, pick_line(pin), gr.Button(visible=False), gr.Button(visible=False)),
                    inputs=[pinned], outputs=[picked, pick_words, draw, variants], api_name=None, **INSTANT,
                    **HIDDEN)   # new cards: none picked
    read.click(as_files(render_concepts), inputs=inputs, outputs=outputs, api_name="concepts",
               **MODEL_EVENTS).then(**unpicked)
    tab.select(as_files(render_concepts), inputs=inputs, outputs=outputs, api_name=None, **MODEL_EVENTS,
               **HIDDEN).then(**unpicked)
    page.tabs.select(concepts_open, outputs=[is_open], api_name="concepts_open", **INSTANT, **HIDDEN)
    for side, gallery in enumerate((concepts_a, concepts_b)):
        gallery.select(picked_at(side), inputs=inputs, outputs=[picked, pick_words, draw, variants], api_name=None,
                       **INSTANT, **HIDDEN)
    for button, handler in ((draw, draw_picked), (variants, draw_variants_picked)):   # `/looks`'s computation
        button.click(as_files(handler), inputs=[*inputs, picked],
                     outputs=[concepts_a, concepts_b, pick_words, draw, variants], api_name=None, **MODEL_EVENTS,
                     **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain: each column's dictionary for its model, the last photo's cards cleared and, with this
        tab open, the new photo's concepts (a model pass)."""
        chosen = event.success(after_explain, inputs=inputs, outputs=[dictionary_a, dictionary_b, *outputs],
                               api_name=None, **INSTANT, **HIDDEN)
        chosen.then(**unpicked)
        chosen.success(as_files(concepts_if_open), inputs=[*inputs, is_open], outputs=outputs, api_name=None,
                       **MODEL_EVENTS, **HIDDEN)

    on_point = (concepts_at, [key, point, dictionary_a, dictionary_b, pinned], [point_words])
    linked = (dictionary_a, dictionary_b, pinned, pick_words, is_open)
    return ConceptsTab(explained=explained, on_point=on_point, linked=linked)
