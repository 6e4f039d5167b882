"""What changes as a model learns: the views vitviz draws, measured at every checkpoint a training run kept.

A run's checkpoints are models like any other (`vitviz.train --save-steps`; a bundled model's as
`<model>@<step>`, a run folder's as `OUT/steps/step-<N>`), so each view here is the one the rest of vitviz
computes, read at each checkpoint over the same images of a labelled data set:

- `accuracy`: top-1 against the labels.
- `attention_distance`: per block, the ViT paper's mean attention distance (`explain.mean_attention_distance`:
  per head, the attention-weighted pixel distance from each query to its keys, averaged over queries),
  averaged over heads and images, in pixels of the model's input. A block that does not attend: null.
- `receptive_field`: per block, r50 of the effective receptive field (`explain.receptive`, Luo et al. 2016):
  the radius around the centre token holding half of the gradient mass, the maps averaged over the images
  first, in pixels of the model's input.
- `cka_to_final`: per block, debiased minibatch CKA (`compare.LayerCKA`, Kornblith et al. 2019) between the
  block's mean grid token at this checkpoint and at the run's last one, over the same images: 1 where the
  block already computes what it will at the end (up to a rotation and scale).
- `lens_accuracy`: per block, top-1 of the logit lens (`explain.logit_lens`: the block's tokens through the
  checkpoint's own final norm and classifier); null for blocks the classifier cannot read (CvT's first stages).

Raghu et al. (2021) and the ViT paper read these on finished models: with less data a ViT learns local
attention in its lower blocks late or not at all, where a CvT's convolutions give it locality from its
first step. `training_figures` draws them along training: attention distance and CKA to the end as
block x checkpoint heatmaps, accuracy (and the last block's lens) against epochs.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import catalog, hub
from .bundle import read_config, saved_steps, step_folder
from .compare import LayerCKA, batches, block_features, block_names, heatmap
from .data import Dataset, open_data, spread
from .explain.distance import mean_attention_distance
from .explain.lens import lens_layers, logit_lens
from .explain.receptive import ReceptiveFieldSum, receptive_field

Progress = Callable[[float, str], None]
FIGURE_DISTANCE, FIGURE_CKA = "distance", "cka"   # a model's figures: training-<model>-<figure>.png
CURVES_FILE = "training-accuracy.png"               # every model's accuracy on one plot


@dataclass(frozen=True)
class Checkpoint:
    """One kept point of a training run: the name `hub.load` takes for it, its optimiser step and epoch, and its
    checkpoint folder."""
    name: str
    step: int
    epoch: float
    folder: Path


def file_name(model: str) -> str:
    """training-<model>.json: what `vitviz training` writes for a model (and the app reads for a bundled one)."""
    return f"training-{Path(model).name if Path(model).is_dir() else model}.json"


def run_folder(source: str) -> Path:
    """The folder whose `steps/` hold a run's checkpoints: a bundled model's, or a `vitviz.train --out` folder."""
    entry = catalog.CATALOG.get(source.strip())
    if entry is not None and entry.bundled:
        return entry.path
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder
    bundled = ", ".join(name for name, e in catalog.CATALOG.items() if e.bundled and saved_steps(e.path))
    raise ValueError(f"{source!r} is neither a bundled model nor a training run's folder: a run is followed through "
                     f"the checkpoints it kept ({bundled or 'no bundled model keeps any yet'}; "
                     f"`python -m vitviz.train --save-steps ...` keeps them).")


def checkpoints(source: str) -> list[Checkpoint]:
    """The checkpoints a run kept, in training order (see `run_folder`); fewer than two is refused in words."""
    folder = run_folder(source)
    steps = saved_steps(folder)
    if len(steps) < 2:
        raise ValueError(f"{source} keeps {len(steps)} checkpoint(s) of its training, and a change needs two "
                         f"(`python -m vitviz.train --save-steps 0 50 100 ...` keeps them in {folder / 'steps'}).")
    bundled = catalog.CATALOG.get(source.strip()) is not None
    return [Checkpoint(name=f"{source.strip()}@{step}" if bundled else str(step_folder(folder, step)), step=step,
                       epoch=float(read_config(step_folder(folder, step)).get("epoch", 0.0)),
                       folder=step_folder(folder, step)) for step in steps]


def nearest(kept: Sequence[Checkpoint], fraction: float) -> Checkpoint:
    """The checkpoint nearest `fraction` of the run (0: its first, 1: its last), measured in epochs."""
    target = kept[0].epoch + fraction * (kept[-1].epoch - kept[0].epoch)
    return min(kept, key=lambda c: (abs(c.epoch - target), c.step))


def _rounded(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else round(float(v), 4) for v in values]


def measure(loaded, images: list, labels: torch.Tensor, *, cut: list[list[int]], final: list[dict]) -> dict:
    """One checkpoint's views over `images` in the batches `cut` (see the module docstring); `final`: the run's
    last checkpoint's block features per batch, for CKA. The counts and distances are summed on the model's device
    and read back once, at the end."""
    model = loaded.model
    correct, lens_correct, distance, attends, fields, cka = 0, 0, 0, True, ReceptiveFieldSum(), LayerCKA()
    for batch, final_features in zip(cut, final):
        pixels = torch.cat([loaded.preprocess(images[i]) for i in batch])
        truth = labels[batch].to(pixels.device)
        with torch.inference_mode():
            trace = model.trace(pixels)
            correct = correct + (trace.logits.argmax(-1) == truth).sum()
            layers = lens_layers(trace)
            lens_correct = lens_correct + (logit_lens(model, trace).argmax(-1) == truth[:, None]).sum(dim=0)   # L
            attends = trace.blocks[-1].attends
            if attends:
                distance = distance + torch.stack([d.mean(dim=1).sum() for d in mean_attention_distance(trace)])
            cka.add(block_features(trace), final_features)
        fields.add(receptive_field(model, pixels), len(pixels))
    n, names = len(images), block_names(trace)
    lens = [None] * len(names)
    for i, hits in zip(layers, lens_correct.tolist()):
        lens[i] = hits / n
    field, similarity = fields.result(), cka.result()
    return {"accuracy": round(correct.item() / n, 4),
            "attention_distance": _rounded((distance / n).tolist() if attends else [None] * len(names)),
            "receptive_field": _rounded(field.r50.tolist()),
            "cka_to_final": _rounded(np.diag(similarity.a_vs_b).tolist()),
            "lens_accuracy": _rounded(lens)}


def follow(source: str, *, data: str | Path | Dataset = "cifar10", limit: int | None = 100, batch_size: int = 50,
           device: str | None = None, progress: Progress | None = None) -> dict:
    """Every kept checkpoint of `source`'s training measured over the same `limit` images of a labelled data
    set (spread over it): what `training-<model>.json` holds."""
    kept = checkpoints(source)
    dataset = data if isinstance(data, Dataset) else open_data(data)
    if dataset.labels is None:
        raise ValueError(f"{dataset.name} has no labels: accuracy along training needs them (a class-folder data "
                         f"set or an npz with test_labels)")
    picks = spread(len(dataset), limit)
    if len(picks) < 4:
        raise ValueError(f"CKA to the final model needs at least 4 images, and {dataset.name} gives {len(picks)}")
    last = hub.load(kept[-1].name, device=device)
    missing = sorted(set(dataset.classes) - set(last.labels))
    if missing:
        raise ValueError(f"{source} does not classify {', '.join(missing)}: its classes are {', '.join(last.labels)}")
    images = [dataset.image(i) for i in picks]
    labels = torch.tensor([last.labels.index(dataset.classes[dataset.labels[i]]) for i in picks])
    cut = batches(range(len(images)), batch_size)   # CKA's batches, a last one of fewer than 4 joined to the one before
    with torch.inference_mode():
        final = [block_features(last.model.trace(torch.cat([last.preprocess(images[i]) for i in batch]),
                                                 attention=False)) for batch in cut]
    rows = []
    for i, checkpoint in enumerate(kept):
        if progress is not None:
            progress(i / len(kept), f"step {checkpoint.step} ({i + 1} of {len(kept)})")
        loaded = last if i == len(kept) - 1 else hub.load(checkpoint.name, device=device)
        rows.append({"step": checkpoint.step, "epoch": round(checkpoint.epoch, 4),
                     **measure(loaded, images, labels, cut=cut, final=final)})
    if progress is not None:
        progress(1.0, f"{len(kept)} checkpoints")
    with torch.inference_mode():
        names = block_names(last.model.trace(last.preprocess(images[0]), attention=False))
    return {"model": source.strip(), "data": dataset.name, "images": len(images), "blocks": names,
            "units": {"attention_distance": "px of the model's input",
                      "receptive_field": "r50, px of the model's input", "accuracy": "top-1 over the images",
                      "cka_to_final": "debiased CKA of mean grid tokens", "lens_accuracy": "top-1 of the logit lens"},
            "checkpoints": rows}


def read(path: str | Path) -> dict:
    """A `training-<model>.json` as written."""
    return json.loads(Path(path).read_text())


def shipped(model: str) -> dict | None:
    """The training JSON shipped beside a bundled model's checkpoints (None: not there)."""
    entry = catalog.CATALOG.get(model.split("@")[0])
    if entry is None or not entry.bundled:
        return None
    path = entry.path / "steps" / file_name(entry.name)
    return read(path) if path.is_file() else None


