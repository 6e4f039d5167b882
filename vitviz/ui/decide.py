"""What decides: which layers and heads write the class into the class token (direct logit attribution,
`gpu.decide`, once per Explain, kept in the session), which patches the top head read it from (its token
effects), and which activations carry the answer from a second image to this one (activation patching,
`gpu.patch`, with its count of forwards said before it runs)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr
import numpy as np

from .. import explain, render
from ..export import Decided
from ..render.decide import contribution_bars, head_heatmap, position_table, signed_heatmap, token_effect_view
from ..session import ModelRun
from . import gpu
from .shared import HIDDEN, INSTANT, MODEL_EVENTS, Page, as_files, runs, session

TITLE = "What decides"
GROUPS = {1: "every token alone", 2: "2 x 2 squares", 4: "4 x 4 squares"}   # residual patching's grid positions
DEFAULT_GROUP = 2   # CvT-13 at 224 px: 1,676 patched images in 31 forwards, against 6,674 in 115 at group 1
AGAINST = {"blur": "the same photo blurred", "noise": "the same photo with noise", "upload": "the image you upload"}

BARS_WORDS = ("**What each block writes for the class.** The top class's logit split over what each block adds to "
              "the class token's residual stream, read through the final norm with its scale frozen at this "
              "forward's value (so the parts add up to the logit): attention (its heads and bias) and MLP, per block "
              "of the last stage.")
HEADS_WORDS = ("**Which heads.** The same for every head of those blocks: red writes for the class, blue against; "
               "each model on its own scale, symmetric about 0.")
EFFECTS_WORDS = ("**Which patches, through the top head.** The head that writes the most for the class, its part "
                 "split over the tokens it read (attention times value, through the frozen readout): red patches "
                 "wrote for the class through it, blue against.")
PATCHING_WORDS = ("**Which activations carry the answer.** Both models read the photo (clean) and a second image "
                  "(corrupted); one activation of the corrupted run is replaced by the clean run's and the forward "
                  "goes on. Each value is how much of the difference in the logit of the photo's class minus a foil "
                  "class that one activation brings back: 1 all of it, 0 none (Heimersheim and Nanda 2024). One "
                  "click each:")
POSITIONS_WORDS = ("**Layer x position.** The residual stream entering each block, patched at one position: the "
                   "prefix tokens first (the class token), then the grid squares row by row (CvT: each stage on its "
                   "own, shorter grid; blank where a block has fewer positions).")
PATCH_HEADS_WORDS = "**Layer x head.** Each head's output (before the output projection) patched at every position."
WAITING = "Press **Explain** first: this panel reads both models on the image."


class Contributions(NamedTuple):
    note: str
    bars_a: np.ndarray | None
    bars_b: np.ndarray | None
    heads_a: np.ndarray | None
    heads_b: np.ndarray | None
    effects_a: np.ndarray | None
    effects_b: np.ndarray | None


class Patched(NamedTuple):
    plan: str
    note: str
    positions_a: np.ndarray | None
    positions_b: np.ndarray | None
    heads_a: np.ndarray | None
    heads_b: np.ndarray | None


def headless_note(runs_: list[ModelRun], what: str) -> str:
    return "\n\n".join(f"{run.name} has no classifier (self-supervised), so there is no class logit for {what}."
                       for run in runs_ if not run.has_classifier)


def classifiers(key) -> list[int]:
    return [i for i, run in enumerate(runs(key)) if run.has_classifier]


def stream_note(runs_: list[ModelRun]) -> str:
    """Page text for a model whose blocks do not add to one residual stream (a ResNet): no attribution."""
    return "\n\n".join(f"{run.name}: a ReLU follows each of its additions, so its logit is no sum of what its blocks "
                       f"add and direct logit attribution does not apply (activation patching, below, does)."
                       for run in runs_ if run.has_classifier and not run.trace.residual_stream)


# ---- direct logit attribution -------------------------------------------------------------------------------

def attributions(key) -> list[Decided | None]:
    """Each run's direct logit attribution of its top class (None for a model without a classifier): one
    `gpu.decide` call for the classifiers, the first time; kept in the session, so drawing again (or the
    Download tab's zip) never asks again."""
    kept = session(key)

    def compute():
        asked = [i for i in classifiers(key) if kept.runs[i].trace.residual_stream]
        got = gpu.decide([kept.names[i] for i in asked], [kept.runs[i].pixels for i in asked], kept.prompts) \
            if asked else []
        found = dict(zip(asked, got))
        return [found.get(i) for i in range(len(kept.runs))]
    return kept.reading("decide", compute)


def block_rows(layers) -> list[str]:
    return [str(layer + 1) for layer in layers]


def heads_view(run: ModelRun, decided: Decided) -> np.ndarray | None:
    table = decided.table
    if table["top_head"] is None:   # a convolutional network: no heads
        return None
    values = np.array([row["heads"] for row in table["layers"]], dtype=float)
    return head_heatmap(values, title=f"{run.name}\nwhat each head writes for {table['target']['label']!r}",
                        rows=block_rows(row["layer"] for row in table["layers"]))


def effects_view(run: ModelRun, decided: Decided) -> np.ndarray | None:
    """The top head's token effects over the image, captioned with its layer and head (None without heads)."""
    if decided.table["top_head"] is None:
        return None
    top, layers = decided.table["top_head"], [row["layer"] for row in decided.table["layers"]]
    view = token_effect_view(run.canvas, decided.token_effects[layers.index(top["layer"]), top["head"]])
    return render.caption(view, model=run.name, method="token effects of the top head", layer=top["layer"] + 1,
                          head=top["head"] + 1, target=decided.table["target"]["label"],
                          note=f"it writes {top['value']:+.3g} of the logit {decided.table['logit']:.3g}")


def summary(run: ModelRun, decided: Decided) -> str:
    table = decided.table
    attention = sum(row["attention"] for row in table["layers"])
    mlp = sum(row["mlp"] for row in table["layers"])
    top = table["top_head"]
    if top is None:   # a convolutional network: each block's whole update is one part
        return (f"**{run.name}**, class **{table['target']['label']}**: logit {table['logit']:.3g} = the blocks "
                f"{mlp:+.3g}, the last stage's input {table['embedding']:+.3g}, biases {table['bias']:+.3g} "
                f"(sum of the parts {table['sum_of_parts']:.3g}); it has no attention heads.")
    return (f"**{run.name}**, class **{table['target']['label']}**: logit {table['logit']:.3g} = attention "
            f"{attention:+.3g}, MLPs {mlp:+.3g}, the class token's embedding {table['embedding']:+.3g}, biases "
            f"{table['bias']:+.3g} (sum of the parts {table['sum_of_parts']:.3g}); top head: layer {top['layer'] + 1}, "
            f"head {top['head'] + 1} ({top['value']:+.3g}).")


def render_decide(key) -> Contributions:
    """Both models' contributions per block and per head, and the top head's token effects (a model pass the
    first time, through `gpu.decide`; kept afterwards)."""
    if key is None:
        return Contributions(WAITING, None, None, None, None, None, None)
    runs_, readings = runs(key), attributions(key)
    pairs = [(run, decided) for run, decided in zip(runs_, readings) if decided is not None]
    lines = [summary(run, decided) for run, decided in pairs] + [headless_note(runs_, "its heads to write"),
                                                                 stream_note(runs_)]
    bars = [None if d is None else contribution_bars({run.name: d.table}) for run, d in zip(runs_, readings)]
    heads = [None if d is None else heads_view(run, d) for run, d in zip(runs_, readings)]
    effects = [None if d is None else effects_view(run, d) for run, d in zip(runs_, readings)]
    return Contributions("\n\n".join(line for line in lines if line), *bars, *heads, *effects)


# ---- activation patching ------------------------------------------------------------------------------------

def checked_group(group) -> int:
    try:
        group = int(group)
    except (TypeError, ValueError):
        group = None
    if group not in GROUPS:
        raise gr.Error(f"Patch the grid in squares of {', '.join(map(str, GROUPS))} tokens, not {group!r}.")
    return group


def plans(run: ModelRun, group: int) -> list[explain.Plan]:
    """What patching both sites of a run takes, from its kept trace (a model without heads: no head site)."""
    return [explain.patching_plan(run.trace, site=site, group=group, batch_size=gpu.PATCH_BATCH)
            if site == "resid" or run.attends else explain.Plan(0, 0) for site in explain.SITES]


def patch_plan(key, group=DEFAULT_GROUP) -> str:
    """Before a run: how many batched forwards (and patched images) patching both models will take."""
    if key is None:
        return WAITING
    group = checked_group(group)
    runs_ = runs(key)
    counts = {run.name: plans(run, group) for run in runs_ if run.has_classifier}
    if not counts:
        return headless_note(runs_, "patching to follow")
    forwards = sum(p.forwards for each in counts.values() for p in each)
    images = sum(p.images for each in counts.values() for p in each)
    parts = "; ".join(f"{name}: {resid.forwards} for the residual stream, {head.forwards} for the heads"
                      for name, (resid, head) in counts.items())
    return (f"Patching ({GROUPS[group]}) takes **{forwards:,} batched forwards** of up to {gpu.PATCH_BATCH} patched "
            f"images ({images:,} in all), besides two traced runs per model: {parts}.")


def checked_against(against, upload) -> tuple[str, str | None]:
    if against not in AGAINST:
        raise gr.Error(f"Patch from {' or '.join(repr(a) for a in AGAINST)}, not {against!r}.")
    if against != "upload":
        return against, None
    if upload is None:
        raise gr.Error("Upload the second image first (the one to patch from), or patch from the photo blurred or "
                       "with noise.")
    return against, upload if isinstance(upload, str) else upload["path"]


def positions_view(run: ModelRun, found: explain.Patching) -> np.ndarray:
    return signed_heatmap(position_table(found), title=f"{run.name}: share of the answer each position carries",
                          xlabel="position: prefix tokens, then the grid row by row",
                          rows=block_rows(range(len(found.grid))))


def patch_heads_view(run: ModelRun, found: explain.Patching | None) -> np.ndarray | None:
    if found is None:   # a convolutional network: no heads to patch
        return None
    return head_heatmap(found.heads.numpy(), title=f"{run.name}\nshare of the answer each head carries",
                        rows=block_rows(range(len(found.heads))))


def metric_words(run: ModelRun, found: explain.Patching) -> str:
    m = found.metric
    return (f"**{run.name}**: logit({run.label(m.target)}) - logit({run.label(m.foil)}) is {m.clean:.3g} on the photo "
            f"and {m.corrupted:.3g} on the second image.")


def patch(key, against="blur", upload=None, group=DEFAULT_GROUP, progress=gr.Progress()) -> Patched:
    """Activation patching of both models from the second image (`against`: the photo blurred, with noise, or
    the uploaded file) towards the photo, through `gpu.patch` with a progress bar; kept per second image and
    group, so asking again draws from the session."""
    group = checked_group(group)
    against, path = checked_against(against, upload)
    kept = session(key)
    asked = classifiers(key)
    plan = patch_plan(key, group)
    if not asked:
        return Patched(plan, "", None, None, None, None)

    def compute():
        return gpu.patch([kept.names[i] for i in asked], [kept.runs[i].pixels for i in asked], against, path, group,
                         kept.prompts, progress=progress)
    found = dict(zip(asked, kept.reading(("patch", against, path, group), compute)))
    lines = [f"Patched from {AGAINST[against]}, {GROUPS[group]}."]
    lines += [metric_words(kept.runs[i], found[i][0]) for i in asked] + [headless_note(kept.runs, "patching to follow")]
    lines += [f"{kept.runs[i].name} has no attention heads: only its residual stream is patched."
              for i in asked if found[i][1] is None]
    positions = [positions_view(run, found[i][0]) if i in found else None for i, run in enumerate(kept.runs)]
    heads = [patch_heads_view(run, found[i][1]) if i in found else None for i, run in enumerate(kept.runs)]
    return Patched(plan, "\n\n".join(line for line in lines if line), *positions, *heads)


def choose(against: str) -> Callable[[], str]:
    """A button's second image, set in the radio before its patching runs."""
    return lambda: against


def cleared(key, group=DEFAULT_GROUP) -> Patched:
    """After an Explain: the new image's plan, and no patching drawn yet."""
    return Patched(patch_plan(key, group), "", None, None, None, None)


# ---- the tab ------------------------------------------------------------------------------------------------

def decide_open(evt: gr.SelectData) -> bool:
    """Whether the top-level tab just selected is this one (an Explain then draws the attribution at once)."""
    return evt.value == TITLE


def decide_if_open(key, is_open: bool) -> Contributions:
    return render_decide(key) if is_open else Contributions(*(gr.skip(),) * len(Contributions._fields))


@dataclass
class Decide:
    explained: Callable   # (an Explain's event, whether its endpoints are the documented ones) -> None


def layout(page: Page) -> Decide:
    key = page.key
    with gr.Tab(TITLE, id="decide") as tab, gr.Tabs(selected="attribution", elem_id="decide-tabs"):
        with gr.Tab("Heads and layers", id="attribution"):
            gr.Markdown(BARS_WORDS)
            note = gr.Markdown(elem_id="decide-note")
            # the figures say in their titles what they show: no label over them
            with gr.Row():
                bars_a = gr.Image(label="left: each block", show_label=False, interactive=False,
                                  elem_id="decide-bars-a")
                bars_b = gr.Image(label="right: each block", show_label=False, interactive=False,
                                  elem_id="decide-bars-b")
            gr.Markdown(HEADS_WORDS)
            with gr.Row():
                heads_a = gr.Image(label="left: each head", show_label=False, interactive=False,
                                   elem_id="decide-heads-a")
                heads_b = gr.Image(label="right: each head", show_label=False, interactive=False,
                                   elem_id="decide-heads-b")
            gr.Markdown(EFFECTS_WORDS)
            with gr.Row():
                effects_a = gr.Image(label="left: the top head's token effects", interactive=False,
                                     elem_id="decide-effects-a")
                effects_b = gr.Image(label="right: the top head's token effects", interactive=False,
                                     elem_id="decide-effects-b")
        with gr.Tab("Activation patching", id="patching"):
            gr.Markdown(PATCHING_WORDS)
            with gr.Row(equal_height=False):
                with gr.Column(scale=2, min_width=240):
                    with gr.Row():
                        blur = gr.Button(AGAINST["blur"].capitalize(), elem_id="patch-blur")
                        noise = gr.Button(AGAINST["noise"].capitalize(), elem_id="patch-noise")
                    group = gr.Radio([(words, g) for g, words in GROUPS.items()], value=DEFAULT_GROUP,
                                     label="residual stream: the grid's positions", elem_id="patch-group")
                    against = gr.Radio([(words, a) for a, words in AGAINST.items()], value="blur", interactive=False,
                                       label="patched from", elem_id="patch-against")
                with gr.Column(scale=1, min_width=200):
                    upload = gr.Image(label="a second image (optional)", type="filepath", height=160,
                                      sources=["upload", "clipboard"], elem_id="patch-upload")
                    uploaded = gr.Button("Patch from the upload", elem_id="patch-upload-run")
            plan = gr.Markdown(elem_id="patch-plan")
            patch_note = gr.Markdown(elem_id="patch-note")
            gr.Markdown(POSITIONS_WORDS)
            # one above the other: a CvT's first stage makes its table wide
            positions_a = gr.Image(label="left: layer x position", show_label=False, interactive=False,
                                   elem_id="patch-positions-a")
            positions_b = gr.Image(label="right: layer x position", show_label=False, interactive=False,
                                   elem_id="patch-positions-b")
            gr.Markdown(PATCH_HEADS_WORDS)
            with gr.Row():
                patch_heads_a = gr.Image(label="left: layer x head", show_label=False, interactive=False,
                                         elem_id="patch-heads-a")
                patch_heads_b = gr.Image(label="right: layer x head", show_label=False, interactive=False,
                                         elem_id="patch-heads-b")

    with tab:   # not among the top-level Tabs' children, which Gradio's frontend counts as its tabs' indices
        is_open = gr.State(False)
    outputs = [note, bars_a, bars_b, heads_a, heads_b, effects_a, effects_b]
    patched = [plan, patch_note, positions_a, positions_b, patch_heads_a, patch_heads_b]
    tab.select(as_files(render_decide), inputs=[key], outputs=outputs, api_name="render_decide", **MODEL_EVENTS)
    group.change(patch_plan, inputs=[key, group], outputs=[plan], api_name="patch_plan", **INSTANT)
    for i, (button, kind) in enumerate(((blur, "blur"), (noise, "noise"), (uploaded, "upload"))):
        chosen = button.click(choose(kind), outputs=[against], api_name=None, **INSTANT, **HIDDEN)
        # the upload skips Gradio's own decoding: `gpu.patch` reads it with every check of `read_image`
        chosen.success(as_files(patch), inputs=[key, against, upload, group], outputs=patched, preprocess=False,
                       api_name="patch" if i == 0 else None, **MODEL_EVENTS, **({} if i == 0 else HIDDEN))
    page.tabs.select(decide_open, outputs=[is_open], api_name="decide_open", **INSTANT, **HIDDEN)

    def explained(event, public: bool) -> None:
        """After an Explain: the new image's patching plan (nothing patched yet) and, with this tab open, its
        attribution (a model pass)."""
        event.success(cleared, inputs=[key, group], outputs=patched, api_name=None, **INSTANT, **HIDDEN)
        event.success(as_files(decide_if_open), inputs=[key, is_open], outputs=outputs, api_name=None,
                      **MODEL_EVENTS, **HIDDEN)

    return Decide(explained=explained)
