"""Python's cyclic garbage collector in a serving process: every pause as a metric, and start-up objects frozen.

A collection holds the GIL: while it runs, the event loop answers nothing and the model thread cannot return from a
torch op. A full (generation 2) collection walks every tracked object, and a loaded worker holds hundreds of
thousands of them (torch, transformers, FastAPI, the model's modules): ~0.25 s per full collection on the
development machine, the 100-300 ms stalls LinkedIn removed from its SGLang deployment. `gc.freeze()` once the model
is loaded moves those objects into a permanent generation that no collection walks again; they are still freed by
reference counting, only cycles among them are never collected (what the load left behind is collected first).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram


class GcPauseObserver:
    """A `gc.callbacks` entry that observes each collection's pause into a histogram labelled by generation."""

    def __init__(self, pauses: Histogram) -> None:
        self.pauses = pauses
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # Collections never overlap (the collector holds the GIL and is not re-entrant), so one start time suffices.
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses.labels(str(info["generation"])).observe(time.perf_counter() - self._started)
            self._started = None

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def freeze_after_load() -> int:
    """Collect what loading left behind, then freeze every surviving object; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
