"""Graceful drain on SIGTERM: /ready answers 503 at once, while the port stays open and in-flight requests finish.

uvicorn alone closes its listening socket on the first signal, so a readiness probe during the drain sees a refused
connection rather than an answer, and a request already routed to the pod fails. `DrainingServer` instead marks the
worker as draining, keeps serving, and starts uvicorn's own shutdown once no scoring request is in flight (or the
drain timeout has passed): then the socket closes and the remaining connections get the rest of the budget.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)

@dataclass
class Drain:
    """Shared by the request middleware (which counts scoring requests in flight) and the server."""

    inflight: int = 0
    deadline: float | None = None  # monotonic; set when the drain starts

    @property
    def started(self) -> bool:
        return self.deadline is not None

    def start(self, timeout: float) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + timeout

    def remaining(self) -> float:
        return 0.0 if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def finished(self) -> bool:
        return self.started and (self.inflight == 0 or self.remaining() == 0)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, timeout: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.timeout = timeout
        self._signal: int | None = None
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signal is None:  # the first signal starts the drain
            self._signal = sig
            self.drain.start(self.timeout)
        else:  # a second one stops at once, as uvicorn does
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn calls this every 0.1 s; its shutdown waits for open connections up to the rest of the budget.
        if self._signal is not None and not self._announced:  # logged here, not in the signal handler
            self._announced = True
            log.info("draining: /ready answers 503; %d scoring request(s) in flight, up to %.0f s",
                     self.drain.inflight, self.drain.remaining())
        if self._signal is not None and not self.should_exit and self.drain.finished():
            self.config.timeout_graceful_shutdown = max(1, math.ceil(self.drain.remaining()))
            super().handle_exit(self._signal, None)  # uvicorn re-raises it after shutdown: exit status as signalled
        return await super().on_tick(counter)