def block_by_checkpoint(result: dict, key: str) -> np.ndarray:
    """blocks x checkpoints of one per-block measure (NaN where a block has none)."""
    return np.array([[np.nan if v is None else v for v in row[key]] for row in result["checkpoints"]],
                    dtype=float).T


def step_labels(result: dict) -> list[str]:
    """A heatmap's column labels: each checkpoint's step and epoch."""
    return [f"{row['step']} ({row['epoch']:.2g} ep)" for row in result["checkpoints"]]


def distance_figure(result: dict, *, top: float | None = None) -> np.ndarray:
    """Mean attention distance as a block x checkpoint heatmap, in px of the model's input, coloured from 0 to
    `top` (default: its largest value; give two models one `top` to compare them)."""
    from matplotlib.figure import Figure

    from .render.plots import figure_to_rgb

    values = block_by_checkpoint(result, "attention_distance")
    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", origin="lower", aspect="auto", vmin=0,
                      vmax=top if top is not None else np.nanmax(values))
    ax.set_xticks(range(values.shape[1]), step_labels(result), rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(values.shape[0]), result["blocks"], fontsize=7)
    ax.set_xlabel("optimiser step (epoch)", fontsize=8)
    ax.set_title(f"{result['model']}: mean attention distance (px), {result['images']} images", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03).ax.tick_params(labelsize=7)
    fig.tight_layout()
    return figure_to_rgb(fig)


