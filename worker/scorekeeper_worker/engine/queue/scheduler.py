"""Continuous batching: a bounded token queue drained by the one thread that owns the model.

Admission: a request is admitted while the queued tokens stay within `max_queue_tokens`, or into an empty queue
(every request is already under `--max-request-tokens`, checked when it is planned); else `Overloaded` → 429.
Batches are filled fairly across open requests (`take_batch`, engine/queue/batching.py), so one request never holds
the model for others. A request that is cancelled (client gone, timeout) or that failed loses its queued units at
once; units already in a running batch finish and their rows are discarded.

A forward that raises fails only the request behind it (`engine/queue/isolation.py`: the batch is split by request
until it is found). An error that poisons the device fails every open request with `DeviceLost` (503, retry
elsewhere), refuses new ones, ends the model thread and tells `on_device_lost` (the service: not ready, exit).

Two batches are in flight at once on a GPU (`depth`): batch N+1 is formed, packed, copied and enqueued while batch N
runs on the device, then N is finished (its results handed to its jobs, its complete requests answered) as soon as it
completes, so the device always has the next batch queued behind the one it runs. N+1 is formed just before the device
is expected to be done with N (engine/queue/batching.py), so that requests arriving meanwhile join it. With nothing
queued behind a batch, it is finished at once: a lightly loaded worker answers as soon as its batch is done. On CPU a
batch's work is done when it is launched, so batches simply run one after the other."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from scorekeeper_worker.base.errors import DeviceLost, Overloaded
from scorekeeper_worker.base.metrics import WorkerMetrics, size_class
from scorekeeper_worker.engine.queue.batching import LaunchTiming, OpenRequest, arrival_turn, take_batch
from scorekeeper_worker.engine.queue.isolation import DevicePoisoned, run_isolated
from scorekeeper_worker.engine.queue.jobs import Job
from scorekeeper_worker.engine.runner.executor import BatchStats, Executor, Launched
from scorekeeper_worker.engine.runner.packing import PackUnit

log = logging.getLogger(__name__)
# While the next batch waits to be formed, how often to look whether the batch on the device is done already (the
# device's expected time is an estimate; a device that finished early should not wait for it).
POLL_SECONDS = 0.001

# Sees every batch (job and unit per entry) on the model thread just before it runs. A test hook: observing batch
# composition, or holding the model thread so that a test sets up the queue deterministically, never by timing.
BatchObserver = Callable[[list[tuple[Job, PackUnit]]], None]


class Plan(Protocol):
    """What the queue needs of a request's plan: its units (pools keyed by the job's slots) and their tokens."""

    units: list[PackUnit]
    prompt_tokens: int


Batch = list[tuple[OpenRequest, PackUnit]]


@dataclass
class Flight:
    """A batch launched and not yet finished."""

    batch: Batch
    requests: list[OpenRequest]
    launched: Launched


class Scheduler:
    def __init__(self, executor: Executor, max_batch_tokens: int, max_queue_tokens: int,
                 metrics: WorkerMetrics, depth: int = 2) -> None:
        self.executor = executor
        self.depth = depth  # batches in flight at most (1: each batch is finished before the next is formed)
        self.timing = LaunchTiming()
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

    def _next_batch(self, oldest: Flight | None) -> Batch:
        """The next batch; empty once stopping and drained. With batches in flight (`oldest` the first): formed just
        in time (engine/queue/batching.py), or once `oldest` is done, and empty when nothing is queued by then."""
        with self._cond:
            while oldest is None and not self._waiting and not self._stopping:
                self._cond.wait()
            form_at = self.timing.form_at()
            while oldest is not None and not self._stopping and self._queued_tokens < self.max_batch_tokens:
                left = form_at - time.perf_counter()
                if left <= 0 or oldest.launched.done():
                    break
                self._cond.wait(min(left, POLL_SECONDS))
            if not self._waiting:
                return []
            batch, self._waiting = take_batch(self._waiting, self.max_batch_tokens, self._formed)
            self._formed += 1
            self._queued_tokens -= sum(unit.num_tokens for _, unit in batch)
            self._publish()
            return batch

    def _loop(self) -> None:
        flights: deque[Flight] = deque()
        while self.lost is None:
            batch = self._next_batch(flights[0] if flights else None)
            if not batch and not flights:
                return  # stopping, and drained
            if batch:
                self._launch(batch, flights)
            # The oldest batch is finished once nothing can go ahead of it: nothing was queued, the pipeline is full,
            # or it is done anyway.
            while flights and (not batch or len(flights) >= self.depth or flights[0].launched.done()):
                self._finish(flights.popleft(), flights)

    def _launch(self, batch: Batch, flights: deque[Flight]) -> None:
        """Pack and enqueue a batch behind those in flight. A batch that fails before anything of it is enqueued is
        run again in parts, after the batches in flight are finished."""
        requests = list({id(request): request for request, _ in batch}.values())
        self._started(requests)
        if self.observer is not None:
            self.observer(self._jobs(batch))
        started = time.perf_counter()
        try:
            launched = self.executor.launch(self._jobs(batch))
            now = time.perf_counter()
            self.timing.launched(now, launched.forward_tokens, now - started)
            flights.append(Flight(batch, requests, launched))
        except Exception as error:  # one request's error (or the device's): found by splitting the batch
            while flights and self.lost is None:
                self._finish(flights.popleft(), flights)
            if self.lost is None:
                self._isolate(batch, requests, error, [request.job.remaining for request in requests], flights)
            else:  # the device was lost by a batch in flight: this one's requests fail with it
                self._fail_all(self.lost, requests)

    def _finish(self, flight: Flight, flights: deque[Flight]) -> None:
        """Wait for a batch, hand its jobs their rows and answer its complete requests."""
        before = [request.job.remaining for request in flight.requests]
        try:
            stats = self.executor.finish(flight.launched)
        except Exception as error:  # a device error surfacing at the wait, or a job's error taking its rows
            self._isolate(flight.batch, flight.requests, error, before, flights)
            return
        self.timing.finished(time.perf_counter(), flight.launched.forward_tokens, stats.device_seconds,
                             sum(f.launched.forward_tokens for f in flights))
        self._complete(flight.requests, [stats], [])

    def _isolate(self, batch: Batch, requests: list[OpenRequest], error: Exception, before: list[int],
                 flights: deque[Flight]) -> None:
        """After `batch` raised `error` (its jobs had `before` rows to come): run it again in parts to find the
        request behind it. An error that poisons the device fails every open request, those in flight included."""
        try:
            outcome = run_isolated(self._run, batch, lambda request: request.job, error, before)
        except DevicePoisoned as poisoned:
            self._lose_device(poisoned, [*requests, *(r for flight in flights for r in flight.requests)])
            flights.clear()
            return
        self._complete(requests, outcome.stats, outcome.failed)

    def _complete(self, requests: list[OpenRequest], ran: list[BatchStats],
                  failed: list[tuple[OpenRequest, Exception]]) -> None:
        """After a batch's rows were absorbed: fail the requests behind its errors, answer the complete ones."""
        started = time.perf_counter()
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
        respond = time.perf_counter() - started
        for stats in ran:
            self._observe(stats, len(requests), respond)

    @staticmethod
    def _jobs(batch: Batch) -> list[tuple[Job, PackUnit]]:
        return [(request.job, unit) for request, unit in batch]

    def _run(self, batch: Batch) -> BatchStats:
        return self.executor.run(self._jobs(batch))

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
        self._fail_all(lost, running)
        if self.on_device_lost is not None:
            self.on_device_lost(lost)

    def _fail_all(self, lost: DeviceLost, running: list[OpenRequest]) -> None:
        """Fail `running` and every queued request with `lost` (closing each once)."""
        with self._cond:
            for request in [*running, *self._waiting]:
                if not request.closed:
                    request.job.fail(lost)
                self._close(request)

    def _started(self, requests: list[OpenRequest]) -> None:
        now = time.perf_counter()
        for request in requests:
            if not request.started:
                request.started = True
                request.job.started_at = now
                waited = now - request.job.enqueued_at
                self.metrics.stage_seconds.labels("queue").observe(waited)
                self.metrics.queue_wait_seconds.labels(request.size).observe(waited)

    def _observe(self, stats: BatchStats, requests: int, respond_seconds: float) -> None:
        m = self.metrics
        m.batch_requests.observe(requests)
        m.batch_sequences.observe(stats.sequences)
        m.batch_tokens.observe(stats.tokens)
        m.padding_tokens.inc(stats.padding_tokens)
        m.stage_seconds.labels("forward").observe(stats.device_seconds)
        m.stage_seconds.labels("scoring").observe(stats.heads_seconds + stats.copy_out_seconds)
        steps = m.batch_step_seconds
        for step, seconds in (("pack", stats.pack_seconds), ("copy_in", stats.copy_in_seconds),
                              ("device", stats.device_seconds), ("heads", stats.heads_seconds),
                              ("copy_out", stats.copy_out_seconds), ("respond", respond_seconds)):
            steps.labels(step).observe(seconds)
        m.device_busy_seconds.inc(stats.device_seconds)
        m.graph_runs.labels(stats.graph_path, stats.graph_bucket).inc()
        if stats.cpu_share is not None:
            m.model_thread_cpu_share.observe(stats.cpu_share)
        if stats.copies.vectors:
            m.hidden_copy_bytes.inc(stats.copies.bytes)
            m.hidden_copy_vectors.inc(stats.copies.vectors)
            m.hidden_copy_seconds.observe(stats.copies.seconds)
