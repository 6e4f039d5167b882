"""What `python -m vitviz concepts train` does: a data set through each model into the activation cache, the
models' grids aligned where there are two or more, one dictionary trained on them, written to a folder.

    python -m vitviz concepts train --models vit-cifar10 --block -1 --data cifar10 --kind topk --k 32 \\
        --expansion 8 --out DIR
    python -m vitviz concepts train --models vit-cifar10 cvt-cifar10 ... --out DIR   # one dictionary across both

One model: its tokens of `tokens` kind (`activations/cache.py`), every token of every image a training row, one
dictionary (`train/single.py`) in `DIR/concepts.safetensors`. Two or more: each model's grid tokens resampled onto
the cells every model shares (`activations/align.py`), row r of each model being the same cell of the same image, and a
dictionary across them (`train/across.py`) in `DIR`. Training checkpoints to `DIR/training.ckpt` and resumes from
it; the cache lives under `cache` (default `runs/activations`) and is read again by the next training of the
same layers. Under torchrun the shards of the cache are shared out by rank and training is data-parallel.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..data import Dataset
from ..distributed import Ranks
from ..files import write_atomic
from .activations.align import Alignment, align, in_photo
from .activations.batches import Activations, token_count
from .activations.cache import Cached, cache_activations, cache_blocks
from .activations.stream import BUFFER, ShardStream
from .files.own import FILE, save
from .kinds.dictionary import ConceptsError
from .train.single import BATCH_SIZE, default_steps, default_warmup, train

CHECKPOINT = "training.ckpt"
SUMMARY = "training.json"
METRICS = "metrics.json"   # what `concepts evaluate` writes beside a dictionary, its held-out FVU among them
DEFAULT_CACHE = Path("runs") / "activations"
IN_MEMORY = 0.25   # of the machine's memory: one model's cached layer larger than this is streamed from disk


@dataclass(frozen=True)
class Layers:
    """Each model's cached layer, and for two or more models their alignment (None for one)."""
    cached: tuple[Cached, ...]
    alignment: Alignment | None

    def rows(self) -> list[Tensor]:
        """The training rows: one model's tokens (t d), or each model's aligned cells (images·cells d_m), the rows
        of every model in the same order (the images all of them read)."""
        if self.alignment is None:
            return [self.cached[0].tokens()]
        grids = [cached.grids() for cached in self.cached]
        common = set.intersection(*(set(images.tolist()) for _, images, _ in grids))
        rows = []
        for m, (tokens, images, _) in enumerate(grids):
            keep = torch.tensor([int(i) in common for i in images])
            cells = self.alignment.resample(m, tokens[keep][:, self.cached[m].layer["prefix"]:])
            rows.append(cells.reshape(-1, cells.shape[-1]))
        return rows


def alignment_of(loaded: Sequence, cached: Sequence[Cached], image_size: tuple[int, int]) -> Alignment:
    """The cells the models' grid tokens share for photos of `image_size` (h, w)."""
    rectangles = [in_photo(torch.tensor(c.layer["rectangles"], dtype=torch.float64), m.transform, image_size)
                  for m, c in zip(loaded, cached)]
    return align(rectangles)


def cache_layers(loaded: Sequence, data: Dataset, *, blocks: Sequence[int], tokens: str | None, root: str | Path,
                 indices: Sequence[int] | None, ranks: Ranks | None = None, progress: bool = True) -> Layers:
    """Each model's layer cached (made where it is not yet), aligned across the models where there are several.
    Aligning needs one photo size: the data's images must all have the size of its first."""
    if len(loaded) > 1 and tokens not in (None, "patch", "position"):
        raise ConceptsError(f"A dictionary across models reads grid tokens, which have places on the photo to align; "
                            f"{tokens!r} tokens have none.")
    cached = tuple(cache_activations(m, data, block=block, tokens=tokens, root=root, indices=indices, ranks=ranks,
                                     progress=progress) for m, block in zip(loaded, blocks))
    if len(loaded) == 1:
        return Layers(cached, None)
    _, _, sizes = cached[0].grids()
    if len(sizes) and not (sizes == sizes[0]).all():
        raise ConceptsError("A dictionary across models aligns the models' grids on the photo, and this data set's "
                            "images differ in size; resize them to one size first (or train one model at a time).")
    return Layers(cached, alignment_of(loaded, cached, tuple(int(v) for v in sizes[0])))


