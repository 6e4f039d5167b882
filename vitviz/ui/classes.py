"""Explain a class: every method that explains a class chosen from each model's top 5 (a model pass
each, through `gpu.class_maps`), and how faithful the maps are: deletion and insertion curves on this
image (`gpu.faithfulness`) and, over a data set, the leaderboard `python -m vitviz evaluate` ships."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr

from ..explain import FAMILIES, METHODS, method as find_method
from ..leaderboard import leaderboard
from ..render import faithfulness_plot
from ..views import map_view
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, Page, as_files, run_point, runs, session


def method_guide() -> str:
    """What each map method computes, grouped by family (attention-based, gradient-based, relevance
    propagation), for the page."""
    lines = []
    for family, what in FAMILIES.items():
        lines.append(f"\n**{what.capitalize()}.**\n")
        lines += [f"- *{m.title}*: {m.summary}. {m.reference}."
                  + ("" if m.targeted else " The same map for every class: it is the map at the top of the page.")
                  for m in METHODS.values() if m.family == family]
    return "\n".join(lines)


def map_options(run, method: str, target, point) -> dict:
    """What a class map explains (the class chosen for a classifier, the clicked token for a model without one),
    with the method's knobs at its authors' values for a CLIP model."""
    knobs = find_method(method).params_for(run.loaded.takes_prompts)
    if not run.has_classifier:
        return {"point": run_point(run, point), **knobs}
    if target is None or target == "":
        return {"target": None, **knobs}
    try:   # the dropdown offers the top 5; a script may name any class by its index
        return {"target": int(target), **knobs}
    except (TypeError, ValueError):
        raise gr.Error(f"Choose {run.name}'s class from the list (or give its index), not {target!r}.") from None


def render_gradients(key, method, target_a=None, target_b=None, point=None) -> tuple:
    """A map that explains a class chosen from each model's top 5 (a forward and a backward pass each); for
    a model without a classifier, the similarity to the output of the token clicked on the image."""
    kept = session(key)
    if method not in METHODS or not METHODS[method].targeted:
        targeted = ", ".join(m for m in METHODS if METHODS[m].targeted)
        raise gr.Error(f"Choose a method that explains a class: {targeted}.")
    options = [map_options(run, method, t, point) for run, t in zip(kept.runs, (target_a, target_b))]
    kept.fill_maps([[(method, o)] for o in options])
    return tuple(map_view(run, method, **o) for run, o in zip(kept.runs, options))


def render_faithfulness(key, method, steps) -> tuple:
    """Deletion and insertion curves of each model's map against a random order, for its top class."""
    kept = session(key)
    kept.fill_faithfulness(method, int(steps))
    plots = []
    for run in kept.runs:
        if not run.has_classifier:   # the curves follow a class's probability; the tab's note says so in words
            plots.append(None)
            continue
        if not run.applies(method):
            plots.append(map_view(run, method))   # the notice: the method reads attention, which a CNN has none of
            continue
        curves = run.faithfulness(method, steps=int(steps))
        title = METHODS[method].title
        plots.append(faithfulness_plot(
            fractions=curves["fractions"],
            deletion={title: curves["deletion/map"]["scores"], "random": curves["deletion/random"]["scores"]},
            insertion={title: curves["insertion/map"]["scores"], "random": curves["insertion/random"]["scores"]},
            target=f"{run.name}: {run.label(curves['target'])}"))
    return tuple(plots)


def render_leaderboard(model_a, model_b) -> tuple:
    """Each chosen model's faithfulness over a data set (`vitviz evaluate`), where it ships a summary;
    otherwise how to make one."""
    (text_a, plot_a), (text_b, plot_b) = leaderboard((model_a or "").strip()), leaderboard((model_b or "").strip())
    return (text_a if text_a == text_b else f"{text_a}\n{text_b}"), plot_a, plot_b


class Choices(NamedTuple):
    """Both class dropdowns on each model's top 5, and the two sub-tabs' notes on a model without a classifier."""
    target_a: gr.Dropdown
    target_b: gr.Dropdown
    maps_note: str
    faithfulness_note: str


