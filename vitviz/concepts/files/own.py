"""vitviz's own dictionary file: one safetensors file, its header saying what the tensors are.

    concepts.safetensors       (any name ending .safetensors; a folder holds it under this one)
      tensors   W_enc d n, b_enc n, W_dec n d, b_dec d, normalisation.offset d, normalisation.scale (),
                and a kind's own (BatchTopK: threshold ())
      __metadata__ {"vitviz_concepts": JSON}, the JSON holding
                format "vitviz-concepts", version, kind, d, n_concepts, settings (TopK's k, ...),
                origin {model, revision, block, tokens}, normalisation (its formula, in words),
                training (how it was trained, where `train` made it), sha256; and for a dictionary
                read from another tool that normalises each token by its own statistics, per_token
                (layer_norm or constant_norm_rescale, `TokenNormalisation`) in place of the two
                normalisation tensors

`sha256` is the SHA-256 of every tensor's name and bytes, in name order, as written: a file damaged
after it was written (a flipped byte, a copy cut short) is refused rather than read as other weights.
Files are written through a temporary file renamed into place, so no reader finds half of one, and
never hold NaN or infinite values. Nothing in them is pickled: safetensors holds only numbers.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors, save as save_tensors
from torch import Tensor

from ...files import write_atomic
from ..kinds import kind_named
from ..kinds.dictionary import ConceptsError, Dictionary, Origin

FORMAT, VERSION = "vitviz-concepts", 1
FILE = "concepts.safetensors"   # the file's name in a folder
HEADER_KEY = "vitviz_concepts"  # its key in the safetensors header's __metadata__
NORMALISATION = "x_normalised = (x - normalisation.offset) / normalisation.scale"
TOKEN_NORMALISATION = {"layer_norm": "x_normalised = (x - mean(x)) / (std(x) + 1e-5), each token by its own",
                       "constant_norm_rescale": "x_normalised = x * sqrt(d) / norm(x), each token by its own"}


def matches(path: Path) -> bool:
    """Whether `path` is in this layout: a .safetensors file, or a folder holding concepts.safetensors."""
    return path.is_dir() and (path / FILE).is_file() or path.is_file() and path.suffix == ".safetensors"


def fetch(get, *, weights: str | None = None) -> Path | None:
    """This layout's file from a Hub repo (`get(name, optional=)` downloads one): `weights` or concepts.safetensors,
    or None where the repo has neither."""
    return get(weights or FILE, optional=True)


def save(dictionary: Dictionary, path: str | Path) -> Path:
    """`dictionary` written to `path` (a .safetensors file, or a folder to hold concepts.safetensors) in
    vitviz's layout, atomically; -> the file written. Refused, with nothing written, if a weight is NaN or
    infinite."""
    path = Path(path)
    path = path if path.suffix == ".safetensors" else path / FILE
    tensors = {name: value.detach().cpu().contiguous() for name, value in dictionary.state_dict().items()}
    refuse_non_finite(tensors, f"The dictionary to be saved as {path}")
    header = {"format": FORMAT, "version": VERSION, "kind": dictionary.kind, "d": dictionary.d,
              "n_concepts": dictionary.n_concepts, "settings": dictionary.settings(),
              "origin": dictionary.origin.to_dict(), "training": dictionary.training_record,
              "sha256": checksum(tensors)}
    per_token = dictionary.normalisation.per_token
    header.update({"normalisation": TOKEN_NORMALISATION[per_token], "per_token": per_token} if per_token else
                  {"normalisation": NORMALISATION})
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))
    return path


def read(path: Path) -> Dictionary:
    """A vitviz dictionary file (or a folder holding one) -> the dictionary in eval mode on the CPU, or a
    ConceptsError that says what is wrong with the file."""
    path = path / FILE if path.is_dir() else path
    data = path.read_bytes()
    try:
        tensors = load_tensors(data)
    except SafetensorError as e:
        raise ConceptsError(f"{path} is damaged or not a safetensors file ({_reason(e)}).") from None
    header = _header(data, path)
    if header.get("sha256") != checksum(tensors):
        raise ConceptsError(f"{path} is damaged: its tensors are not the ones it was written with (their "
                            f"SHA-256 differs from the one in its header).")
    refuse_non_finite(tensors, str(path))
    try:
        cls = kind_named(header["kind"], reading=True)
        dictionary = cls(int(header["d"]), int(header["n_concepts"]), origin=Origin.from_dict(header["origin"]),
                         **header["settings"])
        if header.get("per_token"):
            dictionary.normalise_each_token(header["per_token"])
        if tensors["W_enc"].dtype == torch.float64:   # a dictionary read from another tool's float64 file
            dictionary.double()
        dictionary.load_state_dict(tensors)
    except ConceptsError as e:
        raise ConceptsError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ConceptsError(f"{path}: its header and tensors do not fit together ({_reason(e)}).") from None
    dictionary.training_record = header.get("training")
    return dictionary.eval()


def checksum(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of each tensor's name and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def refuse_non_finite(tensors: dict[str, Tensor], what: str) -> None:
    """A ConceptsError naming the tensors that hold NaN or infinite values, if any do."""
    bad = [name for name, value in tensors.items() if value.is_floating_point() and not value.isfinite().all()]
    if bad:
        raise ConceptsError(f"{what} holds NaN or infinite values in {', '.join(bad)} (from a training run "
                            f"that diverged?); a dictionary needs finite weights.")


def _header(data: bytes, path: Path) -> dict:
    """The vitviz JSON in a safetensors file's header, checked for its format and version."""
    return checked_format(header_json(data, path, key=HEADER_KEY, what="dictionary"), path, format=FORMAT,
                          version=VERSION, what="dictionary")


