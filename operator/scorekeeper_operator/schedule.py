"""When a ScoringModel's reconcile pass runs: soon after a trigger, later on a deadline, with backoff after trouble.

One in-memory worker task per ScoringModel runs every pass for it, so passes never overlap and bursts of triggers
(a rollout emits many pod events) coalesce into one more pass. The worker also owns the timed passes kopf would
otherwise run as a timer or daemon: retries after API errors, re-checks of a conflict or a rejection (which heal
once the foreign object is gone, without a spec edit), deadlines nothing else announces, Event polling, and a
periodic resync. kopf timers and daemons would add a finalizer to every ScoringModel, and a finalizer blocks
`kubectl delete` whenever the operator is down; this state is lost on a restart instead, which the `resume`
handler makes up for. Entries are dropped when their ScoringModel goes, so memory follows the number of models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from scorekeeper_operator.k8s import TransientApiError

logger = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
Streak = Literal["errors", "blocked"]
T = TypeVar("T")
# Under edits that never stop, the debounce still lets one pass through every this many windows.
DEBOUNCE_LIMIT = 5


class Forgotten(Exception):
    """The model went away before the pass someone waited for."""


@dataclass
class _Entry(Generic[T]):
    poke: asyncio.Event = field(default_factory=asyncio.Event)
    urgent: bool = False  # run the next pass now, even during an error backoff
    soon: bool = False  # run the next pass now, unless backing off after errors
    due: float | None = None  # loop time of the next timed pass
    retired: bool = False  # the last pass found the model gone: stop, unless someone asked for a pass since
    last_edit: float | None = None  # loop time of the last spec edit (debounce)
    burst_start: float = 0.0  # loop time of the first edit of the current burst
    hold_until: float | None = None  # a burst of edits is settling: no pass before this loop time
    streaks: dict[str, int] = field(default_factory=lambda: {"errors": 0, "blocked": 0})
    waiters: list[asyncio.Future[T]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class Scheduler(Generic[T]):
    def __init__(self, run_pass: Callable[[Key], Awaitable[T]], backoff_delay: Callable[[int], float]) -> None:
        self._run_pass, self._backoff_delay = run_pass, backoff_delay
        self._entries: dict[Key, _Entry[T]] = {}

    @property
    def keys(self) -> frozenset[Key]:
        return frozenset(self._entries)

    def _entry(self, key: Key) -> _Entry[T]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
            entry.task = asyncio.get_running_loop().create_task(self._work(key, entry), name=f"reconcile {key}")
        return entry

    def trigger(self, key: Key, *, urgent: bool = False) -> None:
        """A pass soon. Child events wait out an error backoff; a spec change (urgent) does not."""
        entry = self._entry(key)
        entry.urgent |= urgent
        entry.soon = True
        entry.poke.set()

    async def run_soon(self, key: Key) -> T:
        """Trigger urgently; the outcome of a pass that started after this call (raises what it raised)."""
        entry = self._entry(key)
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry.waiters.append(waiter)
        self.trigger(key, urgent=True)
        return await waiter

    def edited(self, key: Key, window: float, *, settling: bool = False) -> None:
        """A spec edit: a pass now if none came within `window` (the leading edge), else one pass once the edits
        have stopped for `window` (the trailing edge); passes for other reasons wait for it too. A burst is rendered
        at most twice, however many edits it has (and once more per DEBOUNCE_LIMIT windows if it never ends).
        `settling`: a pass met an edit within the window of the last one it rendered (before kopf delivered it):
        held even when it is the first edit of a burst, which then starts now."""
        entry, now = self._entry(key), asyncio.get_running_loop().time()
        quiet = entry.last_edit is None or now - entry.last_edit >= window
        if quiet and settling:
            entry.burst_start = now
        if (quiet and not settling) or now - entry.burst_start >= DEBOUNCE_LIMIT * window:
            entry.burst_start, entry.hold_until = now, None
        else:
            entry.hold_until = now + window
        entry.last_edit = now
        self.trigger(key, urgent=True)

    def after(self, key: Key, seconds: float) -> None:
        """A pass no later than `seconds` from now."""
        entry = self._entry(key)
        due = asyncio.get_running_loop().time() + max(0.0, seconds)
        if entry.due is None or due < entry.due:
            entry.due = due
            entry.poke.set()

    def backoff(self, key: Key, streak: Streak) -> float:
        """Count one more troubled pass in a row; the next pass comes base·2^n later (capped). Returns the delay."""
        entry = self._entry(key)
        delay = self._backoff_delay(entry.streaks[streak])
        entry.streaks[streak] += 1
        self.after(key, delay)
        return delay

    def settle(self, key: Key, streak: Streak) -> None:
        if (entry := self._entries.get(key)) is not None:
            entry.streaks[streak] = 0

    def retire(self, key: Key) -> None:
        """From within a pass that found the model gone: the worker stops after it, unless a trigger came meanwhile
        (the model may have been created again: that pass must run)."""
        if (entry := self._entries.get(key)) is not None:
            entry.retired = True

    def forget(self, key: Key) -> None:
        """Stop scheduling passes for this model (it is gone); whoever waits for one gets no outcome."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        _settle(entry.waiters, Forgotten(f"{key[0]}/{key[1]} is gone"))
        if entry.task is not None and entry.task is not asyncio.current_task():
            entry.task.cancel()

    async def close(self) -> None:
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for key in list(self._entries):
            self.forget(key)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait(self, entry: _Entry[T]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            entry.poke.clear()
            held = entry.hold_until is not None and loop.time() < entry.hold_until
            if not held and (entry.urgent or (entry.soon and not entry.streaks["errors"])
                             or (entry.due is not None and loop.time() >= entry.due)):
                return
            wake = [t for t in (entry.due, entry.hold_until if held else None) if t is not None]
            timeout = max(0.0, min(wake) - loop.time()) if wake else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.poke.wait(), timeout)

    async def _work(self, key: Key, entry: _Entry[T]) -> None:
        while self._entries.get(key) is entry:
            await self._wait(entry)
            entry.urgent = entry.soon = False
            entry.due = entry.hold_until = None
            waiters, entry.waiters = entry.waiters, []
            try:
                outcome = await self._run_pass(key)
            except asyncio.CancelledError:
                _settle(waiters, Forgotten(f"{key[0]}/{key[1]} is gone"))
                raise
            except Exception as error:  # transient API errors, and (like kopf) anything unexpected: back off
                _settle(waiters, error)
                if self._entries.get(key) is not entry:
                    return
                delay = self.backoff(key, "errors")
                log = logger.warning if isinstance(error, TransientApiError) else logger.exception
                log("reconciling %s/%s failed (%s); retrying in %.1fs", *key, error, delay)
                continue
            self.settle(key, "errors")
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(outcome)
            if entry.retired:
                entry.retired = False
                if not (entry.urgent or entry.soon or entry.waiters):
                    self._entries.pop(key, None)


def _settle(waiters: list[asyncio.Future[T]], error: BaseException) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(error)
