"""A stand-in for the Hugging Face Hub, enough for `hf_hub_download`, with faults on demand; and
checkpoints in the Hub's real layouts to serve from it.

    hub.publish("test/tiny-vit", files_of(folder))      # -> the commit (40 hex)
    hub.fail("test/tiny-vit", "model.safetensors", "drop", times=1)
    hub.count(repo_id="test/tiny-vit", method="GET")    # requests seen

It answers HEAD and GET `/{owner}/{name}/resolve/{revision}/{path}` as the Hub does: `X-Repo-Commit`,
`ETag` (a file's SHA-256, as for LFS files, for weights; the git blob hash for small files),
`Content-Length`, `Accept-Ranges` and 206 answers to `Range: bytes=N-` (huggingface_hub resumes
with them); 404 with `X-Error-Code` RepoNotFound, RevisionNotFound or EntryNotFound. Revisions
arrive URL-quoted (refs%2Fpr%2F1) and may name a branch or a commit. No redirects, no Xet.

Faults, per repo and file (and method, GET by default), for `times` requests or for ever:
- "status": answer HTTP `status` (500 by default) with no body;
- "drop": send the headers and the body up to file offset `at` (half the file by default), then
  close the connection; a resumed request from `at` on gets nothing before the close;
- "stall": answer nothing for `seconds` (past the client's timeout), then close;
- "corrupt": send the full length with one byte in the middle changed.

huggingface_hub reads HF_ENDPOINT when it is imported; `conftest.py` sets it to this server's URL
before that. `use_endpoint` moves it later in one test (connection refused, DNS failure).
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")   # stored in LFS on the Hub: the ETag is the content's SHA-256


@dataclass(frozen=True)
class Seen:
    method: str
    repo_id: str
    revision: str
    filename: str
    range: str | None


@dataclass
class Fault:
    repo_id: str
    filename: str
    kind: str
    method: str | None
    times: int | None
    status: int = 500
    at: int | None = None
    seconds: float = 10.0


@dataclass
class Repo:
    branches: dict[str, str] = field(default_factory=dict)            # name -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)


def etag_of(filename: str, data: bytes) -> str:
    if filename.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()   # git's blob hash


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.faults: list[Fault] = []
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)   # bound now: the port is known
        self._server.daemon_threads = True
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    def start(self) -> "FakeHub":
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-hub")
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()

    def publish(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        """A new commit holding exactly `files`, at the head of `branch`; returns its hash."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, Repo())
            digest = hashlib.sha1(f"{repo_id}@{branch}#{len(repo.commits)}".encode())
            for name in sorted(files):
                digest.update(name.encode() + hashlib.sha256(files[name]).digest())
            commit = digest.hexdigest()
            repo.commits[commit] = dict(files)
            repo.branches[branch] = commit
            return commit

    def remove(self, repo_id: str) -> None:
        with self._lock:
            self.repos.pop(repo_id, None)

    def fail(self, repo_id: str, filename: str, kind: str, *, method: str | None = "GET", times: int | None = None,
             status: int = 500, at: int | None = None, seconds: float = 10.0) -> None:
        if kind not in ("status", "drop", "stall", "corrupt"):
            raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self.faults.append(Fault(repo_id, filename, kind, method, times, status, at, seconds))

    def heal(self) -> None:
        with self._lock:
            self.faults.clear()

    def count(self, *, repo_id: str | None = None, method: str | None = None, filename: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if (repo_id is None or r.repo_id == repo_id)
                       and (method is None or r.method == method) and (filename is None or r.filename == filename))

    def _take_fault(self, seen: Seen) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                same_file = (fault.repo_id, fault.filename) == (seen.repo_id, seen.filename)
                if same_file and fault.method in (None, seen.method):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times == 0:
                            self.faults.remove(fault)
                    return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeHub/1.0"

    def log_message(self, *args):   # quiet
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, *, body: bool):
        hub: FakeHub = self.server.hub
        parts = urlsplit(self.path).path.split("/")
        if len(parts) < 6 or parts[3] != "resolve":
            return self._error(404, None, "Not a resolve URL")
        repo_id, revision, filename = f"{parts[1]}/{parts[2]}", unquote(parts[4]), unquote("/".join(parts[5:]))
        seen = Seen(self.command, repo_id, revision, filename, self.headers.get("Range"))
        with hub._lock:
            hub.requests.append(seen)
        fault = hub._take_fault(seen)
        if fault is not None and fault.kind == "stall":
            time.sleep(fault.seconds)
            self.close_connection = True
            return
        if fault is not None and fault.kind == "status":
            return self._error(fault.status, None, "Injected failure")
        repo = hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        commit = repo.branches.get(revision) or (revision if revision in repo.commits else None)
        if commit is None:
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        data = repo.commits[commit].get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found", commit=commit)
        start = _range_start(seen.range) if body else 0
        if start is not None and start >= len(data) and len(data):
            return self._error(416, None, "Range not satisfiable")
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{etag_of(filename, data)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - (start or 0)))
        self.end_headers()
        if not body:
            return
        payload = data[start or 0:]
        if fault is not None and fault.kind == "corrupt":
            middle = len(payload) // 2
            payload = payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1:]
        if fault is not None and fault.kind == "drop":
            cut = len(data) // 2 if fault.at is None else fault.at
            self.wfile.write(payload[:max(cut - (start or 0), 0)])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(payload)

    def _error(self, status: int, code: str | None, message: str, *, commit: str | None = None):
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _range_start(header: str | None) -> int | None:
    if not header or not header.startswith("bytes=") or not header[6:].split("-")[0].isdigit():
        return None
    return int(header[6:].split("-")[0])


