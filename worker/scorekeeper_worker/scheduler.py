"""Continuous batching: a bounded token queue drained by the one thread that owns the model.

Requests are admitted while the queued tokens stay under `max_queue_tokens` (else `Overloaded` → 429). The model
thread takes pack units in arrival order until the next one would exceed `max_batch_tokens`, so one batch mixes
requests, and a large request's units spread over consecutive batches."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from scorekeeper_worker.errors import Overloaded
from scorekeeper_worker.executor import BatchStats, Executor
from scorekeeper_worker.jobs import ScoreJob
from scorekeeper_worker.metrics import WorkerMetrics
from scorekeeper_worker.packing import PackUnit

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, executor: Executor, max_batch_tokens: int, max_queue_tokens: int,
                 metrics: WorkerMetrics) -> None:
        self.executor = executor
        self.max_batch_tokens = max_batch_tokens
        self.max_queue_tokens = max_queue_tokens
        self.metrics = metrics
        self._pending: deque[tuple[ScoreJob, PackUnit]] = deque()
        self._queued_tokens = 0
        self._open_jobs = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="scorekeeper-model", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: ScoreJob, units: list[PackUnit]) -> None:
        tokens = sum(u.num_tokens for u in units)
        with self._cond:
            if self._stopping:
                raise Overloaded("shutting down")
            if self._queued_tokens and self._queued_tokens + tokens > self.max_queue_tokens:
                raise Overloaded(f"queue holds {self._queued_tokens} tokens; limit {self.max_queue_tokens}")
            job.remaining = sum(len(u.pools) for u in units)
            self._pending.extend((job, unit) for unit in units)
            self._queued_tokens += tokens
            self._open_jobs += 1
            self._publish()
            self._cond.notify()

    def stop(self, timeout: float) -> None:
        """Refuse new work, let queued work finish (drain), then end the model thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def _publish(self) -> None:
        self.metrics.queue_tokens.set(self._queued_tokens)
        self.metrics.queue_depth.set(self._open_jobs)

    def _next_batch(self) -> list[tuple[ScoreJob, PackUnit]]:
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            batch: list[tuple[ScoreJob, PackUnit]] = []
            tokens = 0
            while self._pending:
                job, unit = self._pending[0]
                if batch and tokens + unit.num_tokens > self.max_batch_tokens:
                    break
                self._pending.popleft()
                self._queued_tokens -= unit.num_tokens
                if job.closed:  # failed earlier: drop the rest of its work
                    continue
                if job.cancelled:  # the client went away: skip its remaining work
                    job.remaining -= len(unit.pools)
                    if job.remaining == 0:
                        job.closed = True
                        self._open_jobs -= 1
                    continue
                batch.append((job, unit))
                tokens += unit.num_tokens
            self._publish()
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                if self._stopping:
                    return
                continue
            now = time.perf_counter()
            for job, _ in batch:
                if job.started_at is None:
                    job.started_at = now
                    self.metrics.stage_seconds.labels("queue").observe(now - job.enqueued_at)
            try:
                jobs, stats = self.executor.run([unit for _, unit in batch])
            except Exception as error:  # a failing batch fails its requests, never the server
                log.exception("batch of %d units failed", len(batch))
                failed = list({id(job): job for job, _ in batch}.values())
                for job in failed:
                    job.fail(error)
                self._close(len(failed))
                continue
            self._observe(stats, len(jobs))
            finished = [job for job in jobs if job.remaining == 0]
            for job in finished:
                job.finish()
            self._close(len(finished))

    def _close(self, jobs: int) -> None:
        with self._cond:
            self._open_jobs -= jobs
            self._publish()

    def _observe(self, stats: BatchStats, requests: int) -> None:
        m = self.metrics
        m.batch_requests.observe(requests)
        m.batch_sequences.observe(stats.sequences)
        m.batch_tokens.observe(stats.tokens)
        m.padding_tokens.inc(stats.padding_tokens)
        m.stage_seconds.labels("forward").observe(stats.inputs_seconds + stats.forward_seconds)
        m.stage_seconds.labels("scoring").observe(stats.scoring_seconds)
        m.graph_runs.labels(stats.graph_path, stats.graph_bucket).inc()
        if stats.copies.vectors:
            m.hidden_copy_bytes.inc(stats.copies.bytes)
            m.hidden_copy_vectors.inc(stats.copies.vectors)
            m.hidden_copy_seconds.observe(stats.copies.seconds)
