"""Image data sets for work over many images (training, evaluation): a folder, an .npz of JPEG bytes,
or torchvision's CIFAR-10 test split, all read the same way; and CIFAR-10 as an .npz, found or made.

    data = open_data("cifar10")     # or an .npz, a folder, or "cifar10-test"
    len(data), data.classes, data.labels[0], data.image(0)  # PIL RGB image; ImageError if it will not decode

- A folder: its image files, sorted. Class sub-folders give labels (the sub-folders' names, sorted,
  are the classes); a flat folder has none.
- An .npz in the layout of `cifar10_jpeg.npz`: `<split>_bytes` (every image's encoded bytes,
  concatenated), `<split>_offsets` (n + 1 byte offsets), optionally `<split>_labels` and
  `class_names`. Read with allow_pickle=False.
- `cifar10`: that file for CIFAR-10, wherever `cifar10_file` finds it: `$VITVIZ_CIFAR10`, then
  `../shared/data/cifar10_jpeg.npz` beside the repository (the team's copy), then the user's cache
  (`~/.cache/vitviz/`). `vitviz data cifar10` (`make_cifar10`) makes it from the public download.
- `cifar10-test`: torchvision's CIFAR-10 test split, downloaded once to `$TORCH_HOME/datasets`
  (~/.cache/torch/datasets) where there is a network. torchvision unpickles its batch files, and does
  so only after checking each file's published MD5, so only the official files are ever unpickled.

Images are decoded one at a time by `vitviz.image.read_image`, with every check an upload gets.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from .files import write_atomic
from .image import read_image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".avif"}
CIFAR10_TEST = "cifar10-test"
CIFAR10 = "cifar10"                     # --data's name for the CIFAR-10 .npz, wherever `cifar10_file` finds it
CIFAR10_FILE = "cifar10_jpeg.npz"
CIFAR10_VARIABLE = "VITVIZ_CIFAR10"     # the path to the file, where it is kept elsewhere
MAKE_CIFAR10 = "vitviz data cifar10"    # the command that makes it
CIFAR10_JPEG_QUALITY = 75               # the team's copy's quality (Pillow's default, and its tables)
TEAM_CIFAR10 = Path(__file__).resolve().parents[2] / "shared" / "data" / CIFAR10_FILE   # beside the repository


class DataError(ValueError):
    """Data that cannot be used, said in words a person can act on."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Images read one at a time by index, with their labels and classes where the data has them."""
    name: str                          # what summaries call it: the path as given, or "cifar10-test"
    ids: tuple[str, ...]               # one per image: its file (relative to the folder) or "<split>/<index>"
    labels: tuple[int, ...] | None     # indices into `classes`; None when the data has no labels
    classes: tuple[str, ...] | None
    source: Callable[[int], bytes | Path | Image.Image]   # image i as read_image takes it

    def __len__(self) -> int:
        return len(self.ids)

    def image(self, index: int, *, target_size: int | tuple[int, int] | None = None) -> Image.Image:
        """Image `index`, decoded and checked (`ImageError` if it will not decode)."""
        return read_image(self.source(index), target_size=target_size)


def spread(total: int, limit: int | None) -> list[int]:
    """`limit` indices spread evenly over `total` (all of them without a limit): a class-sorted file or
    class folders then give every class its share."""
    if limit is None or limit >= total:
        return list(range(total))
    return np.linspace(0, total - 1, max(limit, 0)).round().astype(int).tolist()


def class_positions(classes: Sequence[str] | None, labels: Sequence[str]) -> list[int] | None:
    """Where each of the data's classes is among the model's labels; None unless all of them are."""
    if classes is None:
        return None
    position = {name: i for i, name in enumerate(labels)}
    return [position[c] for c in classes] if all(c in position for c in classes) else None


def open_data(spec: str | Path, *, split: str = "test") -> Dataset:
    """A folder, an .npz file (its `split`), 'cifar10' (the `split` of the file `cifar10_file` finds) or
    'cifar10-test'."""
    if str(spec) == CIFAR10_TEST:
        return cifar10_test()
    if str(spec) == CIFAR10:
        return open_npz(spec, split=split)
    path = Path(spec)
    if path.is_dir():
        return open_folder(path)
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise DataError(f"--data {path} is a file but not an .npz: give a folder of images, an .npz in the "
                            f"layout of {CIFAR10_FILE}, {CIFAR10} or {CIFAR10_TEST}")
        return open_npz(path, split=split)
    raise DataError(f"--data {path}: no such folder or file (give a folder of images, an .npz in the layout of "
                    f"{CIFAR10_FILE}, {CIFAR10} or {CIFAR10_TEST})")


