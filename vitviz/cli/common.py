"""What the commands share: the usage error they raise, image paths and the output folder read from the command
line, and the help of the options several commands take."""
from __future__ import annotations

import glob
from pathlib import Path

from ..data import IMAGE_SUFFIXES

DATA_HELP = ("a folder (class sub-folders give labels), an .npz in the layout of cifar10_jpeg.npz, cifar10 (that "
             "file where vitviz finds it: $VITVIZ_CIFAR10, ../shared/data/ beside the repository, ~/.cache/vitviz/; "
             "`vitviz data cifar10` makes it) or cifar10-test (torchvision's test split)")
SIZE_HELP = ("input size in px (square) to run the models at, resized and cropped by each checkpoint's own rule "
             "(default: the catalog's size, e.g. 224 for DINOv2, else the checkpoint's own)")


class UsageError(Exception):
    """A problem with the command line, said in words the user can act on."""


def expand_paths(patterns: list[str]) -> list[Path]:
    """Files, folders (their image files, sorted) and globs -> image paths, each once, in order."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = [Path(p) for p in sorted(glob.glob(pattern))] if glob.has_magic(pattern) else [Path(pattern)]
        if not matches:
            raise UsageError(f"no file matches {pattern!r}")
        for path in matches:
            if path.is_dir():
                paths += sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            elif path.exists():
                paths.append(path)
            else:
                raise UsageError(f"{path} does not exist")
    return list(dict.fromkeys(paths))


def prepare_out(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".vitviz-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to --out {out}: {e.strerror or e}") from None
    return out
