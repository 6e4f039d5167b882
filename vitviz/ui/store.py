"""The sessions the app keeps in its own process: the runs of each Explain, filled from what the GPU
functions (`gpu/`) return, so every re-render draws from them without a model pass.

A run's maps and curves are asked of the GPU functions only when the run has not kept them yet; what
comes back is kept in the run (`ModelRun.keep`), so asking again costs nothing, on ZeroGPU too.
"""
from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import gradio as gr
import numpy as np
from PIL import Image

from ..explain import method as find_method
from ..session import ModelRun
from . import gpu


@dataclass
class Session:
    """One Explain: the picture, each model's run (built from its card, pixels and trace), what the Anatomy
    tab draws of each model's weights, and the models' names as the page asked for them (what the GPU
    functions load them by: a folder's run is named after the folder, not its path)."""
    picture: Image.Image
    runs: list[ModelRun]
    traced: list[gpu.Traced]
    names: list[str]
    prompts: list[str] = field(default_factory=list)   # what a CLIP model classifies over (none: no CLIP model)
    readings: dict = field(default_factory=dict)   # what a tab asked of a GPU function beyond maps (`reading`)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_traced(cls, picture: Image.Image, traced: Sequence[gpu.Traced], names: Sequence[str],
                    prompts: Sequence[str] = ()) -> Session:
        runs = [ModelRun(t.card, picture, pixels=t.pixels, trace=t.trace) for t in traced]
        return cls(picture, runs, list(traced), [name.strip() for name in names], list(prompts))

    def reading(self, key: str, compute=None):
        """What a tab asked of the GPU functions for this session beyond its runs' maps (the Compare tab's logit
        lens): `compute()` the first time, kept afterwards, so asking again costs nothing. Without `compute`, the
        kept reading, or None."""
        with self._lock:   # two events asking at once wait for one computation
            if key not in self.readings and compute is not None:
                self.readings[key] = compute()
            return self.readings.get(key)

    def fill_maps(self, asked: Sequence[Sequence[tuple[str, dict]]]) -> None:
        """Make sure each run keeps the maps `asked[i]` lists for it ((method, options) pairs, as
        `ModelRun.token_map` takes them): the targeted ones it lacks come from one `gpu.class_maps` call for
        all runs; the others are read from the trace when drawn."""
        keys, requests = [], []
        for run, wanted in zip(self.runs, asked):
            pending = {}
            for method, options in wanted:
                if not run.applies(method):   # its view says why (a method that reads attention, on a CNN)
                    continue
                key, request = gpu.in_words(run.map_request, method, **options)
                if find_method(method).targeted and not run.kept(key):
                    pending[key] = request
            keys.append(list(pending))
            requests.append(list(pending.values()))
        if not any(requests):
            return
        maps = gpu.class_maps(self.names, [run.pixels for run in self.runs], requests, self.prompts)
        for run, run_keys, stacked in zip(self.runs, keys, maps):
            for key, values in zip(run_keys, stacked):
                run.keep(key, np.asarray(values, dtype=np.float32))

    def fill_faithfulness(self, method: str, steps: int) -> None:
        """Each classifier run's deletion and insertion curves of `method`'s map for its top class (one
        `gpu.faithfulness` call for all), unless it keeps them already."""
        runs = [run for run in self.runs if run.has_classifier and run.applies(method)]
        todo = [run for run in runs if not run.kept(run.faithfulness_key(method, steps=steps))]
        if not todo:
            return
        self.fill_maps([[(method, {})] if run in todo else [] for run in self.runs])
        names = dict(zip(map(id, self.runs), self.names))
        curves = gpu.faithfulness([names[id(run)] for run in todo], [run.pixels for run in todo],
                                  [run.token_map(method) for run in todo], [run.target(None) for run in todo], steps,
                                  self.prompts)
        for run, result in zip(todo, curves):
            run.keep(run.faithfulness_key(method, steps=steps), result)


class SessionStore:
    """The app's sessions, server side: key -> one Explain's session, least recently used dropped first, so
    memory stays bounded however many browsers (or API clients) come and go."""

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, session: Session) -> str:
        key = uuid.uuid4().hex
        with self._lock:
            self._sessions[key] = session
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
        return key

    def get(self, key: str | None) -> Session:
        """The session of `key`, or a gr.Error that says it expired."""
        with self._lock:
            if key not in self._sessions:
                raise gr.Error("these results have expired: press Explain again")
            self._sessions.move_to_end(key)
            return self._sessions[key]

    def __len__(self) -> int:
        return len(self._sessions)
