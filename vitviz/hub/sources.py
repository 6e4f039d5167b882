"""What a source names, decided before any request: a catalog entry, a local folder or a Hub repo id."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from .. import catalog
from ..bundle import saved_steps, step_folder
from .files import CHECKPOINT_FILES, CONFIG, OPEN_CLIP_CONFIG
from .loaded import LoadError

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"   # the Hub's owner and name rules
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")   # branch, tag, refs/pr/N or commit


@dataclass(frozen=True)
class Request:
    """What a source asks for, once parsed: a Hub repo id at a revision, or a folder; `key()` tells
    loads of the same model apart from others for the cache."""
    name: str
    repo_id: str | None = None
    revision: str = "main"
    folder: Path | None = None
    size: int | None = None   # the catalog's input size for it (None: the checkpoint's own)

    def key(self) -> tuple:
        if self.folder is None:
            return ("hub", self.repo_id, self.revision)
        # a folder trained again in place is a different model
        files = [self.folder / f for f in CHECKPOINT_FILES]
        return ("folder", str(self.folder), *(p.stat().st_mtime_ns if p.is_file() else None for p in files))


def parse_source(source: str, *, allow_local: bool = True) -> Request:
    """What `source` names: a catalog entry, a local folder (if allowed) or a Hub repo id.

    Only the text is looked at (and the disk for folders), so a bad id never reaches the network.
    """
    if not isinstance(source, str) or not source.strip():
        raise LoadError(f"No model named. {what_loads()}")
    text = source.strip()
    name, at, step = text.partition("@")
    if at and catalog.CATALOG.get(name) is not None and catalog.CATALOG[name].bundled:
        return _step_request(text, catalog.CATALOG[name], step)
    entry = catalog.CATALOG.get(text)
    if entry is not None and entry.bundled:
        if not (entry.path / CONFIG).is_file():
            raise LoadError(f"The bundled model {text!r} is missing: {entry.path} has no {CONFIG} "
                            f"(checkpoints/README.md says how it is trained).")
        return Request(name=text, folder=entry.path)
    if entry is not None:
        return Request(name=text, repo_id=entry.source, size=entry.size)
    if allow_local and (text.startswith(("/", ".", "~")) or Path(text).expanduser().is_dir()):
        folder = Path(text).expanduser().resolve()
        if not any((folder / f).is_file() for f in (CONFIG, OPEN_CLIP_CONFIG)):
            raise LoadError(f"{folder} is not a model folder: it has no {CONFIG} (nor open_clip's {OPEN_CLIP_CONFIG}).")
        return Request(name=folder.name, folder=folder)
    repo_id, at, revision = text.partition("@")
    problem = _repo_id_problem(repo_id, allow_local) or (_revision_problem(revision) if at else None)
    if problem:
        raise LoadError(f"{text[:120]!r} is not a model vitviz can load: {problem}. {what_loads()}")
    return Request(name=text, repo_id=repo_id, revision=revision or "main")


def _step_request(text: str, entry, step: str) -> Request:
    """'vit-cifar10@800': a bundled model as it was after that many optimiser steps of its training
    (`vitviz.train --save-steps`, checkpoints/<model>/steps/step-800/), refused in words with the steps there are."""
    kept = saved_steps(entry.path)
    there = (f"{entry.name} keeps steps {', '.join(map(str, kept))}" if kept else
             f"no step of {entry.name}'s training ships (`python -m vitviz.train --save-steps ...` keeps them)")
    if not step.isdigit():
        raise LoadError(f"{text!r}: after '@' a bundled model takes a training step, a whole number; {there}.")
    if int(step) not in kept:
        raise LoadError(f"{text!r}: there is no checkpoint of {entry.name} at step {int(step)}; {there}.")
    return Request(name=f"{entry.name}@{int(step)}", folder=step_folder(entry.path, int(step)))


def _repo_id_problem(repo_id: str, allow_local: bool) -> str | None:
    if "://" in repo_id or repo_id.lower().startswith(("www.", "huggingface.co/", "hf.co/")):
        return "web addresses are not accepted, give the repo id (owner/name) instead"
    if repo_id.startswith(("/", ".", "~")) or "\\" in repo_id or ".." in repo_id:
        return "that is a file path" + ("" if allow_local else ", and local folders are not accepted here")
    if _REPO_ID.fullmatch(repo_id) and "--" not in repo_id:
        return None
    if "/" not in repo_id:
        close = difflib.get_close_matches(repo_id, catalog.CATALOG, n=1)
        return "not a catalog name" + (f" (did you mean {close[0]!r}?)" if close else "")
    return "a Hub repo id is owner/name, each up to 96 letters, digits, '-', '_' or '.'"


def _revision_problem(revision: str) -> str | None:
    if _REVISION.fullmatch(revision) and ".." not in revision and "//" not in revision and not revision.endswith("/"):
        return None
    return "after '@' comes a branch, tag or commit, e.g. '@main'"


def what_loads() -> str:
    """The sentence that tells a person what `load` takes: the catalog's names or a Hub repo id."""
    return (f"Use a catalog name ({', '.join(catalog.CATALOG)}) or a Hub repo id such as "
            f"'timm/deit_small_patch16_224.fb_in1k' or 'microsoft/cvt-13'.")
