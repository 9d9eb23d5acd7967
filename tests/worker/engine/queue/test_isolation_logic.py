"""The bisection by request (engine/queue/isolation.py) and the device-poison test (engine/runner/device_health.py),
without a model: a fake forward that raises while a chosen owner is in its batch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scorekeeper_worker.engine.queue.isolation import DevicePoisoned, run_isolated
from scorekeeper_worker.engine.runner.device_health import poisons_device
from scorekeeper_worker.engine.runner.executor import BatchStats
from scorekeeper_worker.engine.runner.packing import PackUnit


@dataclass(eq=False)
class FakeJob:
    name: int
    remaining: int = 2


def _forward(bad: set[int], error: Exception, calls: list[list[int]]):  # type: ignore[no-untyped-def]
    def run(batch: list[tuple[FakeJob, PackUnit]]) -> BatchStats:
        calls.append(sorted({job.name for job, _ in batch}))
        for job, _ in batch:  # absorbs before it fails, as a real job may: restored before the retry
            job.remaining -= 1
        if any(job.name in bad for job, _ in batch):
            raise error
        return BatchStats(len(batch), 0, 0)
    return run


def _isolated(run, batch: list[tuple[FakeJob, PackUnit]]):  # type: ignore[no-untyped-def]
    """As the scheduler does: the whole batch first, then (only if it raised) the search."""
    jobs = list({id(job): job for job, _ in batch}.values())
    before = [job.remaining for job in jobs]
    try:
        return [run(batch)], []
    except Exception as error:
        outcome = run_isolated(run, batch, lambda job: job, error, before)
        return outcome.stats, outcome.failed


def _batch(n: int) -> tuple[list[FakeJob], list[tuple[FakeJob, PackUnit]]]:
    jobs = [FakeJob(i) for i in range(n)]
    return jobs, [(job, PackUnit([1, 2])) for job in jobs for _ in range(2)]  # two units per job


def test_one_bad_owner_of_32_is_found_by_bisection() -> None:
    jobs, batch = _batch(32)
    calls: list[list[int]] = []
    _, failed = _isolated(_forward({13}, IndexError("index out of range"), calls), batch)
    assert [(job.name, type(error)) for job, error in failed] == [(13, IndexError)]
    assert all(job.remaining == 0 for job in jobs if job.name != 13)  # each good job absorbed exactly once
    assert len(calls) == 1 + 2 * 5  # the batch, then two halves per level down to one request: log2(32) levels


def test_two_bad_owners_each_fail_alone() -> None:
    _, batch = _batch(8)
    stats, failed = _isolated(_forward({0, 7}, ValueError("x"), []), batch)
    assert sorted(job.name for job, _ in failed) == [0, 7]
    assert sum(s.sequences for s in stats) == 12  # the six good jobs' units, once each


def test_a_device_poisoning_error_is_never_retried() -> None:
    _, batch = _batch(4)
    calls: list[list[int]] = []
    cuda = RuntimeError("CUDA error: device-side assert triggered")
    with pytest.raises(DevicePoisoned) as raised:
        _isolated(_forward({2}, cuda, calls), batch)
    assert raised.value.__cause__ is cuda and len(calls) == 1


@pytest.mark.parametrize(("error", "poisons"), [
    (RuntimeError("CUDA error: device-side assert triggered"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
    (IndexError("index out of range in self"), False),
    (RuntimeError("shape mismatch"), False),
])
def test_poisons_device(error: Exception, poisons: bool) -> None:
    assert poisons_device(error) is poisons
    wrapped = ValueError("wrapped")
    wrapped.__cause__ = error
    assert poisons_device(wrapped) is poisons
