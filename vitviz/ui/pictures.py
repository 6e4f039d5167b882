"""What a concept looks like on the Concepts and Circuits tabs' cards: its feature pictures (`vitviz.looks`), shipped
beside its dictionary or drawn here, and "Draw this concept" where none ships.

A card's pictures are, first found first: those drawn for it in this session ("Draw this concept", kept in the
session); those shipped beside its dictionary (`looks.pictures_of`: a bundled dictionary's looks.safetensors, read once
a process, and again when the file changes); none, and the card says so and offers to draw them. A drawing uses the
shipped pictures' settings (`looks.pictures.SETTINGS`, seed 0), so drawn on the device that drew a shipped file of
this vitviz's drawing it is the picture the file holds (`looks.Pictures.current`: the bundled files predate it).
Of a dictionary across models a card shows the picture that excites the concept in every model at once ("shared"),
then each model's own, each labelled with its model: whether the families see the concept alike. Shipped, those are
all the dictionary's models; drawn here, the card's (both of the page's models where both columns read the
dictionary).

On request ("Draw variants", once a card is picked) a card shows `VARIANTS` more pictures of its concept, drawn
together from other starts and pushed apart in style (`looks.draw(variants=)`, Olah et al. 2017's diversity term),
and the picture that lowers it most ("negative"), in the card's models at once, with the same settings; kept in the
session beside its pictures. The same computation as `/looks` with its variants and negative.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gradio as gr
import numpy as np

from . import gpu
from .drawn import draw_pictures as drawn_pictures
from .shared import session

SHARED_LABEL, ONE_LABEL = "shared", "its picture"
VARIANTS = 3   # a card's variants drawn on request, beside its negative


@dataclass(frozen=True)
class Asked:
    """What a card's pictures are of: concept `concept` of the dictionary `source` (as `gpu.dictionary_source` gives
    it), on the card's models (names as the GPU functions load them; several only of a dictionary across them)."""
    source: str
    concept: int
    models: tuple[str, ...]

    def plan(self) -> list[list[str]]:
        """The pictures a drawing makes (`gpu.draw_pictures`' plan): in all the card's models at once, then, of a
        dictionary across several of them, in each alone."""
        return [list(self.models), *([m] for m in self.models if len(self.models) > 1)]

    def labels(self) -> list[str]:
        """Each drawn picture's label on the card: 'shared' for the one across models, then each model's short name
        for its own; 'its picture' on a card of one model."""
        return [SHARED_LABEL, *short_names(self.models)] if len(self.models) > 1 else [ONE_LABEL]


def short_names(models) -> list[str]:
    """Model names without the ending they all share ('vit-cifar10', 'cvt-cifar10' -> 'vit', 'cvt'), for labels."""
    models = list(models)
    ending = os.path.commonprefix([m[::-1] for m in models])[::-1] if len(models) > 1 else ""
    ending = ending[ending.find("-"):] if "-" in ending else ""   # from a word's start: '-cifar10', not 'ifar10'
    return [m[:-len(ending)] for m in models] if ending and all(len(m) > len(ending) for m in models) else models


@lru_cache(maxsize=64)
def _read(folder: str, modified: float):
    from ..looks import LooksError, pictures_of

    try:
        return pictures_of(folder)
    except LooksError:   # a damaged file is as none: the card offers to draw the picture
        return None


def shipped(source: str):
    """The pictures shipped beside the dictionary `source` (`looks.Pictures`), or None: none there, a dictionary
    from the Hub, or a damaged file. Read once a process, again when the file changes."""
    from ..looks.pictures import FILE

    folder = gpu.dictionary_folder(source)
    path = None if folder is None else Path(folder) / FILE
    if path is None or not path.is_file():
        return None
    return _read(str(folder), path.stat().st_mtime)


def drawn(key, asked: Asked) -> list[gpu.Picture] | None:
    """The pictures drawn for `asked` in this session, or None."""
    return session(key).reading(("looks", asked))


def variants_drawn(key, asked: Asked) -> list[gpu.Picture] | None:
    """The variants and negative drawn for `asked` in this session, or None."""
    return session(key).reading(("variants", asked))


def own_pictures(key, asked: Asked) -> list[tuple[str, np.ndarray]]:
    """A card's (label, picture) pairs, first found first (the module docstring); [] for none: "Draw this concept"
    has work to do."""
    kept = drawn(key, asked)
    if kept is not None:
        return [(label, picture.image) for label, picture in zip(asked.labels(), kept)]
    found = shipped(asked.source)
    if found is None or not 0 <= asked.concept < found.n_concepts:
        return []
    if len(found.sets) == 1:   # a dictionary of one model
        return [(ONE_LABEL, found.picture(asked.concept)[0])]
    return ([(SHARED_LABEL, found.picture(asked.concept)[0])]
            + [(label, found.picture(asked.concept, model)[0])
               for label, model in zip(short_names(found.models), found.models)])


