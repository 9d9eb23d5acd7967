"""The scoring service: one request from its checks to its scored rows, on the model that start-up proved
(`serving/startup/load.py` hands it a `Served`: what start-up leaves for the per-request path). The event loop does
O(1) work per request: checks, tokenization and planning run in a worker thread, the forward on the model thread.
`run_job` is the one way a request's job (scores or decisions) goes through the queue."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.base.errors import DeviceLost, NonFiniteScore, NotReady, Timeout
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.engine.queue.jobs import JobResult, Pending
from scorekeeper_worker.engine.queue.scheduler import Plan, Scheduler
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.prepare import Limits, Prepared, check, prepare

log = logging.getLogger(__name__)
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Served:
    """The model, proven by the self-check; the queue its model thread drains; the decision template (causal LMs:
    /v1/decisions and /v1/systemone)."""

    model: ScoringModel
    scheduler: Scheduler
    decision_template: DecisionTemplate | None = None


# Numbers a result may hold for its finite check to run on the event loop (well under a millisecond); larger ones
# (pooled vectors, embeddings) are checked in a worker thread, so the loop's work per request stays bounded.
FINITE_CHECK_ON_LOOP = 4096


def _all_finite(rows: Sequence[Sequence[float]]) -> bool:
    return all(math.isfinite(value) for row in rows for value in row)


async def run_job(served: Served, job: Pending[R], plan: Plan, values: Callable[[R], Sequence[Sequence[float]]],
                  what: str) -> R:
    """Queue the job's plan and await its result; a request cancelled, timed out or failed leaves nothing queued.
    Never a NaN or inf in a 200: `values` gives every number the response carries (scores, pooled vectors,
    probabilities); the heads keep finite logits finite, this catches a model that overflowed."""
    queued = served.scheduler.submit(job, plan)
    try:
        result = await job.future
    except BaseException:
        served.scheduler.cancel(queued)
        raise
    rows = values(result)
    small = sum(map(len, rows)) <= FINITE_CHECK_ON_LOOP
    if not (_all_finite(rows) if small else await asyncio.to_thread(_all_finite, rows)):
        dtype = str(served.model.dtype).removeprefix("torch.")
        raise NonFiniteScore(f"the model produced a non-finite score for this request (numeric overflow in {dtype}); "
                             f"no {what} are returned")
    return result


@dataclass
class Scored:
    """A request's score rows (one per scored sequence: an item, or a window of a chunked document), the request
    item behind each row, and the tokens that ran."""

    rows: list[list[float]]
    pooled: list[list[float]] | None
    rows_of: list[int]
    prompt_tokens: int
    multi_item: bool
class ScoringService:
    """The per-request path. Loading happens elsewhere: until `serve` is called every request gets 503."""

    def __init__(self, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.limits = Limits.of(config)
        self.served: Served | None = None
        self.failed = False
        self.failure: str | None = None  # why loading failed: one paragraph, for the log and the termination message
        self.device_lost = False  # the accelerator failed while serving: the worker must exit and be restarted
        self.on_failure: Callable[[str], None] | None = None  # the server's: write the reason, stop, exit non-zero

    def serve(self, served: Served) -> None:
        """Start answering requests on a loaded, self-checked model whose model thread runs."""
        served.scheduler.on_device_lost = self._device_lost
        self.served = served
        self.metrics.ready.set(1)
        log.info("ready: %s", served.model.name)

    def fail(self, failure: str) -> None:
        self.failed, self.failure = True, failure

    def _device_lost(self, lost: DeviceLost) -> None:
        """The model thread's news that the device is unusable: not ready (and not alive) from now on, and the
        server told to exit so that Kubernetes restarts the container (a CUDA context cannot be recovered)."""
        self.device_lost = True
        self.fail(f"model {self.config.model} stopped serving: {lost.message}")
        self.metrics.ready.set(0)
        if self.on_failure is not None:
            self.on_failure(self.failure or "")

    @property
    def ready(self) -> bool:
        return self.served is not None and not self.failed

    @property
    def model(self) -> ScoringModel | None:
        return self.served.model if self.served is not None else None

    @property
    def scheduler(self) -> Scheduler | None:
        return self.served.scheduler if self.served is not None else None

    @property
    def decision_template(self) -> DecisionTemplate | None:
        return self.served.decision_template if self.served is not None else None

    def loaded(self) -> Served:
        """The served model, or 503 while it loads (or once its device is lost)."""
        if self.failed:
            raise DeviceLost(self.failure or "the worker is restarting") if self.device_lost else NotReady(
                self.failure or "model failed to load")
        if self.served is None:
            raise NotReady("model is loading")
        return self.served

    async def run(self, ask: ScoreAsk) -> Scored:
        """Score one request. Cancelling the calling task (client gone) or the timeout drops its queued work."""
        return await self.bounded(self._run(self.loaded(), ask))

    async def bounded(self, work: Awaitable[T]) -> T:
        """`work`, or a 504 past --request-timeout-seconds (its remaining work dropped by the caller)."""
        timeout = self.config.request_timeout_seconds
        try:
            async with asyncio.timeout(timeout) as deadline:
                return await work
        except TimeoutError:
            if not deadline.expired():
                raise
            raise Timeout(f"the request did not finish within {timeout:g} s (--request-timeout-seconds); "
                          "its remaining work was dropped") from None

    async def _run(self, served: Served, ask: ScoreAsk) -> Scored:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        prepared = await asyncio.to_thread(self._prepare, served.model, ask, loop)
        if prepared is None:
            return Scored([], [] if ask.return_pooled_hidden_states or ask.embed else None, [], 0, False)
        self.metrics.stage_seconds.labels("tokenize").observe(time.perf_counter() - started)
        job = prepared.job
        result = await run_job(served, job, prepared.plan, _values, "scores")
        mode = "multi_item" if result.multi_item else "single_item"
        self.metrics.items.labels(mode).inc(job.num_items)
        self.metrics.score_requests.labels(mode).inc()
        self.metrics.prompt_tokens.inc(result.prompt_tokens)
        return Scored(result.scores, result.pooled_hidden_states, prepared.rows_of, result.prompt_tokens,
                      result.multi_item)

    def _prepare(self, model: ScoringModel, ask: ScoreAsk, loop: asyncio.AbstractEventLoop) -> Prepared | None:
        """Checks, tokenization and planning (a worker thread); None for a request without items."""
        labels = check(model, ask, self.limits)
        if ask.return_pooled_hidden_states:
            self.metrics.hidden_requests.inc()
        if not ask.items:
            return None
        return prepare(model, ask, labels, self.limits, loop.create_future(), loop)

    def stop(self) -> None:
        if self.served is not None:
            self.served.scheduler.stop(self.config.drain_timeout_seconds)


def _values(result: JobResult) -> list[list[float]]:
    """Every number the response carries: the scores and, when asked for (or embedding), the pooled vectors."""
    return result.scores + (result.pooled_hidden_states or [])
