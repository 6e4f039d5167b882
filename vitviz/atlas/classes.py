"""A class's page: for each model, the concepts that build its logit, side by side.

Per model the numbers come from one of two places, and the page says which:

- the model's class circuit, where one was built at this dictionary's block (`circuits.classes`: each node's
  attribution-patching effect on the class's logit minus the mean logit, averaged over the class's images; the
  circuit's drawn concept nodes, signed, with no interval: the circuit's file keeps none per node);
- else the effects the atlas measured (`effects.py`: the same quantity over the class's images among those the
  build read, with a 95 % interval).

Each model's column lists the `SHOWN` concepts of largest effect (those that build the class) and the `AGAINST`
most negative (those that argue against it). For a dictionary across models, whose concepts are one code in every
model, the page also says which concepts every model builds the class with and which only one does.
"""
from __future__ import annotations

from dataclasses import dataclass

from .effects import silence
from .facts import Facts
from .html import page, signed, text
from .pages import Context, class_path, concept_path, picture_path, picture_sets

SHOWN = 8     # concepts per model that build the class
AGAINST = 3   # and that argue against it


@dataclass(frozen=True)
class Column:
    """One model's concepts for a class: where the numbers come from, and (concept, effect, interval half width
    or None) for the builders (largest first) and those against (most negative first)."""
    model: str
    source: str
    builders: list[tuple[int, float, float | None]]
    against: list[tuple[int, float, float | None]]


def columns(facts: Facts, name: str, context: Context) -> list[Column | str]:
    """Per model of the dictionary, its column for class `name`, or a sentence saying why it has none."""
    measured = {e.model: e for e in context.effects.get(facts.slug, ())}
    out: list[Column | str] = []
    silent: list[str] = []   # models none of whose concepts reach the logit: one sentence for them all
    for model in facts.models:
        nodes = [n for n in facts.circuits if n.model == model and n.label == name]
        if nodes:
            ranked = sorted(((n.concept, n.effect, None) for n in nodes), key=lambda e: -e[1])
            out.append(Column(model, f"its class circuit ({nodes[0].file}): the circuit's drawn concept nodes, "
                                     f"each node's effect averaged over the class's images",
                              [e for e in ranked if e[1] > 0][:SHOWN], [e for e in ranked[::-1] if e[1] < 0][:AGAINST]))
            continue
        effects = measured.get(model)
        if effects is None or name not in effects.classes or not effects.images[effects.classes.index(name)]:
            out.append(f"{model}: no class circuit at this dictionary's block, and no effects measured on images of "
                       f"{name} (build with --data on labelled images that hold the class).")
            continue
        if effects.silent:
            silent.append(model)
            continue
        k = effects.classes.index(name)
        ranked = sorted(((c, effects.mean[k][c], effects.half[k][c]) for c in range(facts.n_concepts)),
                        key=lambda e: -e[1])
        out.append(Column(model, f"node effects measured over its {effects.images[k]} images here, ± a 95 % "
                                 f"interval", [e for e in ranked if e[1] > 0][:SHOWN],
                          [e for e in ranked[::-1] if e[1] < 0][:AGAINST]))
    return out + ([silence(silent)] if silent else [])


def class_page(facts: Facts, position: int, name: str, context: Context) -> str:
    """The page of class `name` (number `position` of the data's classes) in this dictionary."""
    root = "../../"
    found = columns(facts, name, context)
    shown = [c for c in found if isinstance(c, Column)]
    parts = [f'<p class="lead">The concepts of <a href="{root}{facts.slug}/index.html">{text(facts.source)}</a> that '
             f'build each model\'s logit for <strong>{text(name)}</strong> (its logit minus the mean logit), '
             f'side by side.</p>']
    summary = _summary(name, shown)
    if summary:
        parts.append(f'<p class="summary">{summary}</p>')
    if facts.across and len(shown) > 1:
        parts.append(_agreement(facts, shown, root))
    parts += [f'<p class="missing">{text(line)}</p>' for line in found if isinstance(line, str)]
    cells = "".join(_column(facts, column, root) for column in shown)
    parts.append(f'<div class="columns">{cells}</div>')
    others = " · ".join(f'<a href="{root}{class_path(facts.slug, k, other)}">{text(other)}</a>'
                        for k, other in enumerate(context.classes or ()) if other != name)
    parts.append(f'<p class="links">Other classes: {others}</p>')
    return page(title=f"{name} · {facts.source}", root=root, heading=f"{name}: the concepts each model uses",
                body="\n".join(parts))


def _summary(name: str, shown: list[Column]) -> str:
    """'cat: #613 and #88 in vit-cifar10, #412 in resnet-cifar10': each model's two strongest builders whose effect
    is above 0 (its interval's lower end, where it has one)."""
    parts = []
    for column in shown:
        sure = [f"#{c}" for c, effect, half in column.builders if effect - (half or 0) > 0][:2]
        if sure:
            parts.append(f"{' and '.join(sure)} in {text(column.model)}")
    return f"{text(name)}: {', '.join(parts)}." if parts else ""


def _agreement(facts: Facts, shown: list[Column], root: str) -> str:
    """Which of the builders every model has, and which only one model has."""
    sets = {column.model: {c for c, _, _ in column.builders} for column in shown}
    every = set.intersection(*sets.values())
    link = lambda c: f'<a href="{root}{concept_path(facts.slug, c)}">{text(facts.title(c))}</a>'
    names = [text(model) for model in sets]
    models = ("every model" if len(sets) == len(facts.models) else
              f"both {names[0]} and {names[1]}" if len(sets) == 2 else "each of " + ", ".join(names))
    verb = "build" if models.startswith("both") else "builds"
    lines = [f"{models[0].upper() + models[1:]} {verb} it with: {', '.join(link(c) for c in sorted(every))}."
             if every else f"No concept is among the {SHOWN} strongest builders of {models}."]
    for model, mine in sets.items():
        alone = sorted(mine - set().union(*(s for m, s in sets.items() if m != model)))
        if alone:
            lines.append(f"Only {text(model)}: {', '.join(link(c) for c in alone)}.")
    return "<ul class=\"agreement\">" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>"


def _column(facts: Facts, column: Column, root: str) -> str:
    def item(concept: int, effect: float, half: float | None) -> str:
        sets = picture_sets(facts, concept)   # the model's own picture, else the shared one
        shown = [column.model] if column.model in sets else sets[:1]
        href = f"{root}{concept_path(facts.slug, concept)}"
        picture = "".join(f'<a href="{href}" tabindex="-1"><img src="{root}{picture_path(facts.slug, name, concept)}"'
                          f' width="48" height="48" alt=""></a>' for name in shown)
        kind = "up" if effect - (half or 0) > 0 else "down" if effect + (half or 0) < 0 else "zero"
        return (f'<li>{picture}<div><a href="{href}">{text(facts.title(concept))}</a><br><span class="effect '
                f'{kind}" data-concept="{concept}" data-effect="{effect!r}">{text(signed(effect, half))}</span>'
                f'</div></li>')
    builders = "".join(item(*e) for e in column.builders) or "<li>none above 0</li>"
    against = "".join(item(*e) for e in column.against) or "<li>none below 0</li>"
    return (f'<section class="column" data-model="{text(column.model)}"><h2>{text(column.model)}</h2>'
            f'<p class="note">From {text(column.source)}.</p><h3>Builds it</h3><ol class="ranked">{builders}</ol>'
            f'<h3>Argues against it</h3><ol class="ranked">{against}</ol></section>')