def classifier_notes(key) -> str:
    """Page text for the class-based views when a model has no classifier (what they show for it instead)."""
    return "\n\n".join(run.no_classifier for run in runs(key) if not run.has_classifier)


def class_choices(key) -> Choices:
    """Each model's top 5 to explain (a CLIP model: every prompt), most probable first."""
    targets = [gr.Dropdown(choices=[(f"{p.label} ({p.prob:.0%})", p.index)
                                    for p in run.top(len(run.loaded.labels) if run.loaded.takes_prompts else 5)],
                           value=run.top(1)[0].index if run.has_classifier else None) for run in runs(key)]
    notes = classifier_notes(key)
    return Choices(*targets, notes, notes)


@dataclass
class Classes:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None


def layout(page: Page) -> Classes:
    key = page.key
    with gr.Tab("Explain a class", id="classes"), gr.Tabs(selected="maps", elem_id="classes-tabs"):
        with gr.Tab("Maps", id="maps"):
            method = gr.Radio([(f"{m.title} · {FAMILIES[m.family].partition(':')[0]}", m.name)
                               for m in METHODS.values() if m.targeted],
                              value="grad-rollout", label="method", elem_id="class-method")
            note = gr.Markdown(elem_id="class-note")
            with gr.Row():
                target_a = gr.Dropdown(label="left: explain class", choices=[], allow_custom_value=True,
                                       elem_id="target-a")
                target_b = gr.Dropdown(label="right: explain class", choices=[], allow_custom_value=True,
                                       elem_id="target-b")
                run = gr.Button("Compute", elem_id="class-compute")
            with gr.Row():
                map_a = gr.Image(label="left", interactive=False, elem_id="class-map-a")
                map_b = gr.Image(label="right", interactive=False, elem_id="class-map-b")
            with gr.Accordion("What each method computes", open=False):
                gr.Markdown(method_guide())
        with gr.Tab("Faithfulness", id="faithfulness") as faith_tab:
            with gr.Row():
                faith_method = gr.Radio([(m.title, k) for k, m in METHODS.items()], value="rollout", label="map")
                steps = gr.Slider(4, 32, value=16, step=1, label="steps")
            faith_run = gr.Button("Compute curves", elem_id="faithfulness-compute")
            faith_note = gr.Markdown(elem_id="faithfulness-note")
            with gr.Row():
                faith_a = gr.Image(label="left", interactive=False, elem_id="faithfulness-a")
                faith_b = gr.Image(label="right", interactive=False, elem_id="faithfulness-b")
            gr.Markdown("### Over a data set: which map can you trust?\nEvery method against a random map "
                        "(`python -m vitviz evaluate`), mean and 95 % interval; ↓ lower is better, ↑ higher.")
            board = gr.Markdown(elem_id="leaderboard")
            with gr.Row():
                board_a = gr.Image(label="left: mean curves over the data set", interactive=False)
                board_b = gr.Image(label="right: mean curves over the data set", interactive=False)

    run.click(as_files(render_gradients), inputs=[key, method, target_a, target_b, page.point],
              outputs=[map_a, map_b], api_name="render_gradients", **MODEL_EVENTS)
    faith_run.click(as_files(render_faithfulness), inputs=[key, faith_method, steps], outputs=[faith_a, faith_b],
                    api_name="render_faithfulness", **MODEL_EVENTS)
    for i, listen in enumerate((faith_tab.select, page.model_a.change, page.model_b.change)):
        listen(as_files(render_leaderboard), inputs=[page.model_a, page.model_b], outputs=[board, board_a, board_b],
               api_name="render_leaderboard" if i == 0 else None, **INSTANT, **({} if i == 0 else HIDDEN))

    def explained(event, public: bool) -> None:
        event.success(class_choices, inputs=[key], outputs=[target_a, target_b, note, faith_note], **INSTANT, **HIDDEN)

    return Classes(explained=explained)
