"""The app opened on a concept from a link (the concept atlas's "open the app on it", `atlas.pages.app_address`):
`?dictionary=NAME&concept=N` selects the Concepts tab with the dictionary in the columns of the models it reads
(the page's pair where both read it, else its first two models, or its one model on the left) and pins the concept:
its card comes first in each column that reads the dictionary, whatever photo is explained. A link the app cannot
follow (an unknown dictionary, a concept it does not have) changes nothing and says why on the tab."""
from __future__ import annotations

import gradio as gr

from .. import catalog
from ..atlas.pages import APP_QUERY
from ..concepts import load as load_dictionary
from .concepts import dictionaries_for, pick_line


def dictionary_models(name: str) -> tuple[str, ...]:
    """The models a dictionary the app knows by name reads (a bundled one's, or a catalog one's model)."""
    if name in catalog.BUNDLED_DICTIONARIES:
        return catalog.BUNDLED_DICTIONARIES[name].models
    return (catalog.DICTIONARIES[name].model,)


def refused(why: str) -> tuple:
    return (*(gr.skip(),) * 6, f"The link asks for what the app cannot open: {why}", gr.skip())


def opened(model_a: str, model_b: str, request: gr.Request) -> tuple:
    """On the page's load: (left model, right model, the tabs, left dictionary, right dictionary, the pin, the
    Concepts tab's line, whether that tab is open), each skipped where the page's address names no concept."""
    query = dict(request.query_params) if request is not None else {}
    if not any(name in query for name in APP_QUERY):
        return (gr.skip(),) * 8
    dictionary, number = (query.get(name, "").strip() for name in APP_QUERY)
    if dictionary not in catalog.BUNDLED_DICTIONARIES and dictionary not in catalog.DICTIONARIES:
        return refused(f"no dictionary named {dictionary!r} is bundled or in the catalog.")
    if not number.isdigit():
        return refused(f"a concept is a whole number from 0, not {number!r}.")
    concept, models = int(number), dictionary_models(dictionary)
    if dictionary in catalog.BUNDLED_DICTIONARIES:   # shipped: its size is at hand (a Hub one's is read with it)
        n_concepts = load_dictionary(dictionary).n_concepts
        if concept >= n_concepts:
            return refused(f"{dictionary} has {n_concepts} concepts (0 to {n_concepts - 1}), no concept {concept}.")
    if {model_a, model_b} <= set(models):
        pair = (model_a, model_b)
    else:
        pair = tuple(models[:2]) if len(models) > 1 else (models[0], model_b)
    boxes = [gr.Dropdown(choices=dictionaries_for(model), value=dictionary, allow_custom_value=True)
             if model in models else gr.skip() for model in pair]
    pinned = (dictionary, concept)
    return (*pair, gr.Tabs(selected="concepts"), *boxes, pinned, pick_line(pinned), True)
