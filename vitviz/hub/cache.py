"""The in-process cache of loaded models, bounded by count and bytes; server owners size it to their memory."""
from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager

from .loaded import LoadedModel


class ModelCache:
    """Loaded models by (request, device), least recently used first, bounded by count and bytes.

    Loads of the same key wait for each other (one download, one copy in memory); different keys don't.
    A model dropped from the cache but still held elsewhere (by a session the app keeps) is handed out
    again instead of being loaded a second time beside it.
    """

    def __init__(self, *, max_models: int, max_bytes: int):
        self.max_models, self.max_bytes = max_models, max_bytes
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self._alive: weakref.WeakValueDictionary[tuple, LoadedModel] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._loading: dict[tuple, list] = {}   # key -> [lock, number of loads holding or waiting for it]

    def get(self, key: tuple) -> LoadedModel | None:
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            loaded = self._alive.get(key)
        if loaded is not None:
            self.put(key, loaded)
        return loaded

    def put(self, key: tuple, loaded: LoadedModel) -> None:
        """Keep `loaded`, dropping the least recently used; a model above `max_bytes` alone isn't kept."""
        with self._lock:
            self._alive[key] = loaded
            if loaded.nbytes <= self.max_bytes:
                self._models[key] = loaded
            while self._models and (len(self._models) > self.max_models or self._nbytes() > self.max_bytes):
                self._models.popitem(last=False)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes()

    def _nbytes(self) -> int:
        return sum(m.nbytes for m in self._models.values())

    def names(self) -> list[str]:
        with self._lock:
            return [m.name for m in self._models.values()]

    def clear(self) -> None:
        with self._lock:
            self._models.clear()
            self._alive.clear()

    @contextmanager
    def loading(self, key: tuple):
        with self._lock:
            entry = self._loading.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._loading[key]


# server owners size it to their memory: VITVIZ_CACHE_MODELS (count), VITVIZ_CACHE_GB (weights, GiB)
CACHE = ModelCache(max_models=int(os.environ.get("VITVIZ_CACHE_MODELS", 4)),
                   max_bytes=int(float(os.environ.get("VITVIZ_CACHE_GB", 3)) * 2**30))


def clear_cache() -> None:
    """Forget every loaded model (the next `load` reads files again; the HF cache is untouched)."""
    CACHE.clear()
