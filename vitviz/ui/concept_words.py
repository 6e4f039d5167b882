"""The Concepts tab's words: the line over each column, the table under its cards (how strongly each concept fires on
the photo and on the data set, at the class token, in the other model, its match, its birth and what removing it
does), and the numbers they are made of (a dictionary's metrics.json)."""
from __future__ import annotations

import json
from pathlib import Path

from ..concepts.build import METRICS
from ..session import ModelRun
from . import gpu, serving

UNCHANGED = 5e-4      # a probability that moves less than this is said not to move
TOKENS = {"patch": "patch tokens", "patch+cls": "patch and class tokens", "cls": "class token", "position": "positions"}


def percent(p: float, digits: int | None = None) -> str:
    """A share in percent: whole from 10 % up, with one decimal below (or with `digits` decimals)."""
    return f"{100 * p:.{(1 if p < 0.1 else 0) if digits is None else digits}f}%"


def change(before: float, after: float) -> str:
    """'39% -> 44%'; with a decimal more where the two would read the same."""
    digits = None if percent(before) != percent(after) else 1
    return f"{percent(before, digits)} -> {percent(after, digits)}"


def moved(removal: gpu.Removal, concept: int) -> str:
    """What removing `concept` does to the top class, in words ('' where it was not measured)."""
    if concept not in removal.without:
        return ""
    probability, top = removal.without[concept]
    if abs(probability - removal.probability) < UNCHANGED and top == removal.target:
        return f"{removal.target} stays at {percent(removal.probability)}"
    words = f"{removal.target} {change(removal.probability, probability)}"
    return words + (f" ({top} on top)" if top != removal.target else "")


def concept_cell(source: str, concept: int) -> str:
    """A concept's number, linking to its page in the concept atlas the app serves, where it has one."""
    page = serving.atlas_page(source, concept)
    return f"[{concept}]({page})" if page else str(concept)


def table_rows(found: gpu.Concepts, side: int) -> tuple[list[str], list[list[str]]]:
    """A column's table, one row per card in gallery order: (the heads, the rows). How strongly its concept fires on
    the photo, on how much of it and of the data set, at the class token, in the other model, and what removing it
    does; a part the column lacks (no exemplar index, no class token, no removal) has no column."""
    column = found.columns[side]
    at_class = dict(column.class_top or ())
    parts = [("concept", lambda k, c: concept_cell(column.source, c))]
    if any(name.words for name in column.names):
        parts.append(("name", lambda k, c: column.names[k].words))
    parts += [("code", lambda k, c: f"{column.activation[k]:.2f}"), ("photo", lambda k, c: percent(column.on_photo[k]))]
    if column.frequency is not None:
        parts.append(("data", lambda k, c: percent(column.frequency[k])))
    if column.class_top is not None:
        parts.append(("class token", lambda k, c: f"{at_class[c]:.2f}" if c in at_class else ""))
    if found.both is not None:
        parts.append(("both models", lambda k, c: "both" if c in found.both else "only this one"))
    if column.partners is not None:
        parts.append(("match", lambda k, c: "none" if column.partners[k] is None else
                      f"{column.partners[k][0]} ({column.partners[k][1]:.2f})"))
    born = born_at(column.source)
    if born is not None:
        parts.append(("born at", lambda k, c: "not at the end" if born[c] is None else f"step {born[c]}"))
    if column.removal is not None:
        parts.append(("without it", lambda k, c: moved(column.removal, c)))
    rows = [[cell(k, int(c)) for _, cell in parts] for k, c in enumerate(column.concepts)]
    return [head for head, _ in parts], rows