def open_folder(folder: Path) -> Dataset:
    """A folder of images as a `Dataset`: labelled by its class sub-folders' names, or unlabelled when
    flat. Raises `DataError` for a folder that mixes the two or holds no images."""
    def images_in(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)

    loose = images_in(folder)
    class_folders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if loose and class_folders:
        raise DataError(f"{folder} holds both images and sub-folders: put every image in a class folder "
                        f"(the folder names become the labels), or use a flat folder (no labels)")
    if class_folders:
        files = [(path, label) for label, sub in enumerate(class_folders) for path in images_in(sub)]
        classes, labels = tuple(p.name for p in class_folders), tuple(label for _, label in files)
    else:
        files, classes, labels = [(path, None) for path in loose], None, None
    if not files:
        raise DataError(f"{folder} holds no images (looked for {', '.join(sorted(IMAGE_SUFFIXES))}"
                        f"{' in its sub-folders' if class_folders else ''})")
    paths = [path for path, _ in files]
    return Dataset(name=str(folder), ids=tuple(p.relative_to(folder).as_posix() for p in paths), labels=labels,
                   classes=classes, source=paths.__getitem__)


def open_npz(path: str | Path, *, split: str = "test") -> Dataset:
    """The `split` of an .npz of JPEG bytes (the layout of cifar10_jpeg.npz) as a `Dataset`, read without
    pickle and only that split's arrays ('cifar10': the file `cifar10_file` finds); `DataError` says what is
    missing or inconsistent."""
    path = cifar10_file() if str(path) == CIFAR10 else Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (for CIFAR-10, --data {CIFAR10} finds {CIFAR10_FILE} where vitviz "
                        f"keeps it, and `{MAKE_CIFAR10}` makes it)")
    needed = [f"{split}_bytes", f"{split}_offsets"]
    try:
        data = np.load(path, allow_pickle=False)
        files = set(data.files)
        # only this split's arrays are read: cifar10_jpeg.npz's train split is five times its test split
        arrays = {name: data[name] for name in (*needed, f"{split}_labels", "class_names") if name in files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not a readable .npz file: {e}") from None
    if any(name not in arrays for name in needed):
        raise DataError(f"{path} holds no images for the split {split!r}: expected the arrays {' and '.join(needed)} "
                        f"(the layout of cifar10_jpeg.npz); it has {', '.join(sorted(files)) or 'no arrays'}")
    raw, offsets = arrays[needed[0]], arrays[needed[1]].astype(np.int64)
    if raw.dtype != np.uint8 or raw.ndim != 1 or offsets.ndim != 1 or len(offsets) < 2 or offsets[0] != 0 \
            or (np.diff(offsets) < 0).any() or offsets[-1] != len(raw):
        raise DataError(f"{path}: {needed[0]} must be one uint8 array and {needed[1]} the n + 1 increasing offsets "
                        f"of the images in it, from 0 to its length")
    n = len(offsets) - 1
    classes = tuple(str(c) for c in arrays["class_names"]) if "class_names" in arrays else None
    labels = None
    if f"{split}_labels" in arrays:
        labels = tuple(int(v) for v in arrays[f"{split}_labels"])
        if len(labels) != n:
            raise DataError(f"{path}: {split}_labels has {len(labels)} entries for {n} images")
        classes = classes or tuple(str(c) for c in range(max(labels) + 1))
        if min(labels) < 0 or max(labels) >= len(classes):
            raise DataError(f"{path}: {split}_labels holds classes outside 0 .. {len(classes) - 1}")
    return Dataset(name=str(path), ids=tuple(f"{split}/{i}" for i in range(n)), labels=labels, classes=classes,
                   source=lambda i: raw[offsets[i]:offsets[i + 1]].tobytes())


def cifar10_test() -> Dataset:
    """torchvision's CIFAR-10 test split as a `Dataset`, downloaded once to `$TORCH_HOME/datasets`;
    `DataError` where it cannot be had (no network: pass the .npz instead)."""
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

    root = Path(torch.hub.get_dir()).parent / "datasets"
    try:
        data = TorchvisionCIFAR10(root=str(root), train=False, download=True)
    except (OSError, RuntimeError) as e:   # no network, or a damaged download
        raise DataError(f"{CIFAR10_TEST}: could not get torchvision's CIFAR-10 into {root} ({e}); without a "
                        f"network, pass the .npz instead (--data {CIFAR10})") from None
    return Dataset(name=CIFAR10_TEST, ids=tuple(f"test/{i}" for i in range(len(data))),
                   labels=tuple(int(t) for t in data.targets), classes=tuple(data.classes),
                   source=lambda i: Image.fromarray(data.data[i]))


# ---------------------------------------------------------------- CIFAR-10 as an .npz of JPEG files: found or made

def cached_cifar10() -> Path:
    """cifar10_jpeg.npz in the user's cache, `$XDG_CACHE_HOME/vitviz/` (`~/.cache/vitviz/` without it): the last
    place `cifar10_file` looks, and where `vitviz data cifar10` writes the file unless told otherwise."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitviz" / CIFAR10_FILE


def cifar10_file() -> Path:
    """The CIFAR-10 .npz (the layout of cifar10_jpeg.npz), the first found of:

    1. `$VITVIZ_CIFAR10`, the path to the file (set, it must name one);
    2. `../shared/data/cifar10_jpeg.npz` beside the repository: the team's copy;
    3. `cached_cifar10()`: `~/.cache/vitviz/cifar10_jpeg.npz`, where `vitviz data cifar10` writes it.

    `DataError` where it is in none of them, naming the places and the command that makes it."""
    chosen = os.environ.get(CIFAR10_VARIABLE)
    if chosen:
        if not Path(chosen).is_file():
            raise DataError(f"{CIFAR10_VARIABLE}={chosen}: no such file. Point it at a {CIFAR10_FILE}, make one "
                            f"there with `{MAKE_CIFAR10} --out {chosen}`, or unset it to use the copy beside the "
                            f"repository or in your cache")
        return Path(chosen)
    found = next((path for path in (TEAM_CIFAR10, cached_cifar10()) if path.is_file()), None)
    if found is None:
        raise DataError(f"CIFAR-10 ({CIFAR10_FILE}) is in none of the places vitviz looks: ${CIFAR10_VARIABLE} "
                        f"(not set), {TEAM_CIFAR10} (the team's copy beside the repository), {cached_cifar10()}. "
                        f"Make it with `{MAKE_CIFAR10}` (downloads CIFAR-10, about 170 MB, and writes the last of "
                        f"these), or put a copy in one of them")
    return found


def make_cifar10(out: str | Path) -> Path:
    """cifar10_jpeg.npz made at `out` from the public CIFAR-10 download (torchvision's `CIFAR10`, about 170 MB,
    fetched into a temporary folder beside `out` and removed after), in the team's copy's layout: per split
    (`train`, 50,000 images; `test`, 10,000) `<split>_bytes` (uint8: every image as a JPEG file of quality 75,
    concatenated), `<split>_offsets` (int64, n + 1: image i is `bytes[off[i]:off[i + 1]]`) and `<split>_labels`
    (uint8), each split ordered by class (in the download's order within a class) as the team's copy is, and
    `class_names` (10,). Written atomically, with progress on stderr. `DataError` where the download fails (no
    network), saying where else the file can come from."""
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".cifar10-download-", dir=out.parent) as download:
        try:
            splits = {split: TorchvisionCIFAR10(root=download, train=split == "train", download=True)
                      for split in ("train", "test")}
        except (OSError, RuntimeError) as e:   # no network (urllib's URLError is an OSError), a damaged download
            raise DataError(f"Could not download CIFAR-10 from {TorchvisionCIFAR10.url} "
                            f"({getattr(e, 'reason', None) or e}). Making {CIFAR10_FILE} needs a network. Without "
                            f"one, copy a {CIFAR10_FILE} made elsewhere to {cached_cifar10()}, or put it anywhere "
                            f"and set {CIFAR10_VARIABLE} to its path") from None
        arrays = {name: array for split, data in splits.items()
                  for name, array in jpeg_split(split, data.data, data.targets).items()}
        arrays["class_names"] = np.array(splits["train"].classes)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomic(out, buffer.getvalue())
    return out


def jpeg_split(split: str, images: np.ndarray, labels: Sequence[int]) -> dict[str, np.ndarray]:
    """One split's arrays of cifar10_jpeg.npz from its pixels (n h w 3 uint8) and labels: the images as JPEG
    files of `CIFAR10_JPEG_QUALITY`, ordered by class (stably)."""
    order = np.argsort(np.asarray(labels), kind="stable")
    files = []
    for i in tqdm(order, desc=f"{split}: JPEG", unit="image", file=sys.stderr):
        file = io.BytesIO()
        Image.fromarray(images[i]).save(file, "JPEG", quality=CIFAR10_JPEG_QUALITY)
        files.append(file.getvalue())
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)
    return {f"{split}_bytes": np.frombuffer(b"".join(files), np.uint8), f"{split}_offsets": offsets,
            f"{split}_labels": np.asarray(labels, np.uint8)[order]}