def block_dictionaries(loaded, data: Dataset, *, blocks: Sequence[int], tokens: Sequence[str | None],
                       root: str | Path, indices: Sequence[int] | None, out: str | Path, ranks: Ranks | None = None,
                       progress: bool = True, **settings) -> dict[Path, object]:
    """One dictionary for each of several blocks of one model (`tokens[i]` read at `blocks[i]`), every layer cached
    from one pass over the data (`cache_blocks`), each trained with `settings` (`train_layers`' keywords) into
    `out/block<N>` (N counted from 0): the dictionaries at several depths a circuit reads. -> {folder: dictionary}."""
    cached = cache_blocks(loaded, data, blocks=blocks, tokens=tokens, root=root, indices=indices, ranks=ranks,
                          progress=progress)
    on = {} if ranks is None else {"leader": ranks.leader, "device": ranks.device}
    trained = {}
    for layer in cached:
        folder = Path(out) / f"block{layer.block}"
        trained[folder] = train_layers([loaded], Layers((layer,), None), out=folder, progress=progress, **on,
                                       **settings)
    return trained


def train_layers(loaded: Sequence, layers: Layers, *, out: str | Path, leader: bool = True, progress: bool = True,
                 epochs: int | None = None, steps: int | None = None, warmup: int | None = None,
                 buffer: int | None = None, **settings):
    """The dictionary of the cached layers (one model) or across them (several), trained with `settings` (the
    keywords of `train`), saved into `out` with a short summary by the `leader` (rank 0); returned. The schedule:
    `epochs` passes or `steps` steps, by default `default_steps` for the rows there are; the warm-up by default a
    tenth of the run (at most WARMUP steps). One model's layer is streamed from the cache (`buffer` shards
    shuffled together) when `buffer` is given or it would take more than IN_MEMORY of the memory."""
    out, progress = Path(out), progress and leader
    out.mkdir(parents=True, exist_ok=True)
    rows = training_rows(layers, buffer)
    settings.update(schedule_of(token_count(rows[0]), epochs=epochs, steps=steps, warmup=warmup,
                                batch_size=settings.get("batch_size", BATCH_SIZE)))
    origins = [{"model": m.name, "revision": m.source.commit or m.source.revision, "block": c.block,
                "tokens": c.layer["tokens"]} for m, c in zip(loaded, layers.cached)]
    if layers.alignment is None:
        (origin,) = origins
        dictionary = train(rows[0], checkpoint=out / CHECKPOINT, progress=progress, **origin, **settings)
        if leader:
            save(dictionary, out / FILE)
        record = dictionary.training_record
    else:
        from .files.across import save_across
        from .train.across import train_across

        dictionary = train_across(rows, models=[o["model"] for o in origins],
                                  revisions=[o["revision"] for o in origins], blocks=[o["block"] for o in origins],
                                  tokens=[o["tokens"] for o in origins], checkpoint=out / CHECKPOINT,
                                  progress=progress, **settings)
        dictionary.training_record = {**dictionary.training_record, "cells": list(layers.alignment.grid)}
        if leader:
            save_across(dictionary, out)
        record = dictionary.training_record
    summary = {"models": origins, "tokens_trained_on": [token_count(r) for r in rows], "training": record,
               "grid": list(layers.alignment.grid) if layers.alignment else layers.cached[0].layer["grid"],
               "data": layers.cached[0].layer["data"], "skipped_images": layers.cached[0].skipped}
    if leader:
        write_atomic(out / SUMMARY, json.dumps(summary, indent=1).encode())
    return dictionary


def training_rows(layers: Layers, buffer: int | None) -> list[Activations]:
    """What training reads: one model's tokens in memory, or streamed from the cache (`activations/stream.py`)
    when `buffer` is given or they would take more than IN_MEMORY of this machine's memory; several models'
    aligned rows in memory (a dictionary across models does not stream: a layer that large is refused, in
    words)."""
    bytes_of = [len(c.shards) and sum(shard.stat().st_size for shard in c.shards) for c in layers.cached]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    too_large = sum(bytes_of) > IN_MEMORY * memory
    if layers.alignment is None and (buffer is not None or too_large):
        return [ShardStream(layers.cached[0], buffer=BUFFER if buffer is None else buffer)]
    if buffer is not None:
        raise ConceptsError("A dictionary across models trains on the models' aligned rows in memory; the shuffle "
                            "buffer streams one model's layer.")
    if too_large:
        raise ConceptsError(f"The models' cached layers take {sum(bytes_of) / 2**30:.1f} GiB, more than "
                            f"{IN_MEMORY:.0%} of this machine's {memory / 2**30:.0f} GiB, and a dictionary across "
                            f"models trains in memory: train on fewer images (--limit).")
    return layers.rows()


def schedule_of(rows: int, *, epochs: int | None, steps: int | None, warmup: int | None, batch_size: int) -> dict:
    """The schedule keywords of `train` for `rows` training rows: as given, with the command line's defaults for
    what is not (`default_steps`, `default_warmup`)."""
    if epochs is not None and steps is not None:
        raise ConceptsError(f"Give epochs ({epochs}) or steps ({steps}), not both: steps count the whole run.")
    if epochs is None and steps is None:
        steps = default_steps(rows, batch_size)
    total = steps if steps is not None else epochs * math.ceil(rows / batch_size)
    return {**({"steps": steps} if steps is not None else {"epochs": epochs}),
            "warmup": default_warmup(total) if warmup is None else warmup}


