"""A dictionary across models on disk (`save_across`, `read`; the dictionary itself: `kinds/across.py`).

Files (`save_across`, `read`). A folder holding one vitviz dictionary file per model (`own.py`, named
from its position and model: '0-vit-cifar10.safetensors', '1-facebook--dinov2-base.safetensors') and
the manifest `across.json`:

    {"format": "vitviz-concepts-across", "version": 1, "kind": ..., "n_concepts": n,
     "models": [{"model": name, "file": file name, "sha256": SHA-256 of the file's bytes}, ...],
     "training": how it was trained}

written file by file through temporary files renamed into place, the manifest last (and an older
manifest removed first): a folder without a manifest is not an across dictionary, and a file swapped
for another (even a sound dictionary of the same model) is refused by its SHA-256.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...files import safe_name, write_atomic
from ..kinds.across import Across
from ..kinds.dictionary import ConceptsError
from . import own

FORMAT, VERSION = "vitviz-concepts-across", 1
MANIFEST = "across.json"


def file_name(position: int, model: str) -> str:
    """The file of the dictionary of `model`, at `position` among the models: '1-facebook--dinov2-base.safetensors'
    (the position keeps names apart that `safe_name` makes equal)."""
    return f"{position}-{safe_name(model)}.safetensors"


def save_across(across: Across, folder: str | Path) -> Path:
    """`across` written into `folder` (made if need be): one vitviz dictionary file per model and the manifest
    `across.json`, each atomically, the manifest last; -> the folder. Refused, with nothing written, if a
    weight is NaN or infinite."""
    folder = Path(folder)
    for model, dictionary in across.dictionaries.items():
        own.refuse_non_finite(dictionary.state_dict(), f"The dictionary of {model} to be saved in {folder}")
    (folder / MANIFEST).unlink(missing_ok=True)   # until the new manifest is in, the folder is no across dictionary
    entries = []
    for position, (model, dictionary) in enumerate(across.dictionaries.items()):
        path = own.save(dictionary, folder / file_name(position, model))
        entries.append({"model": model, "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    manifest = {"format": FORMAT, "version": VERSION, "kind": across.kind, "n_concepts": across.n_concepts,
                "models": entries, "training": across.training_record}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    return folder


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's files from a Hub repo (`get(name, optional=)` downloads one): the manifest, then each
    model's file it names -> their local folder, or None where the repo has no manifest. `weights` names none."""
    manifest = get(MANIFEST, optional=True)
    if manifest is None:
        return None
    for entry in _manifest(manifest)["models"]:
        get(entry["file"])
    return manifest.parent


def matches(path: Path) -> bool:
    """Whether `path` is an across dictionary: a folder holding across.json, or that manifest itself."""
    return path.is_dir() and (path / MANIFEST).is_file() or path.is_file() and path.name == MANIFEST


def read(path: Path) -> Across:
    """An across dictionary's folder (or its manifest) -> the `Across`, in eval mode on the CPU, or a
    ConceptsError that says what is wrong with the folder."""
    folder = path if path.is_dir() else path.parent
    manifest = _manifest(folder / MANIFEST)
    dictionaries = []
    for entry in manifest["models"]:
        file = folder / entry["file"]
        if not file.is_file():
            raise ConceptsError(f"{folder} is missing {entry['file']}, the dictionary of {entry['model']}: copy the "
                                f"whole folder again.")
        if hashlib.sha256(file.read_bytes()).hexdigest() != entry["sha256"]:
            raise ConceptsError(f"{file} is not the file this across dictionary was saved with (its SHA-256 differs "
                                f"from the one in {MANIFEST}): it was changed or replaced; copy the whole folder "
                                f"again.")
        dictionary = own.read(file)
        if dictionary.origin.model != entry["model"]:
            raise ConceptsError(f"{folder} is inconsistent: {MANIFEST} says {entry['file']} is the dictionary of "
                                f"{entry['model']}, and the file says it is {dictionary.origin.describe()}.")
        if dictionary.kind != manifest["kind"]:
            raise ConceptsError(f"{folder} is inconsistent: {entry['file']} is a {dictionary.kind} dictionary, and "
                                f"{MANIFEST} says the models' are {manifest['kind']}.")
        if dictionary.n_concepts != manifest["n_concepts"]:
            raise ConceptsError(f"{folder} is inconsistent: {entry['file']} has {dictionary.n_concepts} concepts, "
                                f"and {MANIFEST} says the models share {manifest['n_concepts']}.")
        dictionaries.append(dictionary)
    try:
        across = Across(dictionaries)
    except ConceptsError as e:
        raise ConceptsError(f"{folder}: {e}") from None
    across.training_record = manifest.get("training")
    return across.eval()


def _manifest(path: Path) -> dict:
    """The manifest at `path`, checked for its format, version and the fields `read` uses."""
    try:
        manifest = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConceptsError(f"{path} is damaged: it is not valid JSON ({e}).") from None
    own.checked_format(manifest, path, format=FORMAT, version=VERSION, what="dictionary")
    entries, n = manifest.get("models"), manifest.get("n_concepts")
    if not isinstance(n, int) or not isinstance(manifest.get("kind"), str) or not isinstance(entries, list) or not all(
            isinstance(entry, dict) and all(isinstance(entry.get(key), str) for key in ("model", "file", "sha256"))
            for entry in entries):
        raise ConceptsError(f"{path} is incomplete: it needs kind, n_concepts and, for each model, its model, file and "
                            f"sha256.")
    for entry in entries:
        if Path(entry["file"]).name != entry["file"] or entry["file"].startswith("."):
            raise ConceptsError(f"{path} names {entry['file']!r} as a file of the dictionary; its files are in its "
                                f"own folder, by plain names.")
    return manifest
