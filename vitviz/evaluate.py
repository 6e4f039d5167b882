"""Which map can you trust? Faithfulness of every explanation method over a whole data set.

    python -m vitviz evaluate --models vit-cifar10 cvt-cifar10 --data cifar10 --limit 1000 --out eval/
    torchrun --nproc_per_node=2 -m vitviz evaluate ...      (the same results, the images split over the ranks)

For every image, model and method of `explain.METHODS` (and a random map: uniform noise on the token
grid, seeded by the image's index, the baseline every method must beat), five perturbation tests from
`explain.faithfulness` (which derives each), all on the map of the model's top prediction:

| test | removes | baseline | score per step | number per image |
|---|---|---|---|---|
| positive (Chefer et al. 2021) | the most relevant 0, 10 .. 90 % of the pixels | black | 1 if the model still predicts the reference class | AUC over 0 .. 0.9, lower is better |
| negative (Chefer et al. 2021) | the least relevant first | black | as above | AUC, higher is better |
| deletion (Petsiuk et al. 2018) | the most relevant tokens, in `steps` steps | the normalisation mean (0) | target-class probability | AUC over 0 .. 1, lower is better |
| insertion (Petsiuk et al. 2018) | puts the most relevant tokens back on a blurred image | Gaussian blur | target-class probability | AUC, higher is better |
| region (Samek et al. 2017) | one token cell more per step, most relevant first, up to `regions` cells | the image's minimum | target-class probability | AOPC, higher is better |

The reference class of the perturbation test is the true label when the data has labels that name
the model's classes (as in Chefer et al.'s script, which compares with the ImageNet label), else the
model's unperturbed prediction; the summary says which (`score_against`). Where vitviz departs from
their `pertubation_eval_from_hdf5.py`, and why: black is 0 of the [0, 1] image normalised with the
model's own mean and std (theirs is ViT-B's 0.5 / 0.5); the map is upsampled bilinearly to the input
size, not by a factor of 16 (the same for a ViT/16; right for any patch size and for CvT's grids);
their min-max scaling of the maps is left out (it changes no ranking); and pixels of equal relevance
go in reading order, where `torch.topk` leaves their order to the implementation. AOPC (Samek et al., eq. 12)
is the mean drop of the target probability over the steps, 0 included: p_0 - mean_k p_k.

CLIP models (`LoadedModel.takes_prompts`) are classifiers once they have prompts: `prompts`, a template
such as "a photo of a {}", is filled with the data set's class names (CIFAR-10's for the shared data),
so the model's classes are the data's and the tests score against the true labels; each method runs
with its authors' CLIP settings (`Method.params_for`: LeGrad's last two blocks, Chefer's last block).

Per (model, method, test) the summary holds the mean over images with a 95 % percentile-bootstrap
interval, and the paired difference to the random map (method minus random on the same images) with
its interval: a method whose difference interval holds 0 is "not distinguishable from random" on that
test. The bootstrap draws `resamples` multinomial resamples of the images from a fixed seed, the same
resamples for every number, so a summary is a pure function of the records.

Fast: the maps of a batch of images come from batched passes (one traced forward serves the methods
of the trace alone; each gradient method takes its own batched forward and backward); then every
perturbation step of every map of every image of the batch goes through the model in
`forward_batch`-image forwards (`faithfulness.score`), the perturbed images built only when their
forward is due. Nothing is drawn until the end (the plot of the mean curves).

Exact under sharding: the image list is cut into chunks of `batch_size` images and chunk k goes to
rank k % world_size (`vitviz.distributed`); every chunk is computed the same way whichever process
runs it, so the merged records of N ranks equal one process's bit for bit, given the same threads
per process (CPU matrix products round differently with another thread count; torchrun gives each
process one thread unless OMP_NUM_THREADS says otherwise). Each rank appends one JSON line per image
to its own `records-rank<r>.jsonl` after every chunk; `--resume` skips the images whose lines (from
any rank's file, for the same run settings) are complete. Rank 0 gathers every rank's lines, writes
the merged `records.jsonl`, `summary.json`, `summary.md` and per model `<model>/summary.json` (the file
shipped next to a checkpoint: `SUMMARY`) and `<model>/curves.png`.
"""  # noqa: E501 (the table's rows cannot wrap)
from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import __version__, hub
from .data import DataError, Dataset, class_positions, open_data, spread
from .distributed import ranks as process_ranks
from .explain import METHODS, faithfulness, method as find_method
from .files import write_atomic
from .image import ImageError
from .leaderboard import RANDOM, markdown, write_summary

