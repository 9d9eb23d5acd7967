"""Batch formation (pure): which queued pack units go into the next forward batch (`take_batch`), and when to form it
while another runs on the device (`LaunchTiming`).

Open requests are served least recently served first: a request's `turn` is the batch it was last served in, and a
request admitted while batch n runs counts as served just before it, so it goes ahead of the requests batch n serves
and behind those batch n left waiting. Each batch is filled round-robin over requests in that order, one unit per
request per pass, until the token budget is full; a request whose next unit does not fit sits out the rest of the
batch (its units stay in order). Hence a small request sent while a large one runs is in the very next batch, and
a request is only ever overtaken by requests admitted before the batch after its last service was formed: a
stream of small requests cannot starve a large one (under overload its share is bounded by the queue, never zero).
Units are whole sequences or multi-item chunks, so splitting a request across batches never changes its scores.

When. Forming batch N+1 the moment N is launched would take only the requests queued by then: under a steady stream of
requests that is one request per batch, and the host pays its per-batch cost (packing, the heads, the GIL) for each.
A request that arrives while N runs waits for N either way, so N+1 is formed just in time instead: when the device
is expected to finish the work in flight, less the time the host needs to launch a batch. Requests that arrive
meanwhile join it, and the device still finds N+1 queued behind N. A full batch's worth of queued tokens is formed at
once (nothing more would fit).

Expected times come from what the device took: an average of its time per forward token (a bucket's tokens, or an
eager batch's), taken a little short so that a batch is launched early rather than late; until the first batch has
finished there is no estimate, and the next batch is formed at once."""

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


SMOOTHING = 0.2  # weight of the newest measurement in the running averages
EARLY = 0.9  # the device's expected time is taken this much short: launching early costs nothing, late idles it
MARGIN_SECONDS = 0.001  # on top of twice the host's launch time: the model thread may wait for the GIL to wake


@dataclass
class LaunchTiming:
    seconds_per_token: float = 0.0  # the device's time per forward token, averaged
    launch_seconds: float = 0.0  # the host's time to launch a batch, averaged
    device_free_at: float = 0.0  # when the work in flight is expected to be done

    def _average(self, current: float, measured: float) -> float:
        return measured if current == 0.0 else (1 - SMOOTHING) * current + SMOOTHING * measured

    def expected(self, tokens: int) -> float:
        """The device's expected time for a forward over `tokens` tokens."""
        return EARLY * self.seconds_per_token * tokens

    def launched(self, now: float, tokens: int, launch_seconds: float) -> None:
        """A batch of `tokens` forward tokens was enqueued at `now`, after `launch_seconds` on the host."""
        self.launch_seconds = self._average(self.launch_seconds, launch_seconds)
        self.device_free_at = max(now, self.device_free_at) + self.expected(tokens)

    def finished(self, now: float, tokens: int, device_seconds: float, tokens_in_flight: int) -> None:
        """A batch of `tokens` forward tokens took `device_seconds`; `tokens_in_flight` are still queued behind it."""
        if tokens > 0:
            self.seconds_per_token = self._average(self.seconds_per_token, device_seconds / tokens)
        self.device_free_at = max(self.device_free_at, now + self.expected(tokens_in_flight))

    def form_at(self) -> float:
        """When to form the next batch (now or earlier: at once)."""
        return self.device_free_at - 2 * self.launch_seconds - MARGIN_SECONDS