def card_pictures(key, asked: Asked) -> list[tuple[str, np.ndarray]]:
    """What a card shows: its own pictures, then its variants ('v1', ...) and negative where drawn."""
    extra = [(p.label.replace("variant ", "v"), p.image) for p in variants_drawn(key, asked) or []]
    return own_pictures(key, asked) + extra


def buttons(key, asked: Asked) -> tuple:
    """The picked card's "Draw this concept" and "Draw variants", each shown where it has something to draw."""
    return (gr.Button(visible=not own_pictures(key, asked)),
            gr.Button(visible=variants_drawn(key, asked) is None))


def method_words(name: str) -> str:
    """A method's name as the pages write it ('maco' -> 'MACO')."""
    return {"maco": "MACO"}.get(name, name)


def settings():
    """The shipped pictures' settings (`looks.pictures.SETTINGS`): what a card's drawing uses."""
    from ..looks.pictures import SETTINGS

    return SETTINGS


def estimate(key, plan: list[list[str]]) -> float:
    """The seconds drawing a card's pictures (one per entry of `plan`, `Asked.plan`'s) should take, from its models'
    input sizes (this session's cards)."""
    kept = session(key)
    sizes = {name: run.loaded.transform.crop for name, run in zip(kept.names, kept.runs)}
    return gpu.drawing_seconds([[sizes[m] for m in entry] for entry in plan], settings())


def words(key, asked: Asked, what: str) -> str:
    """The line under a picked card: where its pictures come from, or the offer to draw them (with how long that
    takes, said before it starts), and the offer of its variants. `what`: the concept as the card names it."""
    found, s = shipped(asked.source), settings()
    if variants_drawn(key, asked) is not None:
        more = f" Its {VARIANTS} variants (v1 to v{VARIANTS}) and its negative were drawn here."
    else:
        seconds = estimate(key, [list(asked.models)] * (VARIANTS + 1))
        more = (f" **Draw variants** draws {VARIANTS} more from other starts, pushed apart in style, and the picture "
                f"that lowers it most, in {' and '.join(asked.models)} at once ({gpu.duration_words(seconds)}).")
    if drawn(key, asked) is not None:
        return f"{what}: its pictures were drawn here, on this page's models.{more}"
    if found is not None and 0 <= asked.concept < found.n_concepts:
        made, across = found.settings, len(found.sets) > 1
        return (f"{what}: its {'pictures ship' if across else 'picture ships'} with {asked.source} "
                f"({method_words(made['method'])}, {made['steps']} steps, seed {made['seed']}"
                + ("; the shared one and each model's own" if across else "") + f").{more}"
                + alike_words(found.alike(asked.concept, asked.source)))
    where = " and ".join(asked.models) + (" at once, then in each alone" if len(asked.models) > 1 else "")
    return (f"{what}: no picture of it ships with {asked.source}. **Draw this concept** draws one in {where} "
            f"({method_words(s.method.name)}, {s.steps} steps of {s.copies} crop{'s' * (s.copies > 1)}, seed {s.seed}; "
            f"{gpu.duration_words(estimate(key, asked.plan()))}).{more}")


def alike_words(found) -> str:
    """Whether the models see a concept alike (`looks.Alike`, shipped with the pictures), as a Markdown table: how
    strongly each picture excites the concept in each model, over that model's 99th percentile on photos."""
    if found is None:
        return ""
    ratio = lambda value: f"{value:.1f}x" if np.isfinite(value) else "–"
    names = short_names(found.models)
    rows = ([("shared", found.shared)] if found.shared is not None else []) + \
        [(f"{name}'s own", values) for name, values in zip(names, found.values)]
    lines = ["| picture \\ read in | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
             *(f"| {label} | " + " | ".join(map(ratio, values)) + " |" for label, values in rows)]
    return "\n\n" + "\n".join(lines) + f"\n\n{found.summary()}"


def draw(key, asked: Asked, progress=None) -> list[gpu.Picture]:
    """Draw a card's pictures (one `gpu.draw_pictures` call with the shipped settings), kept in the session."""
    def compute():
        return drawn_pictures(asked.plan(), "concept", asked.concept, dictionary=asked.source, settings=settings(),
                              progress=progress)
    return session(key).reading(("looks", asked), compute)


def draw_variants(key, asked: Asked, progress=None) -> list[gpu.Picture]:
    """Draw a card's variants and negative (one `gpu.draw_pictures` call, in the card's models at once, with the
    shipped settings), kept in the session."""
    def compute():
        return drawn_pictures([list(asked.models)], "concept", asked.concept, dictionary=asked.source,
                              settings=settings(), variants=VARIANTS, negative=True, progress=progress)
    return session(key).reading(("variants", asked), compute)


def drawn_words(pictures: list[gpu.Picture], what: str) -> str:
    """What a drawing made, in words: its pictures, their time, and how far each objective rose."""
    rose = "; ".join(f"{' + '.join(p.models)}{' ' + p.label if p.label else ''}: {p.curve[0]:.2f} -> "
                     f"{p.curve[-1]:.2f}" for p in pictures)
    return (f"{what}: drawn in {sum(p.seconds for p in pictures):.0f} s, now on its card (the objective, first step "
            f"to last: {rose}).")