RECORDS = "records.jsonl"     # every image's curves, merged, by image index


@dataclass(frozen=True)
class Test:
    """One faithfulness test: its name, the title figures give it, the number per image (AUC or AOPC),
    which way is better and what its curve plots."""
    name: str
    title: str
    value: str       # the number per image: 'AUC' or 'AOPC'
    better: str      # 'lower' or 'higher'
    score: str       # what the curve plots


TESTS = {t.name: t for t in [
    Test("positive", "positive perturbation (Chefer et al.)", "AUC", "lower", "still predicts the reference class"),
    Test("negative", "negative perturbation (Chefer et al.)", "AUC", "higher", "still predicts the reference class"),
    Test("deletion", "deletion (Petsiuk et al.)", "AUC", "lower", "target-class probability"),
    Test("insertion", "insertion (Petsiuk et al.)", "AUC", "higher", "target-class probability"),
    Test("region", "region perturbation (Samek et al.)", "AOPC", "higher", "target-class probability"),
]}


# perturbed images per forward when not given: a CPU runs a ViT fastest per image in small batches
# (ViT-Ti/16 at 224 px on 2 busy cores: +3 % per image at 16, +20 % at 64, +40 % at 256 compared with 8;
# the bundled 32 px pair: the same from 8 to 32), a GPU in large ones
FORWARD_BATCH = {"cpu": 8, "cuda": 256}


@dataclass(frozen=True)
class Settings:
    """How an evaluation runs: images per chunk, perturbed images per forward, steps, regions and the
    bootstrap; a value below 1 is refused."""
    batch_size: int = 32        # images per chunk: the unit of batching, sharding and resuming
    forward_batch: int | None = None   # perturbed images per forward (None: FORWARD_BATCH for the device)
    steps: int = 16             # deletion / insertion steps
    regions: int = 100          # region perturbation: at most this many cells (Quantus's regions_evaluation)
    resamples: int = 1000       # bootstrap resamples
    seed: int = 0               # of the bootstrap

    def __post_init__(self):
        for name in ("batch_size", "forward_batch", "steps", "regions", "resamples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")

    def on(self, device: torch.device) -> "Settings":
        """These settings with the forward batch decided for the device, where none was given."""
        if self.forward_batch is not None:
            return self
        return replace(self, forward_batch=FORWARD_BATCH.get(device.type, FORWARD_BATCH["cpu"]))


