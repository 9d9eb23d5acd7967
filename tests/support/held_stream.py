"""A device stream for deterministic pipeline tests: the forward runs on the CPU when a batch is launched (real values),
but the batch stays "on the device" until the test releases its completion, so a test holds two batches in flight
and decides when each finishes, never by timing. A completion may also be told to raise what a failing device raises
when waited on."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from scorekeeper_worker.engine.runner.device_stream import Completion, HostStream


class HeldCompletion:
    def __init__(self, inner: Completion) -> None:
        self.inner = inner
        self.released = threading.Event()
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.released.is_set()

    def wait(self) -> None:
        if not self.released.wait(120):
            raise TimeoutError("a held batch was never released")
        if self.error is not None:
            raise self.error

    def device_seconds(self) -> float:
        return self.inner.device_seconds()

    def release(self, error: BaseException | None = None) -> None:
        self.error = error
        self.released.set()


class HeldStream:
    """Every batch's completion, in launch order: released as launched until `hold`, then held until released."""

    simulated = False

    def __init__(self) -> None:
        self.host = HostStream()
        self.completions: list[HeldCompletion] = []
        self.auto = True

    def hold(self) -> None:
        """From now on, batches stay in flight until released (the completions so far are forgotten)."""
        self.completions.clear()
        self.auto = False

    def forward(self, run: Callable[[], torch.Tensor], tokens: int, rows: int) -> torch.Tensor:
        return self.host.forward(run, tokens, rows)

    def completion(self) -> Completion:
        held = HeldCompletion(self.host.completion())
        if self.auto:
            held.release()
        self.completions.append(held)
        return held

    def in_flight(self) -> int:
        return sum(not c.done() for c in self.completions)

    def release_all(self) -> None:
        """Release every batch, now and from now on."""
        self.auto = True
        for held in self.completions:
            held.released.set()
