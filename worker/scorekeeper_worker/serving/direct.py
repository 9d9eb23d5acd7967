"""Requests scored now, on the calling thread, without the queue: start-up's probes (the self-check, the int8
certificate), the public Python entry points (`scorekeeper_worker.library`) and tests. Each request is prepared
exactly as the service prepares it (`serving/prepare.py`); only the batching differs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.queue.batching import token_batches
from scorekeeper_worker.engine.queue.jobs import ScoreJob
from scorekeeper_worker.engine.runner.executor import BatchStats, Executor
from scorekeeper_worker.engine.runner.packing import PackUnit
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.prepare import Limits, check, prepare


def score_now(executor: Executor, asks: list[ScoreAsk], limits: Limits | None = None,
              max_batch_tokens: int | None = None,
              on_batch: Callable[[BatchStats], None] | None = None) -> list[ScoreJob | Invalid]:
    """Every request's units through `executor`: all in one batch, or (`max_batch_tokens`) in batches of at most
    that many tokens, in order; `on_batch` sees each batch's stats. Each outcome is the complete job (its
    `scores`, `pooled`), or the 400 it got."""
    limits = limits or Limits()
    loop = asyncio.new_event_loop()
    try:
        outcomes: list[ScoreJob | Invalid] = []
        work: list[tuple[ScoreJob, PackUnit]] = []
        for ask in asks:
            try:
                labels = check(executor.model, ask, limits)
                prepared = prepare(executor.model, ask, labels, limits, loop.create_future(), loop)
            except Invalid as refused:
                outcomes.append(refused)
                continue
            outcomes.append(prepared.job)
            work += [(prepared.job, unit) for unit in prepared.plan.units]
            prepared.job.remaining = sum(len(unit.pools) for unit in prepared.plan.units)
        for batch in [work] if max_batch_tokens is None else token_batches(work, max_batch_tokens,
                                                                             lambda pair: pair[1].num_tokens):
            if batch:
                stats = executor.run(batch)
                if on_batch is not None:
                    on_batch(stats)
    finally:
        loop.close()
    return outcomes


def scored(outcomes: list[ScoreJob | Invalid]) -> list[ScoreJob]:
    """The jobs, for requests the worker built itself: a refusal there is a bug, raised as such."""
    for outcome in outcomes:
        if isinstance(outcome, Invalid):
            raise outcome
    return outcomes  # type: ignore[return-value]