def cka_figure(result: dict) -> np.ndarray:
    """CKA of each block to the same block at the run's end, as a block x checkpoint heatmap."""
    return heatmap(block_by_checkpoint(result, "cka_to_final"), result["blocks"], step_labels(result),
                   row_title="block", col_title="optimiser step (epoch)",
                   title=f"{result['model']}: CKA to its final checkpoint, {result['images']} images")


def curves_figure(results: Sequence[dict]) -> np.ndarray:
    """Accuracy, and the logit lens's at the middle of the blocks it reads, against epochs, every model on one
    plot."""
    from matplotlib.figure import Figure


    fig = Figure(figsize=(6.4, 3.4), dpi=100)
    ax = fig.add_subplot()
    for k, result in enumerate(results):
        epochs = [row["epoch"] for row in result["checkpoints"]]
        colour = f"C{k}"
        ax.plot(epochs, [100 * row["accuracy"] for row in result["checkpoints"]], "o-", color=colour, ms=3,
                label=f"{result['model']}: accuracy")
        readable = [i for i, v in enumerate(result["checkpoints"][-1]["lens_accuracy"]) if v is not None]
        if readable:
            middle = readable[len(readable) // 2]
            lens = [row["lens_accuracy"][middle] for row in result["checkpoints"]]
            ax.plot(epochs, [100 * v for v in lens], "--", color=colour, lw=1,
                    label=f"{result['model']}: logit lens at {result['blocks'][middle]}")
    ax.axhline(10, color="0.6", lw=0.8, ls=":")
    images = ", ".join(str(r["images"]) for r in results)
    return _finished(fig, ax, y="top-1 (%)", title=f"accuracy along training ({images} images; dotted: chance)")


def _finished(fig, ax, *, y: str, title: str) -> np.ndarray:
    """A plot against epochs labelled, its legend drawn, as an RGB image."""
    from .render.plots import figure_to_rgb

    ax.set_xlabel("epoch", fontsize=8)
    ax.set_ylabel(y, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_to_rgb(fig)


def figure_name(model: str, figure: str) -> str:
    """training-<model>-<figure>.png: one of a model's figures (`FIGURE_DISTANCE`, `FIGURE_CKA`)."""
    return f"{file_name(model).removesuffix('.json')}-{figure}.png"


# ---- a bundled model along its training: what the app's slider and Training tab read ---------------------------

def bundled_run(name: str) -> list[Checkpoint] | None:
    """The kept checkpoints of the bundled model `name` names (`<model>` or `<model>@<step>`), None where it keeps
    fewer than two or is not bundled."""
    entry = catalog.CATALOG.get((name or "").strip().split("@")[0])
    if entry is None or not entry.bundled or len(saved_steps(entry.path)) < 2:
        return None
    return checkpoints(entry.name)


def at_fraction(name: str, fraction: float) -> str:
    """The name of `name`'s checkpoint nearest `fraction` of its training (`name` itself where it keeps none)."""
    kept = bundled_run(name)
    return name if kept is None else nearest(kept, float(fraction)).name


def fraction_of(name: str) -> float | None:
    """How far into its training `<model>@<step>` is (0 to 1); None for a name without a kept step."""
    kept = bundled_run(name)
    at = next((c for c in kept or [] if c.name == (name or "").strip()), None)
    if at is None:
        return None
    return (at.epoch - kept[0].epoch) / (kept[-1].epoch - kept[0].epoch)


def where_words(name: str) -> str:
    """Where in its training the model `name` is, briefly: 'cvt-cifar10: step 391 (epoch 1 of 12)', 'cvt-cifar10: as
    shipped', 'vit-cifar10: no kept run'."""
    kept = bundled_run(name)
    base = (name or "").strip().split("@")[0]
    at = next((c for c in kept or [] if c.name == (name or "").strip()), None)
    if kept is None:
        return f"{base}: no kept run"
    if at is None:
        return f"{base}: as shipped"
    return f"{base}: step {at.step} (epoch {at.epoch:.2g} of {kept[-1].epoch:.3g})"


def summary_words(result: dict) -> str:
    """What a run's training JSON shows, in measured numbers: accuracy from the first checkpoint to the last,
    when the blocks settle (their mean CKA to the end first reaches 0.9), and how the first and last blocks'
    attention distance moved."""
    rows = result["checkpoints"]
    first, last = rows[0], rows[-1]
    settled = next((row for row in rows if np.mean(row["cka_to_final"]) >= 0.9), last)
    words = (f"**{result['model']}**: accuracy {100 * first['accuracy']:.0f} % at step {first['step']}, "
             f"{100 * last['accuracy']:.0f} % at step {last['step']} (epoch {last['epoch']:.3g}); its blocks' mean CKA "
             f"to the end reaches 0.9 at step {settled['step']} (epoch {settled['epoch']:.2g})")
    if first["attention_distance"][0] is not None:
        words += (f"; mean attention distance of {result['blocks'][0]} {first['attention_distance'][0]:.1f} px → "
                  f"{last['attention_distance'][0]:.1f} px, of {result['blocks'][-1]} "
                  f"{first['attention_distance'][-1]:.1f} px → {last['attention_distance'][-1]:.1f} px")
    return words + f" (over {result['images']} test images)."


def _at_epoch(result: dict, epoch: float) -> dict:
    return min(result["checkpoints"], key=lambda row: abs(row["epoch"] - epoch))


def _settled(result: dict) -> dict:
    return next((row for row in result["checkpoints"] if np.mean(row["cka_to_final"]) >= 0.9),
                result["checkpoints"][-1])


def comparison_words(results: Sequence[dict]) -> str:
    """How differently two runs learned, in their measured numbers: accuracy after about one epoch and at the end,
    when their blocks settle (mean CKA to the end 0.9), the block whose mean attention distance moved most, and how
    far their first blocks reach (receptive field) at the start, at the widest and at the end."""
    a, b = results
    one = [_at_epoch(r, 1.0) for r in (a, b)]
    words = (f"After about one epoch {a['model']} is at {100 * one[0]['accuracy']:.0f} % (step {one[0]['step']}) and "
             f"{b['model']} at {100 * one[1]['accuracy']:.0f} % (step {one[1]['step']}); at the end "
             f"{100 * a['checkpoints'][-1]['accuracy']:.0f} % and {100 * b['checkpoints'][-1]['accuracy']:.0f} %. "
             f"Their blocks settle (mean CKA to the end 0.9) at epoch {_settled(a)['epoch']:.2g} and "
             f"{_settled(b)['epoch']:.2g}.")
    moved = [_most_moved(r, "attention_distance") for r in (a, b)]
    if all(moved):
        words += " From initialisation to the end, the block whose attention moved most: " + " and ".join(
            f"{r['model']}'s {block} {start:.1f} → {end:.1f} px" for r, (block, start, end) in zip((a, b), moved)) + "."
    reach = [(r["checkpoints"][0]["receptive_field"][0], max(c["receptive_field"][0] for c in r["checkpoints"]),
              r["checkpoints"][-1]["receptive_field"][0]) for r in (a, b)]
    words += " Their first blocks' receptive fields (r50): " + " and ".join(
        f"{r['model']} {start:.1f} px at the start, {widest:.1f} px at the widest, {end:.1f} px at the end"
        for r, (start, widest, end) in zip((a, b), reach)) + "."
    return words


def _most_moved(result: dict, key: str) -> tuple[str, float, float] | None:
    """(block, first, last) of the block whose `key` moved most from the first checkpoint to the last; None where
    no block has it."""
    first, last = result["checkpoints"][0][key], result["checkpoints"][-1][key]
    moves = [(abs(end - start), block, start, end) for block, start, end in zip(result["blocks"], first, last)
             if start is not None and end is not None]
    return max(moves)[1:] if moves else None


def prediction_figure(series: Sequence[dict], *, marks: Sequence[float | None] = ()) -> np.ndarray:
    """A photo along training: per model (`series[i]`: model, epochs, probs (checkpoints x classes), labels) the
    probability of the class it ends up predicting at each checkpoint; `marks`: the epoch each model is shown at."""
    from matplotlib.figure import Figure


    fig = Figure(figsize=(6.4, 2.8), dpi=100)
    ax = fig.add_subplot()
    for k, one in enumerate(series):
        probs = np.asarray(one["probs"])
        final = int(probs[-1].argmax())
        ax.plot(one["epochs"], 100 * probs[:, final], "o-", color=f"C{k}", ms=3,
                label=f"{one['model']}: p({one['labels'][final]})")
        if k < len(marks) and marks[k] is not None:
            ax.axvline(marks[k], color=f"C{k}", lw=0.8, ls="--")
    ax.set_ylim(0, 100)
    return _finished(fig, ax, y="probability (%)",
                     title="this photo along training: the class each model ends up predicting")


def concept_births(model: str) -> dict | None:
    """What `concepts evaluate` measured of the bundled dictionary across `model`'s training run (its births:
    steps, each concept's birth, how many exist at each step), None where none ships."""
    from .concepts.build import METRICS

    entry = catalog.BUNDLED_DICTIONARIES.get(f"{model.split('@')[0]}-training")
    report = None if entry is None else entry.path / METRICS
    if report is None or not report.is_file():
        return None
    return json.loads(report.read_text()).get("births")


def births_figure(births: dict[str, dict]) -> np.ndarray:
    """How many concepts of each model's dictionary across its run exist at each point of training (born at or
    before it), against epochs."""
    from matplotlib.figure import Figure


    fig = Figure(figsize=(6.4, 2.8), dpi=100)
    ax = fig.add_subplot()
    for k, (model, born) in enumerate(births.items()):
        epochs = {c.step: c.epoch for c in bundled_run(model) or []}
        xs = [epochs.get(step, np.nan) for step in born["steps"]]
        ax.plot(xs, born["existing"], "o-", color=f"C{k}", ms=3,
                label=f"{model}: {born['existing'][-1]} of {len(born['born_at'])} concepts at the end")
    return _finished(fig, ax, y="concepts that exist",
                     title="when concepts are born: one dictionary across each run's checkpoints")
