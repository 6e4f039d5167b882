"""Image data sets for work over many images (training, evaluation): a folder, an .npz of JPEG bytes,
or torchvision's CIFAR-10 test split, all read the same way.

    data = open_data("../shared/data/cifar10_jpeg.npz")    # or a folder, or "cifar10-test"
    len(data), data.classes, data.labels[0], data.image(0)  # PIL RGB image; ImageError if it will not decode

- A folder: its image files, sorted. Class sub-folders give labels (the sub-folders' names, sorted,
  are the classes); a flat folder has none.
- An .npz in the layout of `../shared/data/cifar10_jpeg.npz`: `<split>_bytes` (every image's encoded
  bytes, concatenated), `<split>_offsets` (n + 1 byte offsets), optionally `<split>_labels` and
  `class_names`. Read with allow_pickle=False.
- `cifar10-test`: torchvision's CIFAR-10 test split, downloaded once to `$TORCH_HOME/datasets`
  (~/.cache/torch/datasets) where there is a network. torchvision unpickles its batch files, and does
  so only after checking each file's published MD5, so only the official files are ever unpickled.

Images are decoded one at a time by `vitviz.image.read_image`, with every check an upload gets.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .image import read_image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".avif"}
CIFAR10_TEST = "cifar10-test"


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


def open_data(spec: str | Path, *, split: str = "test") -> Dataset:
    """A folder, an .npz file (its `split`) or 'cifar10-test'."""
    if str(spec) == CIFAR10_TEST:
        return cifar10_test()
    path = Path(spec)
    if path.is_dir():
        return open_folder(path)
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise DataError(f"--data {path} is a file but not an .npz: give a folder of images, an .npz in the "
                            f"layout of cifar10_jpeg.npz, or {CIFAR10_TEST}")
        return open_npz(path, split=split)
    raise DataError(f"--data {path}: no such folder or file (give a folder of images, an .npz in the layout of "
                    f"cifar10_jpeg.npz, or {CIFAR10_TEST})")


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
    pickle and only that split's arrays; `DataError` says what is missing or inconsistent."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (the CIFAR-10 data is ../shared/data/cifar10_jpeg.npz beside the "
                        f"repository)")
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
    from torchvision.datasets import CIFAR10

    root = Path(torch.hub.get_dir()).parent / "datasets"
    try:
        data = CIFAR10(root=str(root), train=False, download=True)
    except (OSError, RuntimeError) as e:   # no network, or a damaged download
        raise DataError(f"{CIFAR10_TEST}: could not get torchvision's CIFAR-10 into {root} ({e}); without a "
                        f"network, pass the .npz instead (--data ../shared/data/cifar10_jpeg.npz)") from None
    return Dataset(name=CIFAR10_TEST, ids=tuple(f"test/{i}" for i in range(len(data))),
                   labels=tuple(int(t) for t in data.targets), classes=tuple(data.classes),
                   source=lambda i: Image.fromarray(data.data[i]))