def use_endpoint(monkeypatch, url: str) -> None:
    """Point huggingface_hub at `url` for one test, as HF_ENDPOINT does when it is imported."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def closed_port_url() -> str:
    """A localhost URL where nothing listens: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---- checkpoints in the Hub's layouts, with random perturbed weights --------------------------------------

def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def timm_checkpoint(folder: Path, name: str, *, weights: str = "safetensors", seed: int = 0, **model_args):
    """timm's own `save_for_hf` layout (config.json with architecture, model_args, pretrained_cfg)
    for `create_model(name, **model_args)` with perturbed weights; returns the timm model.
    `weights`: 'safetensors', 'bin' or 'both'."""
    import timm
    import torch
    from timm.models import save_for_hf

    from test_models import VIT_STD, perturb_

    torch.manual_seed(seed)
    model = perturb_(timm.create_model(name, pretrained=False, **model_args), std=VIT_STD)
    save_for_hf(model, str(folder), safe_serialization={"safetensors": True, "bin": False, "both": "both"}[weights])
    return model


def cvt_checkpoint(folder: Path, *, size: int = 224, weights: str = "safetensors", labels: list[str] | None = None,
                   seed: int = 0, processor: bool = True):
    """transformers' `save_pretrained` layout of a small CvtForImageClassification with perturbed
    weights and BatchNorm statistics, plus the preprocessor_config.json microsoft/cvt-* ship
    (the legacy ConvNextFeatureExtractor form); `weights='bin'` keeps only a pytorch_model.bin,
    as microsoft/cvt-21 has. Returns the transformers model."""
    import torch
    from transformers import CvtConfig, CvtForImageClassification

    from test_models import CVT_STD, perturb_

    labels = labels or [f"thing {i}" for i in range(5)]
    torch.manual_seed(seed)
    config = CvtConfig(embed_dim=[16, 24, 32], num_heads=[1, 2, 2], depth=[1, 2, 3],
                       id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    model = perturb_(CvtForImageClassification(config), std=CVT_STD)
    model.save_pretrained(folder)
    if weights == "bin":
        (Path(folder) / "model.safetensors").unlink()
        torch.save(model.state_dict(), Path(folder) / "pytorch_model.bin")
    if processor:
        (Path(folder) / "preprocessor_config.json").write_text(json.dumps(cvt_processor_config(size)))
    return model


def transformers_checkpoint(folder: Path, model_cls, config, *, processor: dict | None = None, seed: int = 0,
                            std: float = 0.1):
    """transformers' `save_pretrained` layout of `model_cls(config)` with perturbed weights and BatchNorm
    statistics, and a preprocessor_config.json if given. Returns the model, reloaded from the folder."""
    import torch

    from test_models import perturb_

    torch.manual_seed(seed)
    perturb_(model_cls(config), std=std).save_pretrained(folder)
    if processor is not None:
        (Path(folder) / "preprocessor_config.json").write_text(json.dumps(processor))
    return model_cls.from_pretrained(folder).eval()


# preprocessor_config.json of microsoft/swin-tiny-patch4-window7-224 (a ViT feature extractor: a plain resize)
SWIN_PROCESSOR = {"do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
                  "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 224}


def cvt_processor_config(size: int) -> dict:
    """preprocessor_config.json as microsoft/cvt-13 (224) and microsoft/cvt-13-384 (384) have it."""
    return {"crop_pct": 0.875, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "ConvNextFeatureExtractor", "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": size}


class CodeInPickle:
    """Unpickling this calls `open(marker, 'w')`: a file appears if a loader ever runs pickled code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def pickle_with_code(path: Path, marker: Path, state_dict: dict, *, zipped: bool = True) -> None:
    """A pytorch_model.bin that is a real state dict plus one object whose unpickling runs code:
    torch.save's zip format, or (zipped=False) a bare pickle, as torch.save's old format begins."""
    import pickle

    import torch
    payload = {**state_dict, "payload": CodeInPickle(marker)}
    torch.save(payload, path) if zipped else Path(path).write_bytes(pickle.dumps(payload))
