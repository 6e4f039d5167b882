"""The one exporter: every panel as PNG, every map as .npy, and a manifest.json, for the CLI's output
folder and the app's download zip alike (same files, same names).

    <out>/manifest.json                                       (under torchrun also manifest-rank<r>.json)
    <out>/<image>/<model>/predictions.json
    <out>/<image>/<model>/<method>.npy and <method>.png      (each of explain.METHODS asked for)
    <out>/<image>/<model>/grid-<k>.png                        (patch grid, or CvT stage k's tokens)
    <out>/<image>/<model>/stage-<k>-pca.png, stage-<k>-norm.png
    <out>/<image>/<model>/decide.json, decide-token-effects.npy   (with decide=True: direct logit attribution)

`formats` picks what is written per map: the .npy arrays, the drawn PNGs (with the grids and stage
views), or both.

Each file is written under a temporary name and renamed, so an interrupted run never leaves half a file.
"""
from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from . import __version__
from .explain import METHODS, direct_logit_attribution, method as find_method, token_effect_maps
from .files import npy_bytes, png_bytes, safe_name, write_atomic
from .session import ModelRun
from .views import grid_views, map_view, stage_views

MANIFEST = "manifest.json"
FORMATS = ("png", "npy")   # what is written per map: the drawn overlay (and every other view), the array
PREDICTIONS = "predictions.json"
DECIDE = "decide.json"                           # direct logit attribution of the top class, layer by layer and head
CONCEPTS = "concepts.npy"                         # cells n: a dictionary's codes of the photo (`--concepts`)
TOKEN_EFFECTS = "decide-token-effects.npy"       # L H gh gw: each head's token effects on its query grid


