"""Where a checkpoint's files come from: a local folder, or the Hub through huggingface_hub's cache.

Before any download one metadata request, with a deadline of `HUB_TIMEOUT` seconds and no retries,
asks the Hub which commit the revision is. If the Hub can't be reached (`HF_HUB_OFFLINE=1`, no
network, DNS failure, timeout, HTTP 5xx) only the cache answers, so an offline machine hears so
within that deadline rather than after huggingface_hub's own retries. Files of one load come from
that one commit. A fresh download is checked against the SHA-256 the Hub named it by, and a damaged
file is removed from the cache so a retry fetches it again. Weights come from safetensors first;
a pickled file only through `torch.load(weights_only=True)`, which refuses pickled code.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
import threading
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor
from tqdm import tqdm

from .. import catalog
from .loaded import LoadError, ProgressFn, Source

CONFIG, SAFETENSORS, PICKLED, PROCESSOR = ("config.json", "model.safetensors", "pytorch_model.bin",
                                           "preprocessor_config.json")
# open_clip's Hub layout (`push_to_hf_hub`); timm's CLIP repos ship it beside their own config.json
OPEN_CLIP_CONFIG, OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED = ("open_clip_config.json", "open_clip_model.safetensors",
                                                              "open_clip_pytorch_model.bin")
CLIP_VOCAB, CLIP_MERGES = "vocab.json", "merges.txt"   # transformers' CLIPTokenizer files
# every file a load may read, in the order a folder's fingerprint lists them
CHECKPOINT_FILES = (CONFIG, SAFETENSORS, PICKLED, PROCESSOR, OPEN_CLIP_CONFIG, OPEN_CLIP_SAFETENSORS,
                    OPEN_CLIP_PICKLED)
HUB_TIMEOUT = 2.5   # seconds the Hub has to answer the first metadata request of a load

COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ---- where files come from ----------------------------------------------------------------------------

class Files(ABC):
    """The files of one checkpoint, from a folder or the Hub; subclasses say how to get one."""

    name: str
    folder: Path | None   # where config.json is (timm reads it from there)

    @abstractmethod
    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        """The file's local path; None if it is `optional` and absent, else a LoadError."""

    @abstractmethod
    def damaged(self, path: Path, error) -> LoadError:
        """The error for a file that can't be read (and whatever clean-up makes a retry work)."""

    @abstractmethod
    def source(self, layout: str, weights: str) -> Source:
        """Where these files came from."""

    def json(self, filename: str, *, optional: bool = False) -> dict | None:
        path = self.get(filename, optional=optional)
        if path is None:
            return None
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self.damaged(path, f"not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise self.damaged(path, "not a JSON object")
        return value

    def weights(self, safetensors: str = SAFETENSORS, pickled: str = PICKLED) -> tuple[dict[str, Tensor], str]:
        """(state dict, file name): model.safetensors if there is one, else pytorch_model.bin, tensors only
        (open_clip's layout: its own two names)."""
        path = self.get(safetensors, optional=True)
        if path is not None:
            try:
                return load_file(path), safetensors
            except SafetensorError as e:
                raise self.damaged(path, e) from None
        path = self.get(pickled, optional=True)
        if path is None:
            raise LoadError(f"{self.name!r} has neither {safetensors} nor {pickled}.")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # torch's weights-only unpickler stops at the first thing that isn't tensor data; pickled code
            # and plain garbage look the same to it
            raise LoadError(f"{self.name!r}: {pickled} was refused: it is not tensors alone (it holds Python "
                            f"objects or code, or it is damaged), and vitviz never runs code from a checkpoint."
                            ) from None
        except (EOFError, RuntimeError) as e:
            raise self.damaged(path, e) from None
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise LoadError(f"{self.name!r}: {pickled} is not a state dict of tensors.")
        return state, pickled


class FolderFiles(Files):
    """A checkpoint's files in a local folder: read where they are, never downloaded, and never deleted
    when damaged."""
    def __init__(self, name: str, folder: Path):
        self.name, self.folder = name, folder

    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        path = self.folder / filename
        if path.is_file():
            return path
        if optional:
            return None
        raise LoadError(f"{self.folder} has no {filename}.")

    def damaged(self, path: Path, error) -> LoadError:
        return LoadError(f"{path} is damaged ({error}).")   # a person's own files are never deleted

    def source(self, layout: str, weights: str) -> Source:
        return Source("folder", str(self.folder), layout, weights)


class HubFiles(Files):
    """A Hub repo's files at one commit, through huggingface_hub's cache: the commit asked for once (with the
    metadata of `probe`, a file the repo must have), then the cache alone when the Hub cannot be reached; a
    damaged download is removed so a retry fetches it."""
    def __init__(self, name: str, repo_id: str, revision: str, progress: ProgressFn | None, *, probe: str = CONFIG):
        self.name, self.repo_id, self.revision = name, repo_id, revision
        self.progress, self.probe = progress, probe
        self.commit, self.offline_reason = resolve_commit(self.repo_id, self.revision, self.name, probe=probe)
        self.folder = None   # the snapshot folder, known once config.json is here

    def get(self, filename: str, *, optional: bool = False) -> Path | None:
        if self.commit is None:   # the Hub can't be reached: the cache answers alone
            try:
                path = Path(hf_hub_download(self.repo_id, filename, revision=self.revision, local_files_only=True))
            except EntryNotFoundError:
                if optional:
                    return None
                raise LoadError(f"Could not download {self.name!r} ({self.offline_reason}), and it is not in the "
                                f"cache. {offline_hint()}") from None
        else:
            path = self._download(filename, optional)
            if path is None:
                return None
        if filename in (CONFIG, OPEN_CLIP_CONFIG, self.probe):
            self.folder = path.parent
        return path

    def _download(self, filename: str, optional: bool) -> Path | None:
        # the configs (and the probe) by the revision's name, so the cache learns where it points (for offline use);
        # the rest by commit, so one load's files always belong together
        revision = self.revision if filename in (CONFIG, OPEN_CLIP_CONFIG, self.probe) else self.commit
        fresh = not isinstance(try_to_load_from_cache(self.repo_id, filename, revision=self.commit), str)
        bar = _progress_bar(self.progress, f"Downloading {filename} of {self.name}") if self.progress else None
        try:
            path = Path(hf_hub_download(self.repo_id, filename, revision=revision, etag_timeout=HUB_TIMEOUT,
                                        tqdm_class=bar))
        except EntryNotFoundError:
            if optional:
                return None
            raise LoadError(f"{self.name!r} has no {filename}"
                            + (", so it is not a timm or transformers image model." if filename == CONFIG else ".")
                            ) from None
        except (RepositoryNotFoundError, RevisionNotFoundError) as e:   # gone since the first request
            raise LoadError(f"{self.name!r} is no longer on the Hub ({type(e).__name__}).") from None
        except Exception as e:   # HTTP errors, dropped connections: huggingface_hub's client raises its own types
            raise LoadError(f"Downloading {filename} of {self.name!r} failed ({_reason(e)}). Nothing incomplete "
                            f"is used; loading it again resumes the download. {offline_hint()}") from None
        if fresh and not _matches_its_hash(path):
            raise self.damaged(path, "its SHA-256 is not the one the Hub gave")
        return path

    def damaged(self, path: Path, error) -> LoadError:
        blob = path.resolve()   # the cache keeps a link per snapshot and the file itself as a blob
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        return LoadError(f"{path.name} of {self.name!r} is damaged ({error}); it was removed from the cache, "
                         f"so loading it again downloads a fresh copy.")

    def source(self, layout: str, weights: str) -> Source:
        commit = self.commit or (self.folder.name if COMMIT.fullmatch(self.folder.name) else None)
        return Source("hub", self.repo_id, layout, weights, self.revision, commit)


def resolve_commit(repo_id: str, revision: str, name: str, *, probe: str = CONFIG) -> tuple[str | None, str | None]:
    """(commit, None) from one metadata request (for `probe`) within HUB_TIMEOUT, or (None, why) if the Hub can't
    be reached.

    A missing repo, revision or probe file is a LoadError right away.
    """
    if is_offline_mode():
        return None, "offline mode: HF_HUB_OFFLINE is set"
    if COMMIT.fullmatch(revision) and isinstance(try_to_load_from_cache(repo_id, probe, revision=revision), str):
        return revision, None   # a commit's files never change: nothing to ask
    url = hf_hub_url(repo_id, probe, revision=revision)
    try:
        metadata = _within(HUB_TIMEOUT, get_hf_file_metadata, url, timeout=HUB_TIMEOUT)
    except RepositoryNotFoundError:
        raise LoadError(f"{name!r} is not on the Hugging Face Hub (or it is private or gated).") from None
    except RevisionNotFoundError:
        raise LoadError(f"{name!r}: the Hub repo {repo_id} has no revision {revision!r}.") from None
    except EntryNotFoundError:
        raise LoadError(f"{name!r} has no {probe}"
                        + (", so it is not a timm or transformers image model." if probe == CONFIG else ".")) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status is not None and status < 500 and status != 429:
            raise LoadError(f"The Hub refused {name!r} (HTTP {status}).") from None
        return None, _reason(e)
    except Exception as e:   # no network, DNS, timeouts: whatever the HTTP client calls them
        return None, _reason(e)
    if not metadata.commit_hash:
        return None, "the endpoint does not answer like the Hugging Face Hub"
    return metadata.commit_hash, None


def _within(seconds: float, fn, *args, **kwargs):
    """fn(...) in a daemon thread, given up on after `seconds` (a DNS lookup ignores HTTP timeouts)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:
            outcome["error"] = e

    worker = threading.Thread(target=run, daemon=True, name="vitviz-hub-request")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _reason(error: BaseException) -> str:
    """A few plain words for a network failure."""
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"the Hub answered HTTP {error.response.status_code}"
    kind = type(error).__name__
    if isinstance(error, TimeoutError) or "Timeout" in kind:
        return f"no answer within {HUB_TIMEOUT:g} s"
    detail = (str(error).splitlines() or [""])[0][:160]
    if "Connect" in kind:
        return f"no network: {detail}" if detail else "no network"
    return detail or kind


def _matches_its_hash(path: Path) -> bool:
    """Whether a cached file is what the Hub named it: LFS files are stored under their SHA-256."""
    blob = path.resolve()
    if not _SHA256.fullmatch(blob.name):
        return True   # small files are named by their git hash; JSON parsing checks those
    digest = hashlib.sha256()
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == blob.name


def _progress_bar(report: ProgressFn, description: str) -> type[tqdm]:
    """A tqdm class for `hf_hub_download` that tells `report` instead of drawing."""

    class Report(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n: int = 1):
            self.n += n
            if self.total:
                report(min(max(self.n / self.total, 0.0), 1.0), description)

    return Report


# ---- what can be had now ------------------------------------------------------------------------------

def cached_models() -> dict[str, int]:
    """Catalog models that load without the network -> bytes on disk: the bundled ones and those in the HF cache."""
    out = {}
    for entry in catalog.CATALOG.values():
        paths = [entry.path / CONFIG, entry.path / SAFETENSORS] if entry.bundled else cached_files(entry.source)
        if paths and all(p.is_file() for p in paths):
            out[entry.name] = sum(p.stat().st_size for p in paths)
    return out


def cached_files(repo_id: str, revision: str = "main") -> list[Path]:
    """The files `load` would read for `revision` of `repo_id` from the HF cache; [] without config or weights."""
    found = [try_to_load_from_cache(repo_id, f, revision=revision)
             for f in (CONFIG, SAFETENSORS, PICKLED, PROCESSOR, OPEN_CLIP_CONFIG, OPEN_CLIP_SAFETENSORS,
                       OPEN_CLIP_PICKLED, CLIP_VOCAB, CLIP_MERGES)]
    paths = [Path(p) for p in found if isinstance(p, str)]
    names = {p.name for p in paths}
    layouts = [({CONFIG}, {SAFETENSORS, PICKLED}), ({OPEN_CLIP_CONFIG}, {OPEN_CLIP_SAFETENSORS, OPEN_CLIP_PICKLED})]
    return paths if CONFIG in names and any(config & names and weights & names for config, weights in layouts) else []


def offline_hint() -> str:
    """The models that load without a network (cached and bundled), named for an offline error message."""
    cached = [name for name in cached_models() if not catalog.CATALOG[name].bundled]
    return ((f"Cached models: {', '.join(cached)}. " if cached else "")
            + f"Bundled models work offline: {', '.join(e.name for e in catalog.bundled())}.")
