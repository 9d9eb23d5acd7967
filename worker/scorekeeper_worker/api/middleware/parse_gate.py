"""Large request bodies are parsed one at a time, behind a bounded queue.

Parsing runs in a worker thread (api/middleware/per_request.py), but `json.loads` and pydantic hold the interpreter
for the whole of one call: about 0.2 s for 8 MB. Two parses at once are no faster than one after the other (they
share one interpreter lock), and each that runs is one more thread the event loop waits behind for the lock, so
/health's latency grew with every large body parsed at once. So bodies of at least LARGE_BODY_BYTES take a slot
first: at most `slots` parse at once, at most `waiting` more wait in line, and any beyond that are refused at once
(429 with Retry-After), never queued without bound. A slot is freed when its parse ends, even if the client left
first (the thread cannot be stopped; its slot stays taken until it is done). Smaller bodies, which parse in a few
milliseconds, never wait here."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from scorekeeper_worker.api.error_shape import ParsersBusy

T = TypeVar("T")

LARGE_BODY_BYTES = 1 << 20  # 1 MiB: about 20 ms of parsing
PARSE_SLOTS = 1
PARSE_WAITING = 8  # 8 more bodies of at most --max-request-bytes each, already read


class ParseGate:
    """At most `slots` large parses at once and `max_waiting` in line, first come first served; beyond that
    `ParsersBusy` (429). Used on the event loop only: no lock needed."""

    def __init__(self, slots: int = PARSE_SLOTS, waiting: int = PARSE_WAITING) -> None:
        self.slots = slots
        self.max_waiting = waiting
        self.running = 0
        self._line: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def run(self, parse: Callable[[], T]) -> T:
        """`parse()` in a worker thread once a slot is free (ParsersBusy when the line is full)."""
        if self.running < self.slots and not self._line:
            self.running += 1
        elif len(self._line) >= self.max_waiting:
            raise ParsersBusy(f"server busy: {self.running} large request bodies are being parsed and "
                              f"{len(self._line)} wait for a turn; retry after Retry-After")
        else:
            turn = asyncio.get_running_loop().create_future()
            self._line.append(turn)
            try:
                await turn  # set by `_release`, which hands its slot over
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # the slot was handed over already: pass it on
                elif turn in self._line:
                    self._line.remove(turn)
                raise
        work = asyncio.ensure_future(asyncio.to_thread(parse))
        work.add_done_callback(self._finished)
        return await asyncio.shield(work)  # a client gone does not free the slot: the thread parses on

    def _finished(self, work: asyncio.Future[T]) -> None:
        if not work.cancelled():
            work.exception()  # retrieved: nobody awaits the parse of a client that went away
        self._release()

    def _release(self) -> None:
        """A slot is free: the first in line takes it, else it is returned."""
        while self._line:
            turn = self._line.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.running -= 1
