"""Activations from the trace, every family: which tokens of which block a dictionary reads, and a cache of them.

A dictionary reads one block's output tokens (the residual stream after it, `BlockTrace.tokens`), as the
trace of any family gives them:

    patch        the grid tokens (a ViT's patches, a CvT stage's or Swin stage's grid)
    cls          the class token alone (a model whose block has one)
    patch+cls    both, the class token first
    position     a CNN's channel vector at each spatial position of its grid (Gorton 2024): its only kind

Registers and distillation tokens are always left out (they are not on the image). A block is an index into
`trace.blocks` counted from 0, or from the end when negative (-1: the last block); files and caches keep it
counted from 0.

The cache. Streaming a data set through a model is most of what training costs, and a second dictionary of
the same layer (another kind, k or seed) should not pay it again. `cache_activations` writes a layer's
tokens for a data set into a folder of shards under `root`, named by a key that is the SHA-256 of what
decides the numbers: the model (its name, where its files came from, the commit or the weights' own
SHA-256), the block, the tokens, the preprocessing (resize, crop, mean, std, interpolation), and the data
(its name, split and image ids). Each shard is `SHARD_IMAGES` images in one safetensors file, written
through a temporary file renamed into place, so an interrupted run keeps every finished shard and the next
one writes only the missing ones; a second call with the same key reads everything from disk. Images that
do not decode are skipped and counted (`Cached.skipped`). Under torchrun shard k is made by rank
k % world_size (the ranks need one shared disk) and every rank waits for all of them before reading.

Caching is a pipeline, so the device never waits for the host: images are decoded and preprocessed in
`torch.utils.data.DataLoader` workers (into pinned memory on a GPU, copied to it without blocking), the traced
forwards run on the device, their tokens come back by non-blocking copies, and a background thread waits for
them and writes each shard. The batches are the ones a plain loop would make (each shard's images in runs of
`batch_size`, those that do not decode dropped from their run), so the shards are the same bit for bit.
`workers` defaults to none on the CPU (the forwards use every core; decoding there costs little beside them)
and to up to 8 with a GPU.

Each shard holds `tokens` (images n d, float32, as the model computed them), `images` (their indices in the
data) and `sizes` (each image's h, w before preprocessing, for aligning grids: `align.py`); `layer.json` says
what the folder holds, with each grid token's rectangle in the model's input pixels.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor
from tqdm import tqdm

from ...data import Dataset
from ...distributed import Ranks
from ...files import safe_name, write_atomic
from ...image import ImageError
from ...models.trace import BlockTrace, Trace
from ..kinds.dictionary import ConceptsError, block_words
from .align import token_rectangles

TOKENS = ("patch", "cls", "patch+cls", "position")
SHARD_IMAGES = 1024   # images per shard: what an interrupted run can lose
LAYER_FILE = "layer.json"
CACHE_VERSION = 1
Progress = Callable[[int, int], None]   # (images done, images in all)


def block_index(trace: Trace, block: int) -> int:
    """`block` (negative: from the end) as an index into `trace.blocks` counted from 0, or a ConceptsError."""
    depth = len(trace.blocks)
    if not isinstance(block, int) or isinstance(block, bool) or not -depth <= block < depth:
        raise ConceptsError(f"This model has {depth} blocks (0 to {depth - 1}, or -1 for the last): there is no "
                            f"block {block!r}.")
    return block % depth


def default_tokens(block: BlockTrace) -> str:
    """What a dictionary reads of a block by default: a CNN's positions, else the grid (patch) tokens."""
    return "patch" if block.attends else "position"


def check_tokens(block: BlockTrace, tokens: str, index: int) -> None:
    """Refuses a token kind the block does not have, in words."""
    if tokens not in TOKENS:
        raise ConceptsError(f"tokens must be one of {', '.join(TOKENS)}, not {tokens!r}.")
    if (tokens == "position") != (not block.attends):
        have = "a convolutional block: its tokens are the grid's positions ('position')" if not block.attends else \
            "a transformer block: its grid tokens are 'patch' tokens"
        raise ConceptsError(f"{block_words(index).capitalize()} is {have}, not {tokens!r} ones.")
    if "cls" in tokens and "cls" not in block.prefix_kinds:
        raise ConceptsError(f"{block_words(index).capitalize()} has no class token; read its 'patch' tokens instead.")