def image_files(run: ModelRun, methods: Sequence[str], *, formats: Sequence[str] = FORMATS, faithfulness_steps: int = 0,
                decide: bool = False, decided: Decided | None = None, concepts=None,
                **params) -> tuple[dict[str, bytes], dict]:
    """Every file for one image + model, as bytes, and that model's entry for the manifest; without 'png'
    in `formats` nothing is drawn (no overlays, grids or stage views), without 'npy' no arrays; `decide`:
    the direct logit attribution of the top class too (a model without a classifier has none), `decided`
    if computed elsewhere (the app's runs hold no weights), else computed here. `concepts`: a
    `concepts.analysis.photo.Reader` for this model, whose codes of the photo go to concepts.npy (cells n, always:
    they are the reading itself) and its most active concepts to the manifest."""
    for method in methods:
        find_method(method)   # a ValueError naming the methods there are
    if set(formats) - set(FORMATS) or not formats:
        raise ValueError(f"formats must be some of {', '.join(FORMATS)}, not {list(formats)}")
    files: dict[str, bytes] = {}
    top = [{"index": p.index, "label": p.label, "prob": round(p.prob, 6)} for p in run.top(5)]
    # a model without a classifier predicts nothing: no top 5, no target class, and the targeted maps explain
    # its pooled output (the manifest says which), with no faithfulness curves (they follow a class)
    predictions = {"model": run.name, "top5": top} if run.has_classifier else \
        {"model": run.name, "top5": [], "no_predictions": run.no_classifier}
    entry = {**predictions, "target": top[0]["index"] if top else None, "maps": {}, "faithfulness": {}}
    files[PREDICTIONS] = (json.dumps(predictions, indent=2) + "\n").encode()
    for method in methods:
        if not run.applies(method):   # a method that reads attention, for a CNN: said, not drawn
            entry["maps"][method] = {"skipped": run.no_attention(find_method(method).title)}
            continue
        values = run.token_map(method, **params)
        entry["maps"][method] = {"shape": list(values.shape)}
        if "npy" in formats:
            files[f"{method}.npy"] = npy_bytes(values)
            entry["maps"][method]["file"] = f"{method}.npy"
        if "png" in formats:
            files[f"{method}.png"] = png_bytes(map_view(run, method, values=values))
        if not run.has_classifier and find_method(method).targeted:
            entry["maps"][method]["explains"] = run.explained_target(method)
        if faithfulness_steps and run.has_classifier:
            curves = run.faithfulness(method, steps=faithfulness_steps)
            entry["faithfulness"][method] = {k: round(v["auc"], 6) for k, v in curves.items() if isinstance(v, dict)}
    if decide:
        entry["decide"] = decide_files(run, files, formats=formats, decided=decided)
    if concepts is not None:
        entry["concepts"] = concept_files(concepts.read(run), files, source=concepts.source)
    if "png" in formats:
        for k, view in enumerate(grid_views(run)):
            files[f"grid-{k + 1}.png"] = png_bytes(view)
        views = stage_views(run)
        for k in range(len(views) // 2):
            files[f"stage-{k + 1}-pca.png"] = png_bytes(views[2 * k])
            files[f"stage-{k + 1}-norm.png"] = png_bytes(views[2 * k + 1])
    entry["files"] = sorted(files)
    return files, entry


def concept_files(reading, files: dict[str, bytes], *, source: str) -> dict:
    """A photo's concepts (`concepts.analysis.photo.PhotoConcepts`) into `files` (concepts.npy); their manifest
    entry."""
    files[CONCEPTS] = npy_bytes(reading.codes)
    return {"dictionary": source, "block": reading.block, "grid": list(reading.grid), "file": CONCEPTS,
            "concepts": int(reading.codes.shape[1]),
            "top": [{"concept": int(c), "activation": round(float(a), 6), "fires_on": round(float(f), 6)}
                    for c, a, f in zip(reading.top, reading.activation, reading.frequency)]}


@dataclass(frozen=True)
class Decided:
    """One image's direct logit attribution of its top class, as plain data (it crosses from the app's GPU
    functions): the table decide.json holds (`Attribution.table`) and each head's token effects on its
    query grid (L H gh gw float32, `token_effect_maps`)."""
    table: dict
    token_effects: np.ndarray


def decide_reading(model, pixels, labels: Sequence[str]) -> Decided:
    """The direct logit attribution of the top class of one image (1 3 h w `pixels`)."""
    with torch.no_grad():
        trace = model.trace(pixels, decompose=True)
    attribution = direct_logit_attribution(model, trace)
    return Decided(attribution.table(0, labels), token_effect_maps(attribution, trace)[0].float().cpu().numpy())


def decide_files(run: ModelRun, files: dict[str, bytes], *, formats: Sequence[str],
                 decided: Decided | None = None) -> dict:
    """decide.json (and the token-effect maps as .npy) into `files`; the manifest's note of them."""
    if not run.has_classifier:
        return {"skipped": run.no_classifier}
    decided = decided or decide_reading(run.loaded.model, run.pixels, run.loaded.labels)
    files[DECIDE] = (json.dumps(decided.table, indent=2) + "\n").encode()
    note = {"file": DECIDE}
    if "npy" in formats:
        files[TOKEN_EFFECTS] = npy_bytes(decided.token_effects)
        note["token_effects"] = {"file": TOKEN_EFFECTS, "shape": list(decided.token_effects.shape),
                                 "layers": [row["layer"] for row in decided.table["layers"]]}
    return note


def export_image(out: Path, image_id: str, path: Path, image, runs: list, methods: list[str], *, formats: list[str],
                 faithfulness_steps: int, params: dict, decide: bool = False,
                 decided: Sequence[Decided | None] | None = None, concepts: Sequence | None = None) -> dict:
    """One image's files for every model, written to OUT/<image>/<model>/; its manifest entry (the CLI's
    output folder, and the folder the app zips). `decided`: each run's attribution if computed elsewhere;
    `concepts`: each run's `concepts.analysis.photo.Reader` or None."""
    entry = {"id": image_id, "path": str(path), "size": [image.height, image.width], "models": []}
    for run, reading, reader in zip(runs, decided or [None] * len(runs), concepts or [None] * len(runs)):
        files, model_entry = image_files(run, methods, formats=formats, faithfulness_steps=faithfulness_steps,
                                         decide=decide, decided=reading, concepts=reader, **params)
        folder = out / image_id / safe_name(run.name)
        for name, data in files.items():
            write_atomic(folder / name, data)
        entry["models"].append(model_entry)
    return entry


def model_entry(loaded) -> dict:
    """What the manifest records of a model: where it came from, exactly, and how it preprocesses."""
    return {"name": loaded.name, "family": loaded.family, "source": loaded.source_info(),
            "preprocess": loaded.transform.to_dict(), "classes": len(loaded.labels),
            "classifier": loaded.has_classifier}


def manifest(*, models: Iterable, methods: Sequence[str], params: dict, images: list[dict], skipped: list[dict],
             faithfulness_steps: int) -> dict:
    """manifest.json's content: the vitviz version and time, each model's provenance and preprocessing,
    the methods with their knobs, and the images written and skipped."""
    return {"vitviz_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "models": [model_entry(m) for m in models],
            "methods": {m: {"name": METHODS[m].title, **params} for m in methods},
            "faithfulness_steps": faithfulness_steps, "images": images, "skipped": skipped}


def write_manifest(out: Path, data: dict, *, name: str = MANIFEST) -> None:
    """The manifest written into `out` as indented JSON, whole or not at all."""
    write_atomic(Path(out) / name, (json.dumps(data, indent=2) + "\n").encode())


def zip_folder(folder: Path, zip_path: Path) -> Path:
    """The exported folder as one zip (the app's download), paths relative to the folder: PNGs stored as they
    are (deflated already: deflating them again costs time for a few bytes), everything else deflated."""
    tmp = zip_path.with_name(f".{zip_path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder).as_posix(),
                              compress_type=zipfile.ZIP_STORED if path.suffix == ".png" else zipfile.ZIP_DEFLATED)
    os.replace(tmp, zip_path)
    return zip_path