def table_words(run: ModelRun, found: gpu.Concepts, side: int) -> str:
    """The line above a column's table: what its numbers are."""
    column = found.columns[side]
    named = any(name.words for name in column.names)
    words = [f"**{run.name}**, card by card: " + (f"*name*, the classes of its top images in "
                                                  f"{Path(column.data).name} (their shares); " if named else "")
             + "*code*, how strongly each fires on the photo; *photo*, on what share of its cells"]
    if column.frequency is not None:
        words.append(f"*data*, of {Path(column.data).name}'s tokens")
    if column.partners is not None:
        words.append(f"*match*, {found.columns[1 - side].model}'s concept whose map goes with it (correlation)")
    if born_at(column.source) is not None:
        words.append("*born at*, the step of the training run from which it carries at least half its final share of "
                     "the block's variance")
    if column.removal is not None:
        words.append(f"*without it*, the top class with it removed from block {column.block + 1}")
    return "; ".join(words) + "."


def table(run: ModelRun, found: gpu.Concepts, side: int) -> str:
    """A column's concepts as a Markdown table, under the line that says what its numbers are."""
    heads, rows = table_rows(found, side)
    numbers = {"concept", "code", "photo", "data", "class token"}   # right-aligned
    lines = [heads, ["---:" if head in numbers else "---" for head in heads], *rows]
    return table_words(run, found, side) + "\n\n" + "\n".join(f"| {' | '.join(line)} |" for line in lines)


def evaluated(source: str) -> dict:
    """What `vitviz concepts evaluate` wrote of a dictionary on held-out images (its metrics.json; {} where it has
    none, as a dictionary from the Hub)."""
    folder = gpu.dictionary_folder(source)
    report = None if folder is None else folder / METRICS
    return json.loads(report.read_text()) if report is not None and report.is_file() else {}


def held_out_fvu(source: str) -> float | None:
    """The held-out FVU of a dictionary of one model (None: not measured, or one across models, whose report is an
    R² matrix)."""
    return evaluated(source).get("fvu")


def born_at(source: str) -> list[int | None] | None:
    """Of a dictionary across a training run's checkpoints, each concept's birth step (`concepts.analysis.birth`;
    None for one not in the trained model); None for any other dictionary."""
    return evaluated(source).get("births", {}).get("born_at")


def column_words(run: ModelRun, column: gpu.ConceptReading | str) -> str:
    """A column's line: its dictionary (with its held-out FVU where its folder records one), and the concept whose
    removal moves the prediction most, or why there is no removal or no exemplar image."""
    if isinstance(column, str):
        return f"**{run.name}**: {column}"
    fvu = held_out_fvu(column.source)
    what = (f"**{run.name}** through **{column.source}** (block {column.block + 1}'s "
            f"{TOKENS.get(column.tokens, column.tokens)}, {column.n_concepts} concepts, {column.grid[0]} x "
            f"{column.grid[1]} grid" + ("" if fvu is None else f"; held-out FVU {fvu:.3f}") + ")")
    if column.removal is not None:
        changes = {c: p - column.removal.probability for c, (p, _) in column.removal.without.items()}
        strongest = max(changes, key=lambda c: abs(changes[c]))
        what += (f": removing any one concept leaves {column.removal.target} at {percent(column.removal.probability)}"
                 if abs(changes[strongest]) < UNCHANGED else
                 f": removing concept {strongest} moves the prediction most, {moved(column.removal, strongest)}")
    elif column.removal_words:
        what += f". No removal: {column.removal_words}"
    if column.exemplars is None:
        what += f". No exemplar images: {column.exemplar_words}"
    return what if what.endswith(".") else what + "."


def shared_words(found: gpu.Concepts) -> str:
    """The line on what the two columns share: one dictionary across both, or two matched, or why not matched."""
    if found.both is not None:
        return ("One dictionary across both models: a concept is the same in both columns, those both fire on the "
                "photo first.")
    if found.match_words:
        return f"Two separate dictionaries: {found.match_words}"
    if any(not isinstance(column, str) and column.partners is not None for column in found.columns):
        return "Two separate dictionaries, their concepts matched by the correlation of their maps over a data set."
    return ""
