"""Where a batch's device work runs and when it is done: the host itself (CPU), a CUDA stream, or a simulated device.

The executor enqueues a batch's forward and heads on a `DeviceStream` and gets a `Completion` back: on CPU the work
is done by then; on CUDA it is queued behind the previous batch and the host goes on (packing the next batch) until it
waits on the completion's event; the simulated device keeps the same contract without a device, for measuring the
host's side of the pipeline on a CPU (`--simulate-device-ms`, docs/gpu.md).

The simulated device models one CUDA stream: a forward of a bucket of T tokens costs `ms_per_8192 · T / 8192` ms
(an eager batch by its live tokens); enqueueing returns at once; the work completes that long after the later of its
enqueue and the previous work's completion; waiting sleeps (the GIL released) until then. Nothing of the model runs:
the forward's output is a fixed random tensor of its shape, so the heads, the copies and everything else on the host
are the real code path."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

SIMULATED_BUCKET_TOKENS = 8192  # the simulated cost is given per this many tokens


class Completion(Protocol):
    """A batch's device work, done or queued."""

    def done(self) -> bool:
        """Whether the work has completed (never blocks)."""
        ...

    def wait(self) -> None:
        """Block until the work has completed, without holding the GIL."""
        ...

    def device_seconds(self) -> float:
        """After `wait`: the device time of the batch's forward."""
        ...


class DeviceStream(Protocol):
    """Runs (or enqueues) a batch's forward; everything enqueued after it up to `completion` belongs to the batch."""

    simulated: bool

    def forward(self, run: Callable[[], torch.Tensor], tokens: int, rows: int) -> torch.Tensor:
        """The pooled rows [rows, H] of `run()`, a forward over `tokens` tokens (live ones, or a bucket's)."""
        ...

    def completion(self) -> Completion:
        """The completion of everything enqueued since the last forward began."""
        ...


@dataclass
class Done:
    """Work that completed when it was launched (the host ran it)."""

    seconds: float

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def device_seconds(self) -> float:
        return self.seconds


class HostStream:
    """CPU: the forward runs on the calling thread, so its completion is immediate."""

    simulated = False

    def __init__(self) -> None:
        self._seconds = 0.0

    def forward(self, run: Callable[[], torch.Tensor], tokens: int, rows: int) -> torch.Tensor:
        started = time.perf_counter()
        out = run()
        self._seconds = time.perf_counter() - started
        return out

    def completion(self) -> Completion:
        return Done(self._seconds)


@dataclass
class CudaCompletion:
    """Events on the compute stream: the forward's start and end (timing), and the end of the batch's copies."""

    started: torch.cuda.Event
    forwarded: torch.cuda.Event
    finished: torch.cuda.Event

    def done(self) -> bool:
        return bool(self.finished.query())

    def wait(self) -> None:
        self.finished.synchronize()  # this batch's work only, never the whole device; torch releases the GIL

    def device_seconds(self) -> float:
        return self.started.elapsed_time(self.forwarded) / 1000


class CudaStream:
    """The current CUDA stream: the forward and everything after it are enqueued; events mark its progress."""

    simulated = False

    def __init__(self) -> None:
        self._started: torch.cuda.Event | None = None
        self._forwarded: torch.cuda.Event | None = None

    def forward(self, run: Callable[[], torch.Tensor], tokens: int, rows: int) -> torch.Tensor:
        self._started = torch.cuda.Event(enable_timing=True)
        self._forwarded = torch.cuda.Event(enable_timing=True)
        self._started.record()
        out = run()
        self._forwarded.record()
        return out

    def completion(self) -> Completion:
        assert self._started is not None and self._forwarded is not None, "completion before any forward"
        finished = torch.cuda.Event()
        finished.record()
        return CudaCompletion(self._started, self._forwarded, finished)


@dataclass
class SimulatedCompletion:
    """When the simulated device finishes a batch (an instant of `clock`), and its cost."""

    at: float
    seconds: float
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep

    def done(self) -> bool:
        return self.clock() >= self.at

    def wait(self) -> None:
        left = self.at - self.clock()
        if left > 0:
            self.sleep(left)

    def device_seconds(self) -> float:
        return self.seconds


class SimulatedStream:
    """A modelled CUDA stream (see the module docstring): costs and ordering, no computation."""

    simulated = True

    def __init__(self, ms_per_8192: float, hidden: int, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.seconds_per_token = ms_per_8192 / 1000 / SIMULATED_BUCKET_TOKENS
        self.hidden, self.clock, self.sleep = hidden, clock, sleep
        self.busy_until = 0.0  # when the last enqueued work completes
        self._last = SimulatedCompletion(0.0, 0.0, clock, sleep)
        self._outputs: dict[int, torch.Tensor] = {}

    def forward(self, run: Callable[[], torch.Tensor], tokens: int, rows: int) -> torch.Tensor:
        cost = self.seconds_per_token * tokens
        self.busy_until = max(self.clock(), self.busy_until) + cost
        self._last = SimulatedCompletion(self.busy_until, cost, self.clock, self.sleep)
        return self._output(rows)

    def completion(self) -> Completion:
        return self._last

    def _output(self, rows: int) -> torch.Tensor:
        """A fixed random float32 [rows, H] per shape (pooled rows' dtype): heads see values like a trunk's."""
        if rows not in self._outputs:
            generator = torch.Generator().manual_seed(rows)
            self._outputs[rows] = torch.randn(rows, self.hidden, generator=generator)
        return self._outputs[rows]


def stream_for(device: torch.device) -> DeviceStream:
    """The stream a model on `device` runs on."""
    return CudaStream() if device.type == "cuda" else HostStream()
