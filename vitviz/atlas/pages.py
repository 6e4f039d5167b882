"""A concept's page, its JSON, and a dictionary's page of all its concepts.

A concept's page (`<dictionary>/concepts/<number>.html`) holds its number and name; its pictures (a dictionary
across models: the picture exciting it in every model at once, then each model's own); whether it is shared or one
model's own; per model how often it fires and its top images with where it fires (its codes on the grid, drawn over
the image as the app's cards draw them); its matched concepts; its effect on each class per model and the class
circuits it is part of; and links to its JSON, its neighbours and the app. Its JSON (`<number>.json`) holds the
same facts in Neuronpedia's feature fields where they apply (index, frac_nonzero, activations with their images'
ids, the pictures' paths).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import torch

from ..files import safe_name
from ..looks.alike import PERCENTILE
from .effects import ClassEffects, silence
from .facts import Facts
from .html import map_png, page, percent, signed, table, text

APP = "../../../"   # the app's page from a concept's page when the app serves the site under /atlas
APP_QUERY = ("dictionary", "concept")   # a link opening the app on a concept (`app_address`; the app: ui/linked.py)


def concept_path(slug: str, concept: int) -> str:
    return f"{slug}/concepts/{concept}.html"


def concept_json(slug: str, concept: int) -> str:
    return f"{slug}/concepts/{concept}.json"


def picture_path(slug: str, name: str, concept: int, *, masked: bool = False) -> str:
    """A picture of a set (JPEG), or with its transparency map applied (`masked`: on the pages' paper, WebP)."""
    return f"{slug}/pictures/{safe_name(name)}-{concept}" + ("-masked.webp" if masked else ".jpg")


def class_path(slug: str, position: int, name: str) -> str:
    return f"{slug}/classes/{position}-{safe_name(name)}.html"


def data_slug(data: str) -> str:
    """The folder of a data set's thumbnails: its file's stem and a short hash of its full name (two data sets
    of one stem stay apart)."""
    return f"{safe_name(Path(data).stem)}-{hashlib.sha256(data.encode()).hexdigest()[:8]}"


def thumbnail_path(data: str, image: int) -> str:
    return f"images/{data_slug(data)}/{image}.jpg"


@dataclass
class Context:
    """What a page needs beyond its dictionary's facts: the data's classes (None without labels), each
    dictionary's measured class effects, where each other dictionary's pages are, and the app's address."""
    classes: list[str] | None
    effects: dict[str, list[ClassEffects]] = field(default_factory=dict)   # slug -> one per model
    slugs: dict[tuple[str, int], str] = field(default_factory=dict)        # (model, block) -> slug, one-model dicts
    app: str = APP

    def class_link(self, facts: Facts, name: str, *, root: str) -> str:
        """A class's name linking to its page in this dictionary (plain text where it has none)."""
        if self.classes is None or name not in self.classes:
            return text(name)
        return f'<a href="{root}{class_path(facts.slug, self.classes.index(name), name)}">{text(name)}</a>'


def app_address(app: str, source: str, concept: int) -> str:
    """The app at `app`, opened on concept `concept` of the dictionary `source`."""
    return f"{app}?{urlencode(dict(zip(APP_QUERY, (source, concept))))}"


def picture_sets(facts: Facts, concept: int) -> list[str]:
    """The sets of pictures concept `concept` has, the shared one first (none where the pictures file holds fewer
    concepts: `looks --pictures --limit`)."""
    return [] if facts.pictures is None or concept >= facts.pictures.n_concepts else list(facts.pictures.sets)


def concept_page(facts: Facts, concept: int, context: Context) -> str:
    """Concept `concept`'s page (module docstring)."""
    root = "../../"
    name = facts.name(concept)
    parts = [f'<p class="lead">Concept {concept} of <a href="{root}{facts.slug}/index.html">{text(facts.source)}'
             f'</a> ({facts.n_concepts} concepts, {text(", ".join(facts.models))})'
             + (f': <strong>{text(facts.kind_of(concept))}</strong>' if facts.kind_of(concept) else "") + '.'
             + _birth(facts, concept) + '</p>']
    parts.append(_pictures(facts, concept, root))
    parts.append(_alike(facts, concept))
    parts.append(_frequencies(facts, concept))
    parts.append(_top_images(facts, concept, root))
    parts.append(_partners(facts, concept, context, root))
    parts.append(_class_effects(facts, concept, context, root))
    parts.append(_circuits(facts, concept, context, root))
    neighbours = [f'<a href="{root}{concept_path(facts.slug, c)}">{label}</a>'
                  for c, label in ((concept - 1, "← previous"), (concept + 1, "next →")) if 0 <= c < facts.n_concepts]
    parts.append(f'<p class="links">{" · ".join(neighbours)} · <a href="{concept}.json">this concept as JSON</a>'
                 f'<span class="app"> · <a href="{text(app_address(context.app, facts.source, concept))}">open the '
                 f'app on it</a> (its card comes first in the Concepts tab, on any photo)</span></p>')
    return page(title=f"{name.title} · {facts.source}", root=root, heading=name.title,
                body="\n".join(p for p in parts if p))


def _birth(facts: Facts, concept: int) -> str:
    """Of a dictionary across a training run's checkpoints, when the concept was born (`concepts.analysis.birth`,
    in its metrics.json)."""
    born = facts.metrics.get("births", {}).get("born_at")
    if not born or concept >= len(born):
        return ""
    return (" Not in the trained model." if born[concept] is None else
            f" Born at step {born[concept]} of the training run (from then on it carries at least half its final "
            f"share of the block's variance).")


def _pictures(facts: Facts, concept: int, root: str) -> str:
    sets = picture_sets(facts, concept)
    if not sets:
        return f'<p class="missing">{text(next((p for p in facts.problems if "pictures" in p), "No pictures."))}</p>'
    rows = []
    for masked, how in ((False, ""), (True, ", its transparency map applied")):
        rows.append('<div class="row">' + "".join(
            f'<figure><img class="picture" src="{root}{picture_path(facts.slug, name, concept, masked=masked)}" '
            f'width="128" height="128" alt="the picture exciting concept {concept} {text(_set_words(name))}{how}">'
            f'<figcaption>{text(_set_words(name))}</figcaption></figure>' for name in sets) + "</div>")
    where = ", in every model at once and in each alone" if facts.across else ""
    return (f'<h2>What it looks like</h2>{"".join(rows)}<p class="note">Feature pictures (MACO): the image that '
            f'excites the concept most{where}; under each, the same picture with its transparency map applied as '
            f'MACO\'s paper shows them (opaque where the crops\' gradients were largest: what the concept reads).</p>')


def _alike(facts: Facts, concept: int) -> str:
    """Of a dictionary across models: how strongly each model's picture (and the shared one) excites the concept in
    every model, over that model's 99th percentile on photos (`looks.alike`, measured with the pictures)."""
    if not facts.across or not picture_sets(facts, concept):
        return ""
    found = facts.pictures.alike(concept, facts.source)
    if found is None:
        return f'<p class="missing">{text(next((p for p in facts.problems if "alike" in p), ""))}</p>'
    ratio = lambda value: f"{value:.1f}x" if np.isfinite(value) else "–"
    rows = ([["the shared picture", *map(ratio, found.shared)]] if found.shared is not None else []) + \
        [[f"{text(model)}'s own", *map(ratio, values)] for model, values in zip(found.models, found.values)]
    models = len(found.models)
    return ("<h2>Do the models see it alike?</h2>"
            + table(["picture \\ read in", *map(text, found.models)], rows, numbers=set(range(1, models + 1)),
                    caption=f"Each picture's value of the concept in each model, over that model's "
                            f"{PERCENTILE}th percentile on {text(found.data)} (1x: as strongly as the 1 % of photos "
                            f"that excite it most there; –: below 0 on 99 % of them)")
            + f'<p class="note">{text(found.summary())}</p>')


def _set_words(name: str) -> str:
    return "in every model at once" if name == "shared" else f"in {name}"


def _frequencies(facts: Facts, concept: int) -> str:
    if not facts.indexes:
        return ""
    rows = [[text(model), percent(share), text(facts.names[model][concept].words or "unnamed")]
            for model, share in facts.frequency(concept).items()]
    return "<h2>How often it fires</h2>" + table(["model", "grid tokens it fires on", "classes of its top images"],
                                                 rows, numbers={1})


def _top_images(facts: Facts, concept: int, root: str) -> str:
    parts = ["<h2>Its top images, and where it fires</h2>"]
    for model in facts.models:
        index = facts.indexes.get(model)
        if index is None:
            problem = next((p for p in facts.problems if model in p), f"No top images of {model}.")
            parts.append(f'<p class="missing">{text(problem)}</p>')
            continue
        exemplars = [e for e in _exemplars(index, concept)]
        if not exemplars:
            parts.append(f"<h3>{text(model)}</h3><p>It fires on none of the {len(index.ids)} images indexed.</p>")
            continue
        vmax = exemplars[0][2]
        tiles = "".join(
            f'<figure class="tile"><div class="stack"><img src="{root}{thumbnail_path(index.data, image)}" '
            f'width="96" height="96" alt="{text(label or "image")} {text(id_)}"><img class="map" src="'
            f'{map_png(values, vmax=vmax)}" width="96" height="96" alt=""></div>'
            f'<figcaption>{text(label or "")} {value:.3g}<br><span class="id">{text(id_)}</span></figcaption></figure>'
            for image, values, value, id_, label in exemplars)
        parts.append(f'<h3>{text(model)}</h3><div class="row">{tiles}</div>')
    parts.append('<p class="note">Each image\'s value is the concept\'s largest code over its grid; the colour shows '
                 'the code at each cell, scaled to the first image\'s value.</p>')
    return "".join(parts)


def _exemplars(index, concept: int) -> list[tuple[int, object, float, str, str | None]]:
    """(data set index, map, value, id, class) of the concept's top images in `index`, without thumbnails."""
    out = []
    images = index.images[concept]
    rows = torch.searchsorted(index.thumbnail_images, images.clamp(min=0)).tolist()   # each image's thumbnail
    for image, row, value, values in zip(images.tolist(), rows, index.values[concept].tolist(),
                                         index.maps[concept].float().numpy()):
        if image < 0:
            continue
        label = int(index.labels[row])
        out.append((image, values, value, index.ids[row],
                    index.classes[label] if index.classes and label >= 0 else None))
    return out


def _partners(facts: Facts, concept: int, context: Context, root: str) -> str:
    found = facts.partners.get(concept, [])
    if not found:
        return ""
    items = []
    for partner in found:
        slug = context.slugs.get((partner.model, partner.block))
        what = f"{text(partner.model)} (block {partner.block + 1}) concept {partner.concept}"
        link = f'<a href="{root}{concept_path(slug, partner.concept)}">{what}</a>' if slug else what
        items.append(f"<li>{link}: their codes correlate at ρ = {partner.correlation:.2f}</li>")
    return f"<h2>Matched concepts</h2><ul>{''.join(items)}</ul>"


def _class_effects(facts: Facts, concept: int, context: Context, root: str) -> str:
    silent = [e.model for e in context.effects.get(facts.slug, ()) if e.silent]
    measured = [e for e in context.effects.get(facts.slug, ()) if not e.silent]
    note = f'<p class="note">{text(silence(silent))}</p>' if silent else ""
    if not measured:
        return f"<h2>Its effect on each class</h2>{note}" if note else ""
    by_model = {e.model: {name: (mean, half) for name, _, mean, half in e.of(concept)} for e in measured}
    classes = [name for name in context.classes or () if any(name in m for m in by_model.values())]
    rows = [[context.class_link(facts, name, root=root)]
            + [_effect_cell(*by_model[m][name]) if name in by_model[m] else "" for m in by_model] for name in classes]
    images = sum(measured[0].images)
    return ("<h2>Its effect on each class</h2>" + note
            + table(["class", *(text(m) for m in by_model)], rows, numbers=set(range(1, len(by_model) + 1)),
                    caption=f"The concept's effect on the class's logit minus the mean logit (attribution "
                            f"patching), averaged over the class's images among {images}, ± the half width of a "
                            f"95 % interval."))


def _effect_cell(mean: float, half: float) -> str:
    kind = "up" if mean - half > 0 else "down" if mean + half < 0 else "zero"
    return f'<span class="effect {kind}" data-effect="{mean!r}">{text(signed(mean, half))}</span>'


def _circuits(facts: Facts, concept: int, context: Context, root: str) -> str:
    nodes = facts.circuit_nodes(concept)
    if not nodes:
        return ""
    rows = [[text(node.model), context.class_link(facts, node.label, root=root),
             f'<span class="effect" data-effect="{node.effect!r}">{text(signed(node.effect))}</span>',
             text(node.file)] for node in nodes]
    return "<h2>Class circuits it is part of</h2>" + table(["model", "class", "effect", "circuit"], rows,
                                                           numbers={2})


def concept_record(facts: Facts, concept: int, context: Context) -> dict:
    """Concept `concept` as JSON, in Neuronpedia's feature fields where they apply; paths relative to the site."""
    activations = []
    for model, index in facts.indexes.items():
        for image, values, value, id_, label in _exemplars(index, concept):
            activations.append({"model": model, "image_id": id_, "data_index": image, "label": label,
                                "maxValue": value,
                                "values": values.astype(np.float64).round(4).tolist(),   # float32's repr is long
                                "image": thumbnail_path(index.data, image)})
    effects = {e.model: {name: {"mean": round(mean, 5), "half_width_95": round(half, 5), "images": count}
                         for name, count, mean, half in e.of(concept)} for e in context.effects.get(facts.slug, ())}
    return {
        "dictionary": facts.source, "modelId": list(facts.models), "layer": facts.block, "index": concept,
        "name": facts.name(concept).words, "title": facts.title(concept), "kind": facts.kind_of(concept),
        "frac_nonzero": facts.frequency(concept), "activations": activations,
        "pictures": {name: picture_path(facts.slug, name, concept) for name in picture_sets(facts, concept)},
        "pictures_masked": {name: picture_path(facts.slug, name, concept, masked=True)
                            for name in picture_sets(facts, concept)},
        "alike": _alike_record(facts, concept),
        "matches": [vars(p) for p in facts.partners.get(concept, [])], "class_effects": effects,
        "class_circuits": [vars(n) for n in facts.circuit_nodes(concept)],
        "page": concept_path(facts.slug, concept)}


def _alike_record(facts: Facts, concept: int) -> dict | None:
    """The table of `_alike` as JSON: per picture, each model's value over its percentile (null: not defined)."""
    found = facts.pictures.alike(concept, facts.source) if facts.across and picture_sets(facts, concept) else None
    if found is None:
        return None
    row = lambda values: {m: round(float(v), 4) if np.isfinite(v) else None for m, v in zip(found.models, values)}
    return {"data": found.data, "percentile": PERCENTILE,
            "percentiles": row(found.percentiles),
            "pictures": {**({"shared": row(found.shared)} if found.shared is not None else {}),
                         **{m: row(values) for m, values in zip(found.models, found.values)}}}


def dictionary_page(facts: Facts) -> str:
    """Every concept of a dictionary, each a picture (where there are pictures) and its name, linking to its page."""
    root = "../"
    items = []
    for c in range(facts.n_concepts):
        shown = picture_sets(facts, c)[:1]   # the shared one, or the model's own
        picture = "".join(f'<img src="{root}{picture_path(facts.slug, name, c)}" width="64" height="64" alt="" '
                          f'loading="lazy">' for name in shown)
        kind = facts.kind_of(c) if facts.kind_words(c) else None   # shared, or one model's own: marked
        items.append(f'<li><a href="concepts/{c}.html">{picture}<span>{text(facts.title(c))}</span>'
                     + (f'<small>{text(kind)}</small>' if kind else "") + "</a></li>")
    problems = "".join(f'<p class="missing">{text(p)}</p>' for p in facts.problems)
    return page(title=facts.source, root=root, body=f'{problems}<ol class="concepts">{"".join(items)}</ol>',
                heading=f"{facts.source}: its {facts.n_concepts} concepts")
