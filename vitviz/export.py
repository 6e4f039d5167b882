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
`export_images` is `python -m vitviz explain`'s pipeline over many images: batched, sharded under torchrun, resumable.
"""
from __future__ import annotations

import json
import os
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from . import __version__
from .distributed import Ranks
from .explain import METHODS, direct_logit_attribution, method as find_method, token_effect_maps
from .files import drawing_threads, npy_bytes, png_bytes, safe_name, write_atomic
from .image import ImageError, read_image
from .session import ModelRun, decode_side, explain_images, faithfulness_curves
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


def image_ids(paths: list[Path]) -> list[str]:
    """One folder name per image: its file stem, made unique."""
    ids, seen = [], {}
    for path in paths:
        base = safe_name(path.stem)
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


def complete(out: Path, entry: dict | None, models: list[str], methods: list[str], formats: list[str],
             decide: bool = False, concepts: dict[str, str] | None = None) -> bool:
    """Whether a previous run's manifest entry already holds every requested output, on disk. `concepts`: the
    dictionary each model's codes are asked of (model name -> its source), where --concepts is given."""
    if not entry:
        return False
    done = {m["model"]: m for m in entry.get("models", [])}
    for name in models:
        model = done.get(name)
        if model is None or set(methods) - set(model.get("maps", {})):
            return False
        if {f"{m}.{ext}" for m in methods for ext in formats} - set(model.get("files", [])):
            return False
        if decide and "decide" not in model:
            return False
        if name in (concepts or {}) and (model.get("concepts") or {}).get("dictionary") != concepts[name]:
            return False
        folder = out / entry["id"] / safe_name(name)
        if not all((folder / f).is_file() for f in model.get("files", [])):
            return False
    return True


def previous_entries(out: Path) -> dict[str, dict]:
    """The image entries of earlier runs' manifests (merged, and each rank's own), by image path."""
    entries = {}
    for path in sorted(out.glob("manifest*.json")):
        entries.update({e["path"]: e for e in json.loads(path.read_text()).get("images", [])})
    return entries


def export_images(paths: Sequence[Path], models: Sequence, out: Path, *, ranks: Ranks, methods: Sequence[str],
                  formats: Sequence[str] = FORMATS, head_fusion: str = "mean", discard_ratio: float = 0.0,
                  batch_size: int = 8, faithfulness_steps: int = 0, decide: bool = False,
                  concepts: Sequence | None = None, resume: bool = False) -> tuple[list[dict], list[dict]] | None:
    """What `python -m vitviz explain` does: the images at `paths` through the loaded `models` in batches of
    `batch_size`, each image's files for every model written to OUT/<image>/<model>/ (`export_image`, on threads,
    while the next batch's forwards run) and the manifest rewritten after each batch, so an interrupted run keeps
    what it finished; `resume` skips the images an earlier run's manifest holds complete. Images that do not
    decode are skipped and listed. `concepts`: each model's `concepts.analysis.photo.Reader` or None.
    Sharded by image under torchrun (`ranks`): whole batches dealt to the ranks, each rank writing its images'
    folders and its own manifest (manifest-rank<r>.json), rank 0 the merged manifest.json.
    -> the manifest's image entries and skipped images, in the order of `paths`; None on a rank other than 0."""
    methods = list(dict.fromkeys(methods))
    formats = list(dict.fromkeys(formats))
    params = {"head_fusion": head_fusion, "discard_ratio": discard_ratio}
    names = [m.name for m in models]
    concept_sources = {name: reader.source for name, reader in zip(names, concepts or []) if reader}
    done = previous_entries(out) if resume else {}
    items = list(zip(paths, image_ids(paths)))
    chunks = ranks.mine([items[i:i + batch_size] for i in range(0, len(items), batch_size)])
    entries, skipped, todo = [], [], []
    for chunk in chunks:
        finished = [(p, i) for p, i in chunk if complete(out, done.get(str(p)), names, methods, formats,
                                                            decide, concept_sources)]
        entries += [done[str(p)] for p, _ in finished]
        todo.append([item for item in chunk if item not in finished])
    if resume:
        print(f"resume{f' (rank {ranks.rank})' if ranks.world > 1 else ''}: {len(entries)} image(s) already "
              f"complete, {sum(map(len, todo))} to do", file=sys.stderr)
    own_manifest = out / (MANIFEST if ranks.world == 1 else f"manifest-rank{ranks.rank}.json")

    def save_manifest(path: Path, images: list[dict], skips: list[dict]) -> None:
        write_manifest(path.parent, manifest(models=models, methods=methods, params=params, images=images,
                                             skipped=skips, faithfulness_steps=faithfulness_steps),
                       name=path.name)

    target = decode_side(models)
    bar = tqdm(total=sum(map(len, todo)), unit="image", desc="explain", file=sys.stderr, disable=not ranks.leader)
    start = time.time()
    pending = []   # the previous batch's exports: collected once the next batch's forwards are done

    def collect(exports) -> None:
        for export in exports:
            entries.append(export.result())
            bar.update(1)
            bar.set_postfix(img_s=f"{bar.n / (time.time() - start):.2f}")
        if exports:
            save_manifest(own_manifest, entries, skipped)

    # drawing and encoding release the GIL for most of their time: one image (all its models) per thread, and
    # numpy's BLAS on one thread inside them (`files.drawing_threads`)
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool, drawing_threads():
        for chunk in todo:
            batch = []
            for path, image_id in chunk:
                try:
                    batch.append((path, image_id, read_image(path, target_size=target)))
                except ImageError as e:
                    skipped.append({"path": str(path), "reason": str(e)})
                    bar.update(1)
            if not batch:
                continue
            images, preprocessed = [image for _, _, image in batch], {}
            runs_per_model = [explain_images(images, loaded, batch_size=batch_size, preprocessed=preprocessed)
                              for loaded in models]
            for runs in runs_per_model:   # the batch's curves in batched forwards, kept in the runs for export
                classified = [run for run in runs if run.has_classifier]
                for method in methods if faithfulness_steps and classified else ():
                    faithfulness_curves(classified, method, steps=faithfulness_steps)
            collect(pending)
            pending = [pool.submit(export_image, out, image_id, path, image, [runs[k] for runs in runs_per_model],
                                   methods, formats=formats, faithfulness_steps=faithfulness_steps,
                                   params=params, decide=decide, concepts=concepts)
                       for k, (path, image_id, image) in enumerate(batch)]
        collect(pending)
    bar.close()
    save_manifest(own_manifest, entries, skipped)
    gathered = ranks.gather(json.dumps({"images": entries, "skipped": skipped}))
    if not ranks.leader:
        return None
    parts = [json.loads(text) for text in gathered]
    order = {str(path): k for k, (path, _) in enumerate(items)}
    entries = sorted((e for part in parts for e in part["images"]), key=lambda e: order[e["path"]])
    skipped = sorted((s for part in parts for s in part["skipped"]), key=lambda s: order[s["path"]])
    save_manifest(out / MANIFEST, entries, skipped)
    return entries, skipped
