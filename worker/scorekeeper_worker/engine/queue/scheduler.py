"""Continuous batching: a bounded token queue drained by the one thread that owns the model.

Admission: a request is admitted while the queued tokens stay within `max_queue_tokens`, or into an empty queue
(every request is already under `--max-request-tokens`, checked when it is planned); else `Overloaded` → 429.
Batches are filled fairly across open requests (`take_batch`, below), so one request never holds the model
for others. A request that is cancelled (client gone, timeout) or that failed loses its queued units at once; units
already in the running batch finish and their rows are discarded.

A forward that raises fails only the request behind it (`engine/queue/isolation.py`: the batch is split by request
until it is found). An error that poisons the device fails every open request with `DeviceLost` (503, retry
elsewhere), refuses new ones, ends the model thread and tells `on_device_lost` (the service: not ready, exit).

Fair batch formation (`take_batch`, pure): which queued pack units go into the next forward batch.

Open requests are served least recently served first: a request's `turn` is the batch it was last served in, and a
request admitted while batch n runs counts as served just before it, so it goes ahead of the requests batch n serves
and behind those batch n left waiting. Each batch is filled round-robin over requests in that order, one unit per
request per pass, until the token budget is full; a request whose next unit does not fit sits out the rest of the
batch (its units stay in order). Hence a small request sent while a large one runs is in the very next batch, and
a request is only ever overtaken by requests admitted before the batch after its last service was formed: a
stream of small requests cannot starve a large one (under overload its share is bounded by the queue, never zero).
Units are whole sequences or multi-item chunks, so splitting a request across batches never changes its scores."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from scorekeeper_worker.base.errors import DeviceLost, Overloaded
from scorekeeper_worker.base.metrics import WorkerMetrics, size_class
from scorekeeper_worker.engine.queue.isolation import DevicePoisoned, run_isolated
from scorekeeper_worker.engine.queue.jobs import Job
from scorekeeper_worker.engine.runner.executor import BatchStats, Executor
from scorekeeper_worker.engine.runner.packing import PackUnit

log = logging.getLogger(__name__)
T = TypeVar("T")

# Sees every batch (job and unit per entry) on the model thread just before it runs. A test hook: observing batch
# composition, or holding the model thread so that a test sets up the queue deterministically, never by timing.
BatchObserver = Callable[[list[tuple[Job, PackUnit]]], None]


class Plan(Protocol):
    """What the queue needs of a request's plan: its units (pools keyed by the job's slots) and their tokens."""

    units: list[PackUnit]
    prompt_tokens: int


class Scheduler:
    def __init__(self, executor: Executor, max_batch_tokens: int, max_queue_tokens: int,
                 metrics: WorkerMetrics) -> None:
        self.executor = executor
        self.max_batch_tokens = max_batch_tokens
        self.max_queue_tokens = max_queue_tokens
        self.metrics = metrics
        self.observer: BatchObserver | None = None
        self.on_device_lost: Callable[[DeviceLost], None] | None = None  # called once, on the model thread
        self.lost: DeviceLost | None = None  # set when the device is poisoned: every request from then on fails
        self._waiting: list[OpenRequest] = []  # requests with queued units, in turn order
        self._queued_tokens = 0
        self._open = 0  # admitted and not finished
        self._formed = 0  # batches formed so far
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="scorekeeper-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def open_requests(self) -> int:
        """Requests admitted and not finished (queued or running)."""
        return self._open

    @property
    def queued_tokens(self) -> int:
        """Tokens admitted and not yet taken into a batch."""
        return self._queued_tokens

    def submit(self, job: Job, plan: Plan) -> OpenRequest:
        """Admit a request's planned units with the job that absorbs their rows (429 when the queue is full); the
        handle cancels it. Constant work besides copying the unit list: it runs on the event loop."""
        tokens = plan.prompt_tokens
        request = OpenRequest(job, deque(plan.units), tokens, size_class(tokens, self.max_batch_tokens))
        with self._cond:
            if self.lost is not None:
                raise self.lost
            if self._stopping:
                raise Overloaded("shutting down")
            if self._queued_tokens and self._queued_tokens + tokens > self.max_queue_tokens:
                raise Overloaded(f"queue holds {self._queued_tokens} tokens; limit {self.max_queue_tokens}")
            job.enqueued_at = time.perf_counter()
            job.remaining = sum(len(unit.pools) for unit in plan.units)
            request.turn = arrival_turn(self._formed)
            bisect.insort(self._waiting, request, key=lambda r: r.turn)
            self._queued_tokens += request.queued_tokens
            self._open += 1
            self._publish()
            self._cond.notify()
        return request

    def cancel(self, request: OpenRequest) -> None:
        """Drop a request's queued work now (its client went away, or it timed out)."""
        with self._cond:
            self._close(request)

    def stop(self, timeout: float) -> None:
        """Refuse new work, let queued work finish (drain), then end the model thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def _close(self, request: OpenRequest) -> None:
        """Forget a finished, failed or cancelled request (the lock is held; closing twice is a no-op)."""
        if request.closed:
            return
        request.closed = True
        if request.units:
            self._waiting.remove(request)
            self._queued_tokens -= request.queued_tokens
            request.units.clear()
            request.queued_tokens = 0
        self._open -= 1
        self._publish()

    def _publish(self) -> None:
        self.metrics.queue_tokens.set(self._queued_tokens)
        self.metrics.queue_depth.set(self._open)

    def _next_batch(self) -> list[tuple[OpenRequest, PackUnit]]:
        """The next batch; empty once stopping and drained."""
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if not self._waiting:
                return []
            batch, self._waiting = take_batch(self._waiting, self.max_batch_tokens, self._formed)
            self._formed += 1
            self._queued_tokens -= sum(unit.num_tokens for _, unit in batch)
            self._publish()
            return batch

    def _loop(self) -> None:
        while batch := self._next_batch():
            requests = list({id(request): request for request, _ in batch}.values())
            self._started(requests)
            if self.observer is not None:
                self.observer([(request.job, unit) for request, unit in batch])
            before = [request.job.remaining for request in requests]
            failed: list[tuple[OpenRequest, Exception]] = []
            try:
                ran = [self._run(batch)]
            except Exception as error:  # one request's error (or the device's): found by splitting the batch
                try:
                    outcome = run_isolated(self._run, batch, lambda request: request.job, error, before)
                except DevicePoisoned as poisoned:
                    self._lose_device(poisoned, requests)
                    return
                ran, failed = outcome.stats, outcome.failed
            with self._cond:
                for request, error in failed:  # that request alone: its error, and its queued units dropped
                    log.error("request failed in the forward (%s); the other %d request(s) of its batch are served",
                              type(error).__name__, len(requests) - 1, exc_info=error)
                    self.metrics.isolated_failures.labels(type(error).__name__).inc()
                    if not request.closed:
                        request.job.fail(error)
                    self._close(request)
                for request in requests:
                    if request.job.remaining == 0 and not request.closed:
                        request.job.finish()
                        self._close(request)
            for stats in ran:
                self._observe(stats, len(requests))

    def _run(self, batch: list[tuple[OpenRequest, PackUnit]]) -> BatchStats:
        return self.executor.run([(request.job, unit) for request, unit in batch])

    def _lose_device(self, poisoned: DevicePoisoned, running: list[OpenRequest]) -> None:
        """The device is unusable: every open request (running or queued) and every later one gets DeviceLost."""
        cause = poisoned.__cause__ or poisoned
        log.critical("the device is unusable after a forward failed (%s: %s); failing every request and stopping",
                     type(cause).__name__, cause, exc_info=cause)
        lost = DeviceLost(f"the worker's accelerator failed ({type(cause).__name__}) and the worker is restarting; "
                          "retry the request")
        self.metrics.isolated_failures.labels("device_lost").inc()
        with self._cond:
            self.lost = lost
            self._stopping = True
            for request in [*running, *self._waiting]:
                if not request.closed:
                    request.job.fail(lost)
                self._close(request)
        if self.on_device_lost is not None:
            self.on_device_lost(lost)

    def _started(self, requests: list[OpenRequest]) -> None:
        now = time.perf_counter()
        for request in requests:
            if not request.started:
                request.started = True
                request.job.started_at = now
                waited = now - request.job.enqueued_at
                self.metrics.stage_seconds.labels("queue").observe(waited)
                self.metrics.queue_wait_seconds.labels(request.size).observe(waited)

    def _observe(self, stats: BatchStats, requests: int) -> None:
        m = self.metrics
        m.batch_requests.observe(requests)
        m.batch_sequences.observe(stats.sequences)
        m.batch_tokens.observe(stats.tokens)
        m.padding_tokens.inc(stats.padding_tokens)
        m.stage_seconds.labels("forward").observe(stats.inputs_seconds + stats.forward_seconds)
        m.stage_seconds.labels("scoring").observe(stats.scoring_seconds)
        m.graph_runs.labels(stats.graph_path, stats.graph_bucket).inc()
        if stats.cpu_share is not None:
            m.model_thread_cpu_share.observe(stats.cpu_share)
        if stats.copies.vectors:
            m.hidden_copy_bytes.inc(stats.copies.bytes)
            m.hidden_copy_vectors.inc(stats.copies.vectors)
            m.hidden_copy_seconds.observe(stats.copies.seconds)


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