def header_json(data: bytes, path: Path, *, key: str, what: str):
    """The JSON under `key` in the `__metadata__` of a safetensors file's header (`data`, the file's bytes), or a
    ConceptsError naming the file as not a vitviz `what`."""
    length = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8:8 + length]).get("__metadata__") or {}
    if key not in metadata:
        raise ConceptsError(f"{path} is a safetensors file, but not a vitviz {what} (its header has no {key!r} "
                            f"entry).")
    try:
        return json.loads(metadata[key])
    except json.JSONDecodeError as e:
        raise ConceptsError(f"{path}: its vitviz header is not valid JSON ({e}).") from None


def read_checked(path: Path, *, key: str, format: str, version: int, what: str, again: str) -> tuple[dict, dict]:
    """A checksummed vitviz safetensors file's (tensors, header), or a ConceptsError in words where it cannot be
    read as a `what` of `format` (up to `version`), or its tensors are not those it was written with (`again`: how
    to make it anew)."""
    try:
        raw = path.read_bytes()
        tensors = load_tensors(raw)
    except (OSError, SafetensorError) as e:
        raise ConceptsError(f"{path} cannot be read as a vitviz {what} ({_reason(e)}).") from None
    header = checked_format(header_json(raw, path, key=key, what=what), path, format=format, version=version,
                            what=what)
    if header.get("sha256") != checksum(tensors):
        raise ConceptsError(f"{path} is damaged: its tensors are not the ones it was written with; {again}.")
    return tensors, header


def checked_format(header, path: Path, *, format: str, version: int, what: str) -> dict:
    """A vitviz file's header or manifest (parsed JSON), refused in words unless it is an object of `format` at
    `version` or an earlier one (a later one asks for a newer vitviz)."""
    if not isinstance(header, dict) or header.get("format") != format:
        raise ConceptsError(f"{path}: it does not describe a {format} {what}.")
    if not isinstance(header.get("version"), int) or header["version"] > version:
        raise ConceptsError(f"{path} was written by a newer vitviz (format version {header.get('version')}; this "
                            f"one reads up to {version}): upgrade vitviz to read it.")
    return header


def _reason(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0].removeprefix("Error while deserializing: ")