@dataclass
class Work:
    """What the tests cost: images evaluated, images sent through the models, in how many batched
    forwards (the maps' own passes not counted), and the wall time."""
    images: int = 0
    forwarded: int = 0
    forwards: int = 0
    seconds: float = 0.0

    def add(self, other: "Work") -> None:
        for name in ("images", "forwarded", "forwards", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


# ---- one batch of images, one model -------------------------------------------------------------------

def method_maps(model: torch.nn.Module, pixels: torch.Tensor, target: torch.Tensor,
                methods: Sequence[str], *, clip: bool = False) -> dict[str, torch.Tensor]:
    """Each method's b gh gw maps of `target` (`clip`: with its authors' CLIP settings); the methods of the
    trace alone share one traced forward."""
    maps, trace = {}, None
    for name in methods:
        m = find_method(name)
        if m.targeted:
            maps[name] = m.maps(model, pixels, target, **m.params_for(clip))
        else:
            if trace is None:
                with torch.inference_mode():
                    trace = model.trace(pixels)
            maps[name] = m.from_trace(trace)
        maps[name] = maps[name].detach().float()
    grids = {name: tuple(m.shape) for name, m in maps.items()}
    if len(set(grids.values())) > 1:
        raise ValueError(f"the methods' maps are not on one token grid: {grids}")
    return maps


def headline(test: str, fractions: Sequence[float], scores: Sequence[float]) -> float:
    """A curve's number: the AUC (trapezoid over the fractions), or for region perturbation the AOPC."""
    s = np.asarray(scores, dtype=np.float64)
    if test == "region":
        return float(s[0] - s.mean())
    return float(np.trapezoid(s, np.asarray(fractions, dtype=np.float64)))


def evaluate_batch(loaded, pixels: torch.Tensor, *, indices: Sequence[int], labels: torch.Tensor | None,
                   methods: Sequence[str], settings: Settings) -> tuple[list[dict], Work]:
    """Every test of every method's map (and the random map) on b images for one model: (per image
    that model's record, with each test's curve, its x values and its number; the forwards it took)."""
    model, settings = loaded.model, settings.on(pixels.device)
    with torch.inference_mode():
        logits = model(pixels).float()
    probs = logits.softmax(dim=-1)
    prediction = logits.argmax(dim=-1)
    reference = prediction if labels is None else labels.to(prediction.device)
    maps = method_maps(model, pixels, prediction, methods, clip=loaded.takes_prompts)
    first = next(iter(maps.values()))
    one_map = first.new_empty(first.shape[1:], device="cpu")   # drawn on the host, copied to the device at once
    maps[RANDOM] = torch.stack([faithfulness.random_saliency(one_map, seed=index) for index in indices]).to(first)
    names, stacked = list(maps), torch.stack(list(maps.values()))                        # k b gh gw
    black = loaded.transform.normalize(torch.zeros(1, 3, 1, 1, device=pixels.device))
    built = {"positive": faithfulness.pixel_removal(pixels, stacked, black=black),
             "negative": faithfulness.pixel_removal(pixels, stacked, black=black, negative=True),
             "deletion": faithfulness.deletion(pixels, stacked, steps=settings.steps),
             "insertion": faithfulness.insertion(pixels, stacked, steps=settings.steps),
             "region": faithfulness.region_removal(pixels, stacked, regions=settings.regions)}
    perturbations = [p for _, p in built.values()]
    scores = dict(zip(built, faithfulness.score(model, perturbations, prediction, batch_size=settings.forward_batch)))
    fractions = {test: [round(v, 6) for v in x.tolist()] for test, (x, _) in built.items()}   # float32 0.1 -> 0.1
    # the batch's own numbers in one read (float64 holds class indices and float32 probabilities exactly)
    chosen = probs.gather(1, prediction[:, None])[:, 0]
    numbers = torch.stack([prediction.double(), reference.double(), chosen.double()])
    predictions, references, probabilities = numbers.tolist()
    host_reference = torch.tensor(references).long()   # the scores are on the host already
    curves = {test: (s.classes == host_reference[None, :, None]).int().tolist() if test in ("positive", "negative")
              else s.probs.tolist() for test, s in scores.items()}                      # test -> k b t lists
    forwarded = sum(p.images_needed for p in perturbations)
    records = []
    for i in range(len(indices)):
        records.append({
            "prediction": int(predictions[i]), "probability": probabilities[i],
            "reference": int(references[i]), "fractions": fractions,
            "maps": {name: {test: {"scores": (values := curves[test][k][i]),
                                   "value": headline(test, fractions[test], values)} for test in TESTS}
                     for k, name in enumerate(names)}})
    work = Work(forwarded=len(indices) + forwarded, forwards=1 + math.ceil(forwarded / settings.forward_batch))
    return records, work


# ---- the data set, chunk by chunk ---------------------------------------------------------------------

def run_key(*, models: Sequence[str], methods: Sequence[str], data: Dataset, limit: int | None,
            settings: Settings, prompts: str | None = None) -> str:
    """What makes two runs' records interchangeable (resume uses only lines with this key)."""
    what = {"models": list(models), "methods": list(methods), "data": data.name, "images": len(data), "limit": limit,
            "settings": {k: v for k, v in asdict(settings).items() if k not in ("resamples", "seed")},
            **({"prompts": prompts} if prompts is not None else {})}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def read_records(out: Path, key: str) -> dict[int, dict]:
    """Every complete line with this run key in OUT's record files (a line cut short by a kill is skipped)."""
    found = {}
    for path in sorted(out.glob("records*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("run") == key:
                found[record["index"]] = record
    return found


def evaluate_chunk(chunk: Sequence[int], *, data: Dataset, models: Sequence, methods: Sequence[str],
                   settings: Settings, key: str) -> tuple[list[dict], Work]:
    """The records of one chunk of image indices: every model on its readable images; skips listed."""
    records, images, work = {}, [], Work()
    side = max(max(m.transform.resize) if isinstance(m.transform.resize, tuple) else m.transform.resize for m in models)
    for index in chunk:
        record = {"run": key, "index": index, "id": data.ids[index],
                  "label": None if data.labels is None else data.labels[index]}
        try:
            images.append((index, data.image(index, target_size=side)))
            record["models"] = {}
        except ImageError as e:
            record["skipped"] = str(e)
        records[index] = record
    if images:
        indices = [index for index, _ in images]
        for loaded in models:
            pixels = torch.cat([loaded.preprocess(image) for _, image in images])
            positions = class_positions(data.classes, loaded.labels)
            labels = None if positions is None else torch.tensor([positions[data.labels[i]] for i in indices])
            entries, done = evaluate_batch(loaded, pixels, indices=indices, labels=labels, methods=methods,
                                           settings=settings)
            work.add(done)
            for index, entry in zip(indices, entries):
                records[index]["models"][loaded.name] = entry
        work.images = len(images)
    return [records[index] for index in chunk], work


def evaluate(*, models: Sequence[str], data: str | Path | Dataset, out: str | Path,
             methods: Sequence[str] | None = None, limit: int | None = None, resume: bool = False,
             settings: Settings = Settings(),
             device: str | None = None, progress: bool = True, prompts: str | None = None) -> dict | None:
    """Evaluate every method on every model over the data (see the module docstring). Under torchrun
    each rank takes its chunks; rank 0 returns the summary (the other ranks None). `prompts`: the template
    a CLIP model's prompts are made with from the data's class names, e.g. "a photo of a {}"."""
    methods = list(dict.fromkeys(methods or METHODS))
    for name in methods:
        find_method(name)
    if RANDOM in methods:
        raise ValueError(f"{RANDOM!r} is the baseline every method is compared with, not a method")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with process_ranks(device) as ranks:
        settings = settings.on(ranks.device)
        dataset = data if isinstance(data, Dataset) else open_data(data)
        loaded = [zero_shot(hub.load(name, device=ranks.device), dataset, prompts) for name in models]
        names = [m.name for m in loaded]
        key = run_key(models=names, methods=methods, data=dataset, limit=limit, settings=settings, prompts=prompts)
        indices = spread(len(dataset), limit)
        chunks = [indices[i:i + settings.batch_size] for i in range(0, len(indices), settings.batch_size)]
        done = read_records(out, key) if resume else {}
        mine = ranks.mine(chunks)
        part = out / f"records-rank{ranks.rank}.jsonl"
        if not resume:
            part.write_text("")
        lines, work = [], Work()
        finished = [all(i in done for i in chunk) for chunk in mine]
        if resume:
            print(f"resume{f' (rank {ranks.rank})' if ranks.world > 1 else ''}: "
                  f"{sum(len(c) for c, f in zip(mine, finished) if f)} image(s) already done, "
                  f"{sum(len(c) for c, f in zip(mine, finished) if not f)} to do", file=sys.stderr)
        bar = tqdm(total=sum(len(c) for c, f in zip(mine, finished) if not f), unit="image", desc="evaluate",
                   file=sys.stderr, disable=not (progress and ranks.leader))
        start = time.perf_counter()
        for chunk, finish in zip(mine, finished):
            if finish:
                lines += [json.dumps(done[i]) for i in chunk]
                continue
            records, chunk_work = evaluate_chunk(chunk, data=dataset, models=loaded, methods=methods,
                                                 settings=settings, key=key)
            work.add(chunk_work)
            text = [json.dumps(r) for r in records]
            with part.open("a") as f:   # one write per chunk: a kill leaves at most one cut line
                f.write("\n".join(text) + "\n")
            lines += text
            bar.update(len(chunk))
        bar.close()
        work.seconds = time.perf_counter() - start
        report = {"rank": ranks.rank, "lines": lines, "work": asdict(work)}
        gathered = ranks.gather(json.dumps(report))
        if not ranks.leader:
            return None
        reports = [json.loads(text) for text in gathered]
        records = sorted((json.loads(line) for r in reports for line in r["lines"]), key=lambda r: r["index"])
        write_atomic(out / RECORDS, "".join(json.dumps(r) + "\n" for r in records).encode())
        summary = summarise(records, models=loaded, methods=methods, data=dataset, limit=limit, settings=settings)
        write_summary(out, summary)
        print_work([Work(**r["work"]) for r in reports], models=len(loaded))
        print(markdown(summary))
        return summary


def zero_shot(loaded, data: Dataset, template: str | None):
    """A CLIP model as a classifier over the data's class names put in `template` (its labels the class
    names); any other model as it is."""
    if not loaded.takes_prompts:
        return loaded
    if template is None:
        raise hub.LoadError(f"{loaded.name!r} is a CLIP model: it classifies only over prompts, so give a template "
                            f"for the data's class names, e.g. --prompts \"a photo of a {{}}\".")
    if not data.classes:
        raise DataError(f"{data.name} has no class names to make {loaded.name!r}'s prompts from (a folder needs "
                        f"class sub-folders).")
    if template.count("{}") != 1:
        raise DataError(f"a prompt template has one {{}} for the class name, not {template!r}")
    return loaded.with_prompts([template.format(c) for c in data.classes], labels=data.classes)


def print_work(works: Sequence[Work], *, models: int) -> None:
    """The work done, per rank and in all: images, forwarded images, forwards and throughput."""
    total = Work()
    for rank, w in enumerate(works):
        total.add(w)
        if len(works) > 1:
            print(f"rank {rank}: {w.images} images, {w.forwarded} images through the model in {w.forwards} batched "
                  f"forwards, {w.seconds:.1f} s", file=sys.stderr)
    seconds = max((w.seconds for w in works), default=0.0) or float("nan")
    print(f"evaluated {total.images} images x {models} models: {total.forwarded} images through the model in "
          f"{total.forwards} batched forwards, {seconds:.1f} s: {total.images / seconds:.1f} images/s, "
          f"{total.forwarded / seconds:.0f} forwarded images/s", file=sys.stderr)


# ---- statistics ---------------------------------------------------------------------------------------

def bootstrap_weights(n: int, *, resamples: int, seed: int) -> np.ndarray:
    """resamples x n: how often each image is drawn in each resample, divided by n (a mean is weights @ values)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1 / n), size=resamples) / n


def interval(values: np.ndarray, weights: np.ndarray) -> dict:
    """Mean and 95 % percentile-bootstrap interval of values (n, or n t for curves)."""
    means = weights @ values
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    mean = values.mean(axis=0)
    as_list = lambda a: np.round(a, 6).tolist()
    return {"mean": as_list(mean), "low": as_list(low), "high": as_list(high)}


def verdict(test: Test, difference: dict) -> str:
    """How a method compares with the random map on one test, from the paired difference's interval."""
    if difference["low"] <= 0 <= difference["high"]:
        return "not distinguishable from random"
    better = difference["low"] > 0 if test.better == "higher" else difference["high"] < 0
    return "better than random" if better else "worse than random"


def summarise(records: Sequence[dict], *, models: Sequence, methods: Sequence[str], data: Dataset,
              limit: int | None, settings: Settings) -> dict:
    """The summary of a run's records (see the module docstring): a pure function of them."""
    skipped = [{"index": r["index"], "id": r["id"], "reason": r["skipped"]} for r in records if "skipped" in r]
    kept = [r for r in records if "skipped" not in r]
    weights = bootstrap_weights(len(kept), resamples=settings.resamples, seed=settings.seed) if kept else None
    summary = {"vitviz_version": __version__,
               "data": {"name": data.name, "images": len(kept), "skipped": skipped, "limit": limit,
                        "labels": data.labels is not None},
               "settings": asdict(settings), "methods": {m: METHODS[m].title for m in methods},
               "tests": {name: asdict(t) for name, t in TESTS.items()}, "models": {}}
    for loaded in models:
        entries = [r["models"][loaded.name] for r in kept]
        against = "label" if data.labels is not None and class_positions(data.classes, loaded.labels) else "prediction"
        model = {"source": loaded.source_info(), "score_against": against,
                 "accuracy": (round(float(np.mean([e["prediction"] == e["reference"] for e in entries])), 6)
                              if against == "label" and entries else None),
                 "fractions": entries[0]["fractions"] if entries else None, "methods": {}}
        for name in [*methods, RANDOM]:
            model["methods"][name] = {}
            for test_name, test in TESTS.items():
                if not entries:
                    continue
                values = np.array([e["maps"][name][test_name]["value"] for e in entries])
                random = np.array([e["maps"][RANDOM][test_name]["value"] for e in entries])
                curves = np.array([e["maps"][name][test_name]["scores"] for e in entries], dtype=np.float64)
                result = {**interval(values, weights), "curve": interval(curves, weights)}
                if name != RANDOM:
                    result["vs_random"] = interval(values - random, weights)
                    result["verdict"] = verdict(test, result["vs_random"])
                model["methods"][name][test_name] = result
        summary["models"][loaded.name] = model
    return summary
