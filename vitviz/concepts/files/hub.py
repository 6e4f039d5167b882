"""Dictionaries on the Hugging Face Hub: a repo id (`owner/name[@revision]`) and, where the dictionary is not at the
top of the repo, the folder or file inside it -> its files in huggingface_hub's cache and the reader of their layout.

The files come through `vitviz.hub`'s `HubFiles`, as a model's do, so HF_ENDPOINT, HF_HUB_OFFLINE, tokens and the
cache work as they do for models. Before any download one metadata request, within `HUB_TIMEOUT` and without
retries, asks the Hub which commit the revision is: here for the repo's `.gitattributes`, which every Hub repo has
(a dictionary's repo has no config.json to ask for). That file, a few hundred bytes, is then fetched by the
revision's name, so the cache learns where the revision points and an offline machine finds the dictionary again;
every other file comes from the one commit, a fresh download is checked against the SHA-256 the Hub named it by
and a damaged one is removed from the cache. Where the Hub cannot be reached the cache answers alone, and says so.

The layout is found by asking, in the order of the readers (`READERS`, `__init__.py`), for each one's first file (each
reader's `fetch`: vitviz's concepts.safetensors, SAELens's cfg.json, saev's sae.pt, ViT-Prisma's config.json),
one request each; the first the repo has (and that is in its layout: a weights file named in path_in_repo is asked
of each) is fetched whole and read by that reader alone.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath

from ...hub import LoadError, ProgressFn, parse_source
from ...hub.files import HubFiles
from ..kinds.dictionary import ConceptsError
from .layout import Reader

PROBE = ".gitattributes"
WEIGHT_SUFFIXES = (".pt", ".safetensors")   # a path_in_repo ending so names a weights file, else a folder


def fetch(source: str, *, readers: tuple[Reader, ...], path_in_repo: str | None = None,
          progress: ProgressFn | None = None, name: str | None = None) -> tuple[Reader, Path]:
    """(reader, local path for its `read`) of the dictionary in the Hub repo `source` (`owner/name[@revision]`),
    at `path_in_repo` inside it: the folder holding its files, or its weights file where its layout's name for it
    varies (ViT-Prisma's .pt). `name` names it in messages (a catalog name; default `source`). Refused in words:
    an id that is not one, a repo, revision or file the Hub does not have, a failed download, an unknown layout."""
    name = name or source
    try:
        request = parse_source(source, allow_local=False)
    except LoadError:
        raise ConceptsError(f"{source[:120]!r} is neither a file or folder here nor a Hub repo id "
                            f"(owner/name, or owner/name@revision).") from None
    folder, weights = _inside(path_in_repo)
    try:
        files = HubFiles(name, request.repo_id, request.revision, progress, probe=PROBE)
        files.get(PROBE)

        def get(filename: str, *, optional: bool = False) -> Path | None:
            return files.get(f"{folder}/{filename}" if folder else filename, optional=optional)

        for reader in readers:
            path = reader.fetch(get, weights=weights)
            if path is not None and reader.matches(path):   # a weights file named for another layout is not its
                return reader, path
    except LoadError as e:
        raise ConceptsError(str(e)) from None
    where = f" at {path_in_repo!r}" if path_in_repo else ""
    raise ConceptsError(f"{name!r} holds no dictionary vitviz reads{where}: it has none of {_first_files(readers)}. "
                        f"A repo of several dictionaries keeps each in a folder: name it with path_in_repo.")


def _inside(path_in_repo: str | None) -> tuple[str | None, str | None]:
    """(folder, weights file name) of a path inside a repo, each None where it names none."""
    if not path_in_repo:
        return None, None
    path = PurePosixPath(path_in_repo.strip("/"))
    if path.is_absolute() or ".." in path.parts or "\\" in path_in_repo:
        raise ConceptsError(f"path_in_repo {path_in_repo!r} must be a path inside the repo, such as "
                            f"'blocks.8.hook_resid_post' or 'n_images_2600058.pt'.")
    if path.suffix in WEIGHT_SUFFIXES:
        return (str(path.parent) if path.parent.parts else None), path.name
    return str(path), None


def _first_files(readers: tuple[Reader, ...]) -> str:
    """The file each layout is found by, for messages."""
    names = []

    def note(filename: str, *, optional: bool = False) -> None:
        names.append(filename)   # the first file asked for; None answers 'absent', so each layout stops there

    for reader in readers:
        reader.fetch(note, weights=None)
    return ", ".join(names)