def block_tokens(trace: Trace, block: int, tokens: str) -> Tensor:
    """b n d: the tokens of `tokens` kind that block `block` put out (the class token first where kept;
    registers and distillation tokens never)."""
    index = block_index(trace, block)
    out = trace.blocks[index]
    check_tokens(out, tokens, index)
    grid = out.tokens[:, out.prefix:]
    if tokens in ("patch", "position"):
        return grid
    cls = out.prefix_kinds.index("cls")
    if tokens == "cls":
        return out.tokens[:, cls:cls + 1]
    return torch.cat([out.tokens[:, cls:cls + 1], grid], dim=1)


# ---- the cache ----------------------------------------------------------------------------------------------

def model_identity(loaded) -> dict:
    """What names a loaded model's numbers: its name, where its files came from, and the Hub commit or, for a
    folder, the SHA-256 of its weights file."""
    source = loaded.source
    identity = {"name": loaded.name, "location": source.location, "weights": source.weights}
    if source.commit:
        identity["commit"] = source.commit
    else:
        digest = hashlib.sha256()
        with open(Path(source.location) / source.weights, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        identity["sha256"] = digest.hexdigest()
    return identity


def data_identity(data: Dataset, indices: Sequence[int]) -> dict:
    """The data set's name and the SHA-256 of the ids of the images read, in order."""
    ids = "\n".join(data.ids[i] for i in indices).encode()
    return {"name": data.name, "images": len(indices), "ids_sha256": hashlib.sha256(ids).hexdigest()}


@dataclass(frozen=True)
class Cached:
    """One layer's tokens for a data set, in the cache: read with `tokens()` (every token, t d) or `grids()`
    (images n d, for aligning two models' grids)."""
    folder: Path
    layer: dict      # what layer.json holds: model, revision, block, tokens, preprocessing, data, geometry
    shards: tuple[Path, ...]
    skipped: int     # images that did not decode

    @property
    def block(self) -> int:
        return self.layer["block"]

    @property
    def d(self) -> int:
        return self.layer["d"]

    def read_shard(self, shard: Path) -> dict[str, Tensor]:
        """One shard's tensors (tokens, images, sizes), or a ConceptsError if it is damaged."""
        try:
            return load_tensors(shard.read_bytes())
        except (SafetensorError, OSError) as e:
            raise ConceptsError(f"The cached activations {shard} are damaged ({e}): delete the folder "
                                f"{self.folder} to make them again.") from None

    def grids(self) -> tuple[Tensor, Tensor, Tensor]:
        """(images n d tokens, images image indices, images 2 original sizes), every shard in order."""
        parts = list(self.shard_grids())
        if not parts:
            raise ConceptsError(f"No image of the data set could be read into {self.folder}.")
        return tuple(torch.cat(column) for column in zip(*parts))

    def shard_grids(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """`grids()` one shard at a time, in order: at most `SHARD_IMAGES` images in memory."""
        for shard in self.shards:
            part = self.read_shard(shard)
            yield part["tokens"], part["images"], part["sizes"]

    def tokens(self) -> Tensor:
        """Every cached token as one t d tensor, image by image."""
        grids, _, _ = self.grids()
        return grids.reshape(-1, grids.shape[-1])


def preprocessing(loaded) -> dict:
    """The checkpoint's preprocessing as plain data (what the cache key holds of it)."""
    return asdict(loaded.transform)


def cache_activations(loaded, data: Dataset, *, block: int, tokens: str | None = None, root: str | Path,
                      indices: Sequence[int] | None = None, batch_size: int = 128, ranks: Ranks | None = None,
                      workers: int | None = None, progress: bool = True) -> Cached:
    """The tokens of `tokens` kind (default: `default_tokens`) that `block` of a loaded model puts out for the
    images `indices` of `data` (default all), made once into the cache under `root` and read from there after.
    A progress bar (stderr) counts the images; `ranks` (from `distributed.ranks()`) shares the shards out;
    `workers` decode and preprocess (default: none on the CPU, up to 8 with a GPU)."""
    return cache_blocks(loaded, data, blocks=[block], tokens=[tokens], root=root, indices=indices,
                        batch_size=batch_size, ranks=ranks, workers=workers, progress=progress)[0]


def cache_blocks(loaded, data: Dataset, *, blocks: Sequence[int], tokens: Sequence[str | None], root: str | Path,
                 indices: Sequence[int] | None = None, batch_size: int = 128, ranks: Ranks | None = None,
                 workers: int | None = None, progress: bool = True) -> list[Cached]:
    """`cache_activations` of several blocks of one model (`tokens[i]` the kind read at `blocks[i]`) from one pass
    over the data: each image is traced once and every layer's missing shard written from that trace. Each layer
    keeps its own folder and key, so it is the same cache, number for number, as caching that block alone."""
    indices = list(range(len(data))) if indices is None else list(indices)
    if not indices:
        raise ConceptsError("There are no images to read activations from.")
    if len(tokens) != len(blocks):
        raise ConceptsError(f"Give one token kind for each block: {len(tokens)} for {len(blocks)} blocks.")
    probe = _probe(loaded)
    layers = []
    for block, kind in zip(blocks, tokens):
        index = block_index(probe, block)
        kind = kind or default_tokens(probe.blocks[index])
        check_tokens(probe.blocks[index], kind, index)
        layers.append((index, kind))
    if len(set(layers)) != len(layers):
        raise ConceptsError("The same block and tokens are asked for twice.")
    chunks = [indices[start:start + SHARD_IMAGES] for start in range(0, len(indices), SHARD_IMAGES)]
    described = []
    for index, kind in layers:
        layer = {"version": CACHE_VERSION, "model": model_identity(loaded), "block": index, "tokens": kind,
                 "preprocessing": preprocessing(loaded), "data": data_identity(data, indices)}
        key = hashlib.sha256(json.dumps(layer, sort_keys=True).encode()).hexdigest()
        folder = Path(root) / f"{safe_name(loaded.name)}-block{index}-{kind}-{key[:16]}"
        shards = tuple(folder / f"shard-{number:05d}.safetensors" for number in range(len(chunks)))
        described.append((layer, key, folder, shards, tuple(block_tokens(probe, index, kind).shape[1:])))
    ranks = ranks or Ranks(0, 1, loaded.device)
    # a chunk is traced where any layer lacks its shard; every layer's shard of it is then written
    jobs = [(chunk, [shards[number] for _, _, _, shards, _ in described])
            for number, chunk in enumerate(chunks)]
    mine = [(chunk, shards) for chunk, shards in ranks.mine(jobs) if not all(shard.exists() for shard in shards)]
    names = ", ".join(str(index) for index, _ in layers)
    bar = tqdm(total=sum(len(chunk) for chunk, _ in mine),
               desc=f"activations of {loaded.name} block{'s' * (len(layers) > 1)} {names}", unit="image",
               disable=not progress or not mine, mininterval=1)
    with bar:
        _write_shards(mine, loaded, data, layers, batch_size, [empty for *_, empty in described],
                      default_workers(loaded.device, workers), bar.update)
    ranks.gather("")   # a barrier: every rank's shards are on disk
    cached = []
    for (index, kind), (layer, key, folder, shards, empty) in zip(layers, described):
        description = {**layer, "key": key, "d": empty[1], "tokens_per_image": empty[0],
                       **_geometry(probe, index, kind)}
        if ranks.leader and not (folder / LAYER_FILE).exists():
            write_atomic(folder / LAYER_FILE, json.dumps(description, indent=1).encode())
        skipped = sum(len(chunk) - shard_images(shard) for chunk, shard in zip(chunks, shards))
        cached.append(Cached(folder=folder, layer=description, shards=shards, skipped=skipped))
    return cached


def _probe(loaded) -> Trace:
    """A trace of one blank image at the model's input size: the blocks, their grids and token kinds."""
    with torch.inference_mode():
        return loaded.model.trace(torch.zeros(1, 3, *loaded.transform.crop, device=loaded.device), attention=False)


def _geometry(trace: Trace, index: int, tokens: str) -> dict:
    """What aligning grids needs: the input size, the grid and each grid token's rectangle (y0, x0, y1, x1) in
    input pixels, and how many class tokens come before the grid in each cached row."""
    out = trace.blocks[index]
    return {"input_size": list(trace.input_size), "grid": list(out.query_grid), "prefix": int("cls" in tokens),
            "rectangles": token_rectangles(trace, index).tolist() if tokens != "cls" else []}


def default_workers(device: torch.device, workers: int | None) -> int:
    """DataLoader workers for caching: as asked, else none on the CPU and up to 8 beside a GPU; none where
    processes cannot be forked (they inherit the data set instead of pickling it)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 0
    if workers is not None:
        return workers
    return 0 if device.type == "cpu" else max(0, min(8, (os.cpu_count() or 1) - 1))


class _Decoded(torch.utils.data.Dataset):
    """The images of a data set by index, decoded and preprocessed (None for one that does not decode)."""

    def __init__(self, data: Dataset, preprocess: Callable):
        self.data, self.preprocess = data, preprocess

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[Tensor, int, tuple[int, int]] | None:
        try:
            image = self.data.image(i)
        except ImageError:
            return None
        return self.preprocess(image), i, (image.height, image.width)


def _batch(decoded: list) -> tuple[Tensor | None, list[int], list[tuple[int, int]], int]:
    """A run of decoded images -> (pixels of those that decoded, their indices, their sizes, the run's length)."""
    kept = [item for item in decoded if item is not None]
    pixels = torch.cat([item[0] for item in kept]) if kept else None
    return pixels, [item[1] for item in kept], [item[2] for item in kept], len(decoded)


def _write_shards(mine: Sequence[tuple[Sequence[int], Sequence[Path]]], loaded, data: Dataset,
                  layers: Sequence[tuple[int, str]], batch_size: int, empty: Sequence[tuple[int, int]], workers: int,
                  advance: Callable[[int], None]) -> None:
    """Each (chunk, one shard per layer): the chunk's images through the model in runs of `batch_size` (the
    unreadable ones dropped; `empty`: each layer's n, d of a shard with no image), every layer's (block index,
    tokens) read from the one trace, the shards written by a background thread."""
    runs = [(number, chunk[start:start + batch_size]) for number, (chunk, _) in enumerate(mine)
            for start in range(0, len(chunk), batch_size)]
    if not runs:
        return
    on_gpu = loaded.device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        _Decoded(data, loaded.preprocess), batch_sampler=[run for _, run in runs], collate_fn=_batch,
        num_workers=workers, pin_memory=on_gpu, prefetch_factor=4 if workers else None,
        multiprocessing_context="fork" if workers else None)
    last_run = {number: position for position, (number, _) in enumerate(runs)}   # where each shard is complete
    parts: list[tuple[list[Tensor], list[int], list[tuple[int, int]]]] = []
    written: Future | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitviz-shards") as writer:
        for position, ((number, _), (pixels, kept, sizes, asked)) in enumerate(zip(runs, loader)):
            if pixels is not None:
                with torch.inference_mode():
                    trace = loaded.model.trace(pixels.to(loaded.device, non_blocking=True), attention=False)
                    # non-blocking into pinned memory on a GPU: the writer waits for the copy, not this loop
                    parts.append(([block_tokens(trace, index, tokens).float().to("cpu", non_blocking=on_gpu)
                                   for index, tokens in layers], kept, sizes))
            advance(asked)
            if position == last_run[number]:
                copied = torch.cuda.Event() if on_gpu else None
                if copied is not None:
                    copied.record()
                if written is not None:
                    written.result()   # one chunk in the writer's hands at a time: memory stays bounded
                written = writer.submit(_write_chunk, mine[number], parts, copied, empty)
                parts = []
        if written is not None:
            written.result()


def _write_chunk(job: tuple[Sequence[int], Sequence[Path]], parts: list, copied,
                 empty: Sequence[tuple[int, int]]) -> None:
    """A chunk's shard of every layer from its runs' tokens, once the device has copied them (`copied`: a CUDA
    event)."""
    chunk, shards = job
    if copied is not None:
        copied.synchronize()
    kept = [i for _, indices, _ in parts for i in indices]
    sizes = [size for _, _, run_sizes in parts for size in run_sizes]
    for layer, shard in enumerate(shards):
        rows = [layers[layer] for layers, _, _ in parts]
        tensors = {"tokens": torch.cat(rows).contiguous() if rows else torch.zeros(0, *empty[layer]),
                   "images": torch.tensor(kept, dtype=torch.int64),
                   "sizes": torch.tensor(sizes, dtype=torch.int32).reshape(-1, 2)}
        write_atomic(shard, save_tensors(tensors, metadata={"images": str(len(kept)), "asked": str(len(chunk))}))


def shard_images(shard: Path) -> int:
    """How many images a shard holds, read from its safetensors header alone."""
    with open(shard, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return int(json.loads(f.read(size)).get("__metadata__", {})["images"])
