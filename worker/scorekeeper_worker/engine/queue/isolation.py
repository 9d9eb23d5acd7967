"""One failing request fails alone: a batch whose forward raises is split by request and retried, halving the part
that fails, until the request behind the error is found (log2 of the batch's requests extra forwards per failing
request; nothing is retried while batches succeed). That request gets the error; every other request gets the rows
of a forward that succeeded. An error that poisons the device (engine/runner/device_health.py) is never retried: no
later forward on that device can succeed.

The scheduler runs the whole batch itself and calls in only once it has raised (a batch that succeeds never enters
this module). A retried job absorbs the rows of its units again: `absorb` writes each slot's result (never adds to
it), and the count of rows still to come (`remaining`) is restored to what it was before the failed attempt."""

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
                 job_of: Callable[[Owner], Counted], error: Exception, before: list[int]) -> Outcome[Owner]:
    """After `run(batch)` raised `error` (each owner's job had `before` rows to come, owners in batch order): find
    the owners behind it by running parts of the batch again; raises DevicePoisoned. Called only once a batch has
    failed, so that a batch that succeeds never enters this module."""
    outcome: Outcome[Owner] = Outcome()
    _split(run, batch, job_of, outcome, error, before)
    return outcome


def _owners(batch: list[tuple[Owner, PackUnit]]) -> list[Owner]:
    return list({id(owner): owner for owner, _ in batch}.values())


def _split(run: Callable[[list[tuple[Owner, PackUnit]]], BatchStats], batch: list[tuple[Owner, PackUnit]],
           job_of: Callable[[Owner], Counted], outcome: Outcome[Owner], error: Exception, before: list[int]) -> None:
    """`batch` failed with `error`: restore its jobs' counts, then fail its one owner, or try each half."""
    if poisons_device(error):
        raise DevicePoisoned(str(error)) from error
    owners = _owners(batch)
    for owner, remaining in zip(owners, before, strict=True):
        job_of(owner).remaining = remaining
    if len(owners) == 1:
        outcome.failed.append((owners[0], error))
        return
    first = {id(owner) for owner in owners[:len(owners) // 2]}
    halves = ([pair for pair in batch if id(pair[0]) in first], [pair for pair in batch if id(pair[0]) not in first])
    for part in halves:
        counts = [job_of(owner).remaining for owner in _owners(part)]
        try:
            outcome.stats.append(run(part))
        except Exception as failed:  # any error of any request: narrowed down, never the whole batch's
            _split(run, part, job_of, outcome, failed, counts)
