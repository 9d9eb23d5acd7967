"""What start-up leaves for the per-request path, and the one way a request's job goes through the queue."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from scorekeeper_worker.base.errors import NonFiniteScore
from scorekeeper_worker.engine.queue.jobs import Pending
from scorekeeper_worker.engine.queue.scheduler import Plan, Scheduler
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate

R = TypeVar("R")


@dataclass(frozen=True)
class Served:
    """The model, proven by the self-check; the queue its model thread drains; the decision template (causal LMs:
    /v1/decisions and /v1/systemone)."""

    model: ScoringModel
    scheduler: Scheduler
    decision_template: DecisionTemplate | None = None


async def run_job(served: Served, job: Pending[R], plan: Plan, values: Callable[[R], Iterable[float]],
                  what: str) -> R:
    """Queue the job's plan and await its result; a request cancelled, timed out or failed leaves nothing queued.
    Never a NaN or inf in a 200: the heads keep finite logits finite, this catches a model that overflowed."""
    queued = served.scheduler.submit(job, plan)
    try:
        result = await job.future
    except BaseException:
        served.scheduler.cancel(queued)
        raise
    if not all(math.isfinite(value) for value in values(result)):
        dtype = str(served.model.dtype).removeprefix("torch.")
        raise NonFiniteScore(f"the model produced a non-finite score for this request (numeric overflow in {dtype}); "
                             f"no {what} are returned")
    return result