def exemplar_indexes(loaded: Sequence, dictionary, data: Dataset, *, folder: str | Path, root: str | Path,
                     indices: Sequence[int] | None, top: int, quality: int, ranks: Ranks | None = None,
                     thumbnails: str | Path | None = None, progress: bool = True) -> list[Path]:
    """The exemplar index of a dictionary (one model) or of each model of a dictionary across models (on the
    cells they share), over the images `indices` of `data`, written into the dictionary's `folder` (their
    thumbnails into the store `thumbnails` where it is given); -> the files. The layers are read through the
    cache like training's (its blocks and tokens from the dictionary)."""
    from .analysis.exemplars import exemplars_of, file_name, save_exemplars
    from .kinds.across import Across

    per_model = dictionary.dictionaries if isinstance(dictionary, Across) else {dictionary.model: dictionary}
    by_name = {m.name: m for m in loaded}
    missing = [name for name in per_model if name not in by_name]
    if missing:
        raise ConceptsError(f"The dictionary was trained on {', '.join(map(str, per_model))}; load "
                            f"{', '.join(map(str, missing))} too to index its exemplars.")
    models = [by_name[name] for name in per_model]
    tokens = None if isinstance(dictionary, Across) else dictionary.origin.tokens   # across: each model's grid
    layers = cache_layers(models, data, blocks=[d.block for d in per_model.values()], tokens=tokens, root=root,
                          indices=indices, ranks=ranks, progress=progress)
    written = []
    for position, (model, own_dictionary) in enumerate(per_model.items()):
        across = isinstance(dictionary, Across)
        exemplars = exemplars_of(own_dictionary, layers.cached[position], data, top=top, quality=quality,
                                 alignment=layers.alignment, model_index=position if across else None)
        if ranks is None or ranks.leader:
            written.append(save_exemplars(exemplars, Path(folder) / file_name(position if across else None, model),
                                          thumbnails=thumbnails))
    return written


def evaluate_dictionary(loaded: Sequence, dictionary, data: Dataset, *, root: str | Path,
                        indices: Sequence[int] | None, progress: bool = True) -> tuple[dict, dict]:
    """What `concepts evaluate` reports of a dictionary over the images `indices` of `data` (a held-out split):
    one model's FVU, L0, dead and dense shares (`analysis/metrics.py`) and its spliced-in agreement, KL and accuracies
    (`analysis/splice.py`, or in words why its block cannot be spliced); across models, the R² matrix, each concept's
    firing entropy and the shares of shared and model-specific concepts (`analysis.across.across_metrics`), and where
    the models are checkpoints of one training run (`<model>@<step>`), when each concept was born
    (`analysis.birth`). With it,
    each read row's mean code and error (`analysis/means.py`, a circuit's "mean" baseline): {file name: Means}."""
    from .analysis.across import across_metrics
    from .analysis.birth import births, run_steps
    from .analysis.means import file_name, row_means
    from .analysis.metrics import metrics
    from .analysis.splice import spliced_metrics
    from .kinds.across import Across

    per_model = dictionary.dictionaries if isinstance(dictionary, Across) else {dictionary.model: dictionary}
    by_name = {m.name: m for m in loaded}
    models = [by_name[name] for name in per_model]
    across = isinstance(dictionary, Across)
    layers = cache_layers(models, data, blocks=[d.block for d in per_model.values()],
                          tokens=None if across else dictionary.origin.tokens, root=root, indices=indices,
                          progress=progress)
    rows = layers.rows()
    report = {"data": layers.cached[0].layer["data"], "skipped_images": layers.cached[0].skipped}
    if across:
        cells = math.prod(layers.alignment.grid)
        means = {file_name(model): row_means(part, [rows[m].reshape(-1, cells, rows[m].shape[-1])])
                 for m, (model, part) in enumerate(per_model.items())}
        report = {**report, "cells": list(layers.alignment.grid), **across_metrics(dictionary, rows).to_dict()}
        steps = run_steps(dictionary.models)
        if steps is not None:
            report["births"] = births(dictionary, rows, steps)
        return report, means
    means = {file_name(): row_means(dictionary, (tokens for tokens, _, _ in layers.cached[0].shard_grids()))}
    report.update(metrics(dictionary, rows[0]).to_dict())
    try:
        report["spliced"] = spliced_metrics(models[0], data, dictionary, indices=indices,
                                            progress=progress).to_dict()
    except ConceptsError as e:
        report["spliced"] = {"not_spliced": str(e)}
    return report, means
