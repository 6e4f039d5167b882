"""The atlas's front page and its search: the dictionaries with their models and metrics, the classes, and the
index the search box reads.

The search runs in the browser over `search-index.js` (a script, not a JSON file fetched: a page opened from
file:// may not fetch), one entry per concept and per class page: [dictionary, concept number (-1 for a class),
its title, the words it is found by (the classes of its top images, shared or own, its models), its page]. The
same entries are written as `search.json` for anyone who wants them without a browser.
"""
from __future__ import annotations

from .facts import Facts
from .html import page, percent, table, text
from .pages import Context, class_path, concept_path

METRICS = (   # a dictionary of one model's metrics.json: key, words, how its value is shown
    ("fvu", "FVU (the variance left unexplained)", lambda v: f"{v:.3f}"),
    ("l0", "L0 (concepts firing per token)", lambda v: f"{v:.1f}"),
    ("dead", "dead concepts", percent),
    ("dense", "dense concepts (firing on over 1 % of tokens)", percent),
)


def search_entries(all_facts: list[Facts], context: Context) -> list[list]:
    """The search index's entries (module docstring)."""
    entries = []
    for facts in all_facts:
        for c in range(facts.n_concepts):
            words = [facts.name(c).words, facts.kind_words(c), " ".join(facts.models), facts.source]
            words += [name.words for name in (facts.names[m][c] for m in facts.names)]
            entries.append([facts.slug, c, facts.title(c), " ".join(w for w in words if w).lower(),
                            concept_path(facts.slug, c)])
        for k, name in enumerate(context.classes or ()):
            entries.append([facts.slug, -1, f"{name} ({facts.source})", f"class {name}".lower(),
                            class_path(facts.slug, k, name)])
    return entries


def front_page(all_facts: list[Facts], context: Context, notes: list[str]) -> str:
    """index.html: what the atlas holds, and the search box (in every page's header) explained."""
    parts = ['<p class="lead">Every concept of each dictionary on a page of its own (its pictures, its top images '
             'in each model with where it fires, how often it fires, its effect on each class), and every class by '
             'the concepts each model builds it with. Type a number, a name or a class word in the search box.</p>']
    parts += [f'<p class="missing">{text(note)}</p>' for note in notes]
    for facts in all_facts:
        parts.append(_dictionary(facts, context))
    return page(title="Index", root="", heading="The concept atlas", body="\n".join(parts))


def _dictionary(facts: Facts, context: Context) -> str:
    parts = [f'<section class="dictionary"><h2><a href="{facts.slug}/index.html">{text(facts.source)}</a></h2>',
             f"<p>{facts.n_concepts} concepts, "
             f"{'one dictionary across ' if facts.across else 'of '}{text(', '.join(facts.models))}"
             + (f", block {facts.block + 1} (index {facts.block})" if facts.block is not None and not facts.across
                else "") + f'. <a href="{facts.slug}/index.html">All its concepts</a>.</p>']
    parts.append(_metrics(facts))
    parts += [f'<p class="missing">{text(p)}</p>' for p in facts.problems]
    if context.classes:
        links = " · ".join(f'<a href="{class_path(facts.slug, k, name)}">{text(name)}</a>'
                           for k, name in enumerate(context.classes))
        parts.append(f"<p>Classes: {links}</p>")
    shared = facts.metrics.get("shared_concepts", [])
    if shared:
        links = ", ".join(f'<a href="{concept_path(facts.slug, c)}">{text(facts.title(c))}</a>' for c in shared)
        parts.append(f"<p>The {len(shared)} concepts shared by every model: {links}.</p>")
    return "".join(parts) + "</section>"


def _metrics(facts: Facts) -> str:
    """Its metrics (metrics.json): per model R² (own reconstruction), dead share and its own concepts for a
    dictionary across models; FVU, L0, dead and dense shares for one model's."""
    m = facts.metrics
    if not m:
        return '<p class="note">No metrics.json beside it (`python -m vitviz concepts evaluate` writes one).</p>'
    if "r2" in m and "models" in m:
        own = m.get("specific_concepts", {})
        rows = [[text(model), f"{m['r2'][i][i]:.3f}", percent(m.get("dead", {}).get(model, 0.0)),
                 str(len(own.get(model, [])))] for i, model in enumerate(m["models"])]
        shared = len(m.get("shared_concepts", []))
        return table(["model", "R² (its own tokens)", "dead", "its own concepts"], rows, numbers={1, 2, 3},
                     caption=f"{shared} concepts shared by every model (firing share ≥ {m.get('shared_from', '?')} "
                             f"in each); over {m.get('tokens', '?')} held-out tokens.")
    rows = [[words, shown(m[key])] for key, words, shown in METRICS if isinstance(m.get(key), (int, float))]
    return table(["metric", "value"], rows, numbers={1}, caption=f"On {m.get('tokens', '?')} held-out tokens.")
