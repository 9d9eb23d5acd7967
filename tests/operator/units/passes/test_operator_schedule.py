"""schedule.Scheduler on its own: one pass at a time per model, coalesced triggers, backoff that triggers do not cut
short (a spec change does), timed passes, and nothing left behind for a model that is gone.

Every test runs on one event loop with a pass function it controls; "the worker could run now" is settled by
letting the loop turn a few times, and waits on the future are bounded by the test timeout, not by sleeps.
"""

from __future__ import annotations

import asyncio

import pytest
from scorekeeper_operator.k8s import TransientApiError
from scorekeeper_operator.schedule import Forgotten, Key, Scheduler

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]
KEY: Key = ("ml", "reranker")


class Passes:
    """A pass function that records its calls, can be held open, and fails on request."""

    def __init__(self) -> None:
        self.count = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.failures: list[Exception] = []
        self.started = asyncio.Event()

    async def __call__(self, key: Key) -> str:
        self.count += 1
        self.started.set()
        await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        return f"pass {self.count}"


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_triggers_during_a_pass_coalesce_into_one_more() -> None:
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    passes.gate.clear()
    scheduler.trigger(KEY)
    await passes.started.wait()
    for _ in range(50):  # a rollout's burst of pod events
        scheduler.trigger(KEY)
    passes.gate.set()
    await turns()
    assert passes.count == 2
    await scheduler.close()


async def test_run_soon_returns_the_outcome_of_a_pass_that_started_after_it() -> None:
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    passes.gate.clear()
    scheduler.trigger(KEY)
    await passes.started.wait()  # pass 1 is under way: its reads may predate the caller's change
    waiting = asyncio.ensure_future(scheduler.run_soon(KEY))
    passes.gate.set()
    assert await waiting == "pass 2"
    await scheduler.close()


async def test_errors_back_off_and_only_an_urgent_trigger_cuts_the_wait() -> None:
    passes = Passes()
    delays: list[int] = []  # the streak lengths the backoff was asked about

    def backoff(streak: int) -> float:
        delays.append(streak)
        return 1000.0

    scheduler = Scheduler(passes, backoff)
    passes.failures = [TransientApiError(503, "Unavailable", "down"), TransientApiError(503, "Unavailable", "down")]
    with pytest.raises(TransientApiError):
        await scheduler.run_soon(KEY)
    scheduler.trigger(KEY)  # a child event: waits for the backoff
    await turns()
    assert passes.count == 1 and delays == [0]
    with pytest.raises(TransientApiError):
        await scheduler.run_soon(KEY)  # a spec change: now
    assert passes.count == 2 and delays == [0, 1]  # the streak grows: base·2^1 next
    assert await scheduler.run_soon(KEY) == "pass 3"
    scheduler.backoff(KEY, "errors")
    assert delays[-1] == 0  # a success ended the streak
    await scheduler.close()


async def test_a_timed_pass_runs_without_any_trigger() -> None:
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    passes.started.clear()
    scheduler.after(KEY, 0.01)
    await passes.started.wait()
    assert passes.count == 1
    scheduler.after(KEY, 1000.0)
    scheduler.after(KEY, 0.01)  # the earlier deadline wins
    passes.started.clear()
    await passes.started.wait()
    assert passes.count == 2
    scheduler.after(KEY, 0.01)
    scheduler.after(KEY, 1000.0)  # … in either order: a later one never puts off a re-check already due sooner
    passes.started.clear()
    await passes.started.wait()
    assert passes.count == 3
    await scheduler.close()


async def test_forgetting_a_model_ends_its_worker_and_its_waiters() -> None:
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    passes.gate.clear()
    in_flight = asyncio.ensure_future(scheduler.run_soon(KEY))
    await passes.started.wait()
    queued = asyncio.ensure_future(scheduler.run_soon(KEY))
    await turns()
    scheduler.forget(KEY)
    for waiter in (in_flight, queued):
        with pytest.raises(Forgotten):
            await waiter
    assert scheduler.keys == frozenset()
    passes.gate.set()
    await turns()
    assert passes.count == 1


async def test_a_pass_that_finds_the_model_gone_retires_the_worker_unless_asked_again() -> None:
    passes = Passes()
    schedulers: list[Scheduler[str]] = []

    async def gone(key: Key) -> str:
        schedulers[0].retire(key)
        return await passes(key)

    scheduler = Scheduler(gone, lambda n: 1000.0)
    schedulers.append(scheduler)
    passes.gate.clear()
    scheduler.trigger(KEY)
    await passes.started.wait()
    scheduler.trigger(KEY)  # e.g. the model was created again meanwhile: this trigger must not be lost
    passes.gate.set()
    await turns()
    assert passes.count == 2 and scheduler.keys == frozenset()  # the second pass found it gone too, and retired


async def test_a_burst_of_edits_runs_one_pass_at_once_and_holds_the_rest_until_the_edits_stop() -> None:
    """Issue 36: the first edit after a quiet window runs at once; the next ones (and passes for other reasons)
    wait until the edits stop for the window, so a burst is rendered at most twice."""
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    scheduler.edited(KEY, 1000.0)
    await turns()
    assert passes.count == 1  # the leading edge
    for _ in range(19):
        scheduler.edited(KEY, 1000.0)
        scheduler.trigger(KEY)  # a child event meanwhile
        await turns()
    assert passes.count == 1  # held: the trailing pass comes once the edits stop for the window
    scheduler.edited(KEY, 0.0)  # the window ends (a zero window: the next edit is quiet at once)
    await turns()
    assert passes.count == 2
    await scheduler.close()


async def test_an_edit_a_pass_met_before_kopf_delivered_it_holds_at_once() -> None:
    """Issue 49: the pass-side debounce (`settling`) holds the passes after it even when the edit it met is the
    first of its burst (none came through the update handler yet): one pass renders it, once the window ends."""
    passes = Passes()
    scheduler = Scheduler(passes, lambda n: 1000.0)
    scheduler.edited(KEY, 1000.0, settling=True)
    scheduler.trigger(KEY)  # a child event meanwhile
    await turns()
    assert passes.count == 0
    scheduler.edited(KEY, 0.0)  # the window ends
    await turns()
    assert passes.count == 1
    await scheduler.close()
