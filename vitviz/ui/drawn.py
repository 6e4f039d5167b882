"""Pictures drawn on request (the Anatomy tab's `/looks`, a card's "Draw this concept" and "Draw variants"), kept on
disk by the hash of what made them, so the same request from any session, or after a restart, draws nothing again.

The key is the SHA-256 of everything `gpu.draw_pictures` draws from: the plan (its models' names), the target (kind,
number, block, the dictionary as `gpu.dictionary_source` gives it, with its weights' checksum where it is a folder
here), the position, the variants and the negative, the settings as a pictures file records them
(`looks.pictures.settings_record`), the drawing's revision (`looks.draw.DRAWING`) and the device kind (a GPU's
pictures round their last bits elsewhere). A file is one safetensors file: per picture its image, transparency map
and curve, and in its header what `gpu.Picture` holds besides; it is written atomically, and one that cannot be read
is drawn again (never unpickled). The folder is `$VITVIZ_PICTURES` (default `$XDG_CACHE_HOME/vitviz/pictures`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors

from ..concepts import ConceptsError
from ..concepts.files.own import header_json
from ..files import write_atomic
from . import gpu

VARIABLE = "VITVIZ_PICTURES"
HEADER_KEY = "vitviz_drawn"


def folder() -> Path:
    """Where drawn pictures are kept: `$VITVIZ_PICTURES`, else `$XDG_CACHE_HOME/vitviz/pictures`."""
    if os.environ.get(VARIABLE):
        return Path(os.environ[VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitviz" / "pictures"


def key_of(plan, kind: str, number, *, block, dictionary: str, settings, position, variants: int,
           negative: bool) -> str:
    """The hash of a request (the module docstring)."""
    from ..looks.draw import DRAWING
    from ..looks.pictures import settings_record

    where = gpu.dictionary_folder(dictionary) if dictionary else None
    weights = None if where is None else sorted(   # a folder's dictionary as it is now, not as it was named
        (p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in Path(where).glob("*.safetensors")
        if not p.name.startswith(("looks", "exemplars")))
    record = {"plan": [list(m) for m in plan], "kind": kind, "number": str(number), "block": str(block),
              "dictionary": dictionary, "weights": weights, "position": position, "variants": int(variants),
              "negative": bool(negative), "settings": settings_record(settings), "drawing": DRAWING,
              "device": "cuda" if str(gpu.DEVICE).startswith("cuda") else "cpu"}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def read(path: Path) -> list[gpu.Picture] | None:
    """The pictures kept in `path`, or None where there are none or the file cannot be read as them."""
    try:
        raw = path.read_bytes()
        tensors, header = load_tensors(raw), header_json(raw, path, key=HEADER_KEY, what="drawn pictures file")
        return [gpu.Picture(models=tuple(p["models"]), target=p["target"], seconds=float(p["seconds"]),
                            note=p["note"], label=p["label"], image=tensors[f"{i}.image"].numpy(),
                            alpha=tensors[f"{i}.alpha"].numpy(), curve=tensors[f"{i}.curve"].numpy())
                for i, p in enumerate(header["pictures"])]
    except (OSError, SafetensorError, ConceptsError, ValueError, KeyError, TypeError):
        return None


def write(path: Path, pictures: list[gpu.Picture]) -> None:
    tensors = {f"{i}.{part}": torch.from_numpy(np.ascontiguousarray(getattr(p, part), dtype=np.float32))
               for i, p in enumerate(pictures) for part in ("image", "alpha", "curve")}
    header = {"pictures": [{"models": list(p.models), "target": p.target, "seconds": p.seconds, "note": p.note,
                            "label": p.label} for p in pictures]}
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))


def draw_pictures(plan, kind: str, number, *, block=None, dictionary: str = "", settings, position=None,
                  variants: int = 1, negative: bool = False, progress=None) -> list[gpu.Picture]:
    """`gpu.draw_pictures`, from the disk where the same request was drawn before (the module docstring)."""
    options = dict(block=block, dictionary=dictionary, settings=settings, position=position, variants=variants,
                   negative=negative)
    path = folder() / f"{key_of(plan, kind, number, **options)}.safetensors"
    kept = read(path) if path.is_file() else None
    if kept is not None:
        return kept
    pictures = gpu.draw_pictures(plan, kind, number, progress=progress, **options)
    try:
        write(path, pictures)
    except OSError:   # a read-only or full disk: drawn, not kept
        pass
    return pictures
