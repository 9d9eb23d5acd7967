"""One failing request fails alone: a batch whose forward raises is split by request and retried, halving the part
that fails, until the request behind the error is found (log2 of the batch's requests extra forwards per failing
request; nothing is retried while batches succeed). That request gets the error; every other request gets the rows
of a forward that succeeded. An error that poisons the device (engine/runner/device_health.py) is never retried: no
later forward on that device can succeed.

A retried job absorbs the rows of its units again: `absorb` writes each slot's result (never adds to it), and the
count of rows still to come (`remaining`) is restored to what it was before the failed attempt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from scorekeeper_worker.engine.runner.device_health import poisons_device
from scorekeeper_worker.engine.runner.executor import BatchStats
from scorekeeper_worker.engine.runner.packing import PackUnit


class Counted(Protocol):
    remaining: int


Owner = TypeVar("Owner")


class DevicePoisoned(Exception):
    """The forward raised an error that leaves the device unusable (the original is its __cause__)."""


@dataclass
class Outcome(Generic[Owner]):
    stats: list[BatchStats] = field(default_factory=list)  # one per forward that succeeded
    failed: list[tuple[Owner, Exception]] = field(default_factory=list)  # each failing owner, with its error


def run_isolated(run: Callable[[list[tuple[Owner, PackUnit]]], BatchStats], batch: list[tuple[Owner, PackUnit]],
                 job_of: Callable[[Owner], Counted]) -> Outcome[Owner]:
    """Run `batch` (owner, unit) through `run`, splitting it by owner where it raises; raises DevicePoisoned."""
    outcome: Outcome[Owner] = Outcome()
    _attempt(run, batch, job_of, outcome)
    return outcome


def _attempt(run: Callable[[list[tuple[Owner, PackUnit]]], BatchStats], batch: list[tuple[Owner, PackUnit]],
             job_of: Callable[[Owner], Counted], outcome: Outcome[Owner]) -> None:
    owners = list({id(owner): owner for owner, _ in batch}.values())
    before = [job_of(owner).remaining for owner in owners]
    try:
        outcome.stats.append(run(batch))
        return
    except Exception as error:  # any error of any request: found below, never the whole batch's
        if poisons_device(error):
            raise DevicePoisoned(str(error)) from error
        for owner, remaining in zip(owners, before, strict=True):
            job_of(owner).remaining = remaining
        if len(owners) == 1:
            outcome.failed.append((owners[0], error))
            return
    first = {id(owner) for owner in owners[:len(owners) // 2]}
    _attempt(run, [pair for pair in batch if id(pair[0]) in first], job_of, outcome)
    _attempt(run, [pair for pair in batch if id(pair[0]) not in first], job_of, outcome)
