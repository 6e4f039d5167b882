"""The model gate: every model pass of the app, the exporter and the video goes through `MODEL_GATE`, which bounds
how many run at once (`VITVIZ_MODEL_SLOTS`, default 1), so the app's GPU or CPU is never oversubscribed whoever
calls, and keeps count of them for the app's health page."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager


class ModelGate:
    """A bounded number of model passes at once, with a record of the most ever seen running."""

    def __init__(self, slots: int):
        self.slots = slots
        self._semaphore = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self.running = self.peak = self.passes = 0

    @contextmanager
    def __call__(self):
        with self._semaphore:
            with self._lock:
                self.running += 1
                self.passes += 1
                self.peak = max(self.peak, self.running)
            try:
                yield
            finally:
                with self._lock:
                    self.running -= 1


MODEL_GATE = ModelGate(int(os.environ.get("VITVIZ_MODEL_SLOTS", "1")))
