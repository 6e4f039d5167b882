"""`load(source)`: a catalog name, a dictionary file or folder, or a Hub repo id -> a `Dictionary`, through the
reader of its layout.

A reader is a module for one layout with `matches(path) -> bool`, `read(path) -> Dictionary` and `fetch(get,
weights=)` for its files in a Hub repo (its shape: `layout.Reader`), as `vitviz.hub` has one per checkpoint layout:
vitviz's own (`own`), a dictionary across models (`across`: a folder of one vitviz file per model and its manifest,
which loads as an `Across`, whose `dictionary(model)` is each model's), SAELens's folder (`saelens`), saev's sae.pt
(`saev`) and ViT-Prisma's config.json and .pt (`prisma`). `READERS` lists them in the order they are tried, and the
first that matches reads. None runs code from the file: pickled weights are read by torch.load(weights_only=True)
alone. What the readers of other tools' files share is `layout.py`; the Hub's side, `hub.py`.

A source is, in the order asked: a name in `catalog.DICTIONARIES` (its repo fetched, and the origin its entry
names: model, block, tokens, since other tools' files say less), a name in `catalog.BUNDLED_DICTIONARIES` (vitviz's
own, in checkpoints/concepts/), an existing file or folder, or a Hub repo id,
`owner/name` or `owner/name@revision` (`hub.py` fetches it). Anything else is refused in words.
"""
from __future__ import annotations

from pathlib import Path

from ... import catalog
from ...hub import ProgressFn
from ..kinds.across import Across
from ..kinds.dictionary import ConceptsError, Dictionary, Origin
from . import across, hub, own, prisma, saelens, saev
from .layout import Reader

READERS: tuple[Reader, ...] = (across, own, saelens, saev, prisma)
WHAT_LOADS = (f"vitviz reads its own dictionaries (a .safetensors file written by vitviz.concepts.save, or a "
              f"folder holding {own.FILE}; a dictionary across models: a folder holding {across.MANIFEST}), "
              f"SAELens's folders ({saelens.CONFIG} and {saelens.WEIGHTS}), saev's "
              f"{saev.FILE} and ViT-Prisma's {prisma.CONFIG} beside its .pt")


def load(source: str | Path, *, path_in_repo: str | None = None,
         progress: ProgressFn | None = None) -> Dictionary | Across:
    """A catalog name, a dictionary file or folder, or a Hub repo id (`owner/name[@revision]`, with `path_in_repo`
    the folder or weights file inside the repo where the dictionary is not at its top) -> the dictionary, in eval
    mode on the CPU. `progress(fraction, description)` hears downloads. Raises `ConceptsError` for anything a
    person can fix or should know: a missing, damaged or foreign file, an unknown name, a failed download."""
    text = str(source).strip()
    entry = catalog.DICTIONARIES.get(text)
    if entry is not None:
        if path_in_repo is not None:
            raise ConceptsError(f"{text!r} is a catalog dictionary, whose entry names its place in {entry.repo}: "
                                f"load it without path_in_repo.")
        reader, path = hub.fetch(entry.repo, readers=READERS, path_in_repo=entry.path_in_repo,
                                       progress=progress, name=text)
        dictionary = _read(reader, path)
        dictionary.origin = Origin(model=entry.model, block=entry.block, tokens=entry.tokens)
        return dictionary
    if text in catalog.BUNDLED_DICTIONARIES:
        return read(catalog.BUNDLED_DICTIONARIES[text].path)
    path = Path(text).expanduser()
    if path.exists():
        if path_in_repo is not None:
            raise ConceptsError(f"path_in_repo names a place inside a Hub repo; {text!r} is a file or folder here.")
        return read(path)
    if text in catalog.CATALOG:
        raise ConceptsError(f"{text!r} is a model, not a dictionary. The catalog's dictionaries are "
                            f"{', '.join(catalog.DICTIONARIES)}.")
    if text.startswith(("/", ".", "~")) or "\\" in text:
        raise ConceptsError(f"There is no file or folder {text!r}.")
    reader, path = hub.fetch(text, readers=READERS, path_in_repo=path_in_repo, progress=progress)
    return _read(reader, path)


def folder_of(source: str | Path) -> Path | None:
    """The local folder a dictionary's files are in, where what is made from it lies beside them (its exemplar
    index, means, pictures): a bundled dictionary's, a folder, a file's folder; None for anything not here (a
    catalog or Hub dictionary, a missing path)."""
    text = str(source).strip()
    if text in catalog.BUNDLED_DICTIONARIES:
        return catalog.BUNDLED_DICTIONARIES[text].path
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    return path.parent if path.is_file() else None


def read(path: Path) -> Dictionary | Across:
    """A local dictionary file or folder -> the dictionary, read by the first reader whose layout it matches."""
    for reader in READERS:
        if reader.matches(path):
            return _read(reader, path)
    raise ConceptsError(f"{path} is not a dictionary vitviz reads; {WHAT_LOADS}.")


def _read(reader: Reader, path: Path) -> Dictionary | Across:
    try:
        return reader.read(path)
    except OSError as e:
        raise ConceptsError(f"{path} could not be read ({e.strerror or e}).") from None
