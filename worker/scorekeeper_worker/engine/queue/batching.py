"""Fair batch formation (`take_batch`, pure): which queued pack units go into the next forward batch.

Open requests are served least recently served first: a request's `turn` is the batch it was last served in, and a
request admitted while batch n runs counts as served just before it, so it goes ahead of the requests batch n serves
and behind those batch n left waiting. Each batch is filled round-robin over requests in that order, one unit per
request per pass, until the token budget is full; a request whose next unit does not fit sits out the rest of the
batch (its units stay in order). Hence a small request sent while a large one runs is in the very next batch, and
a request is only ever overtaken by requests admitted before the batch after its last service was formed: a
stream of small requests cannot starve a large one (under overload its share is bounded by the queue, never zero).
Units are whole sequences or multi-item chunks, so splitting a request across batches never changes its scores."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from scorekeeper_worker.engine.queue.jobs import Job
from scorekeeper_worker.engine.runner.packing import PackUnit

T = TypeVar("T")


def token_batches(units: list[T], max_tokens: int, size: Callable[[T], int]) -> list[list[T]]:
    """One request's units (of `size` tokens each) in forwards of at most `max_tokens` tokens, in order: the
    batches `take_batch` forms for a request alone (a unit larger than the budget runs alone). Start-up's probes
    and benchmarks run requests so."""
    batches: list[list[T]] = [[]]
    tokens = 0
    for unit in units:
        if batches[-1] and tokens + size(unit) > max_tokens:
            batches.append([])
            tokens = 0
        batches[-1].append(unit)
        tokens += size(unit)
    return batches


@dataclass(eq=False)
class OpenRequest:
    """A request admitted to the scheduler: its job and the units not yet taken into a batch."""

    job: Job
    units: deque[PackUnit]
    queued_tokens: int  # tokens of `units`
    size: str  # one of metrics.SIZE_CLASSES
    turn: int = 0  # lower goes first (see the module docstring)
    started: bool = False  # whether any of its units has been taken into a batch
    closed: bool = False  # finished, failed or cancelled: no more work or results


def arrival_turn(batches_formed: int) -> int:
    """The turn of a request admitted after `batches_formed` batches: just before those the last batch served."""
    return 2 * batches_formed - 1


def take_batch(waiting: list[OpenRequest], max_tokens: int,
               batches_formed: int) -> tuple[list[tuple[OpenRequest, PackUnit]], list[OpenRequest]]:
    """Fill one batch from `waiting` (ordered by turn, every request with queued units). Returns the batch and the
    new waiting order: requests left out keep their place, served ones with units left go to the back. The first
    unit is always taken, even one larger than the budget (it then runs alone)."""
    served_turn = 2 * (batches_formed + 1)
    batch: list[tuple[OpenRequest, PackUnit]] = []
    tokens = 0
    served: list[OpenRequest] = []
    active = list(waiting)
    while active:
        next_pass = []
        for request in active:
            unit = request.units[0]
            if batch and tokens + unit.num_tokens > max_tokens:
                continue  # sits out the rest of this batch
            request.units.popleft()
            request.queued_tokens -= unit.num_tokens
            batch.append((request, unit))
            tokens += unit.num_tokens
            if request.turn != served_turn:
                request.turn = served_turn
                served.append(request)
            if request.units:
                next_pass.append(request)
        active = next_pass
    left = [request for request in waiting if request.turn != served_turn]
    return batch, left + [request for request in served if request.units]
