"""A scoring job: one request's parameters and results, filled in as its pooled rows come out of batches; and what
every job shares (`Pending`: its future, its counts, finishing and failing on the model thread)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from scorekeeper_worker.engine.runner.heads import (
    ClassProbs,
    Embedding,
    LabelProbs,
    QueryEmbedding,
    QueryVector,
    RowHead,
    RowResult,
    ScoreHead,
    Similarity,
)
from scorekeeper_worker.model.loader import ModelKind

QUERY_SLOT = -1  # embedding models pool the query once per request into this slot
R = TypeVar("R")


@dataclass
class JobResult:
    scores: list[list[float]]
    pooled_hidden_states: list[list[float]] | None
    prompt_tokens: int
    multi_item: bool
    queue_seconds: float


@dataclass(kw_only=True)
class Pending(Generic[R]):
    """A job's side shared by every kind: the future its request awaits, and what the result reports besides."""

    future: asyncio.Future[R]
    loop: asyncio.AbstractEventLoop
    prompt_tokens: int = 0
    multi_item: bool = False
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    remaining: int = 0  # pooled rows not yet absorbed (set by the scheduler when the job is submitted)

    @property
    def queue_seconds(self) -> float:
        return (self.started_at or self.enqueued_at) - self.enqueued_at

    def head(self, slot: int) -> RowHead:
        """What the pooled row of `slot` is scored with (the runner computes it for the whole batch at once)."""
        raise NotImplementedError

    def absorb(self, slots: list[int], rows: list[RowResult]) -> None:
        """Take the results of this job's rows of one batch. Writes each slot's result (never adds to it), so a batch
        retried after a failure (engine/queue/isolation.py) absorbs the same rows again harmlessly."""
        raise NotImplementedError

    def result(self) -> R:
        raise NotImplementedError

    def finish(self) -> None:
        """Resolve the future from the model thread (the event loop owns it)."""
        self.loop.call_soon_threadsafe(set_result, self.future, self.result())

    def fail(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(set_exception, self.future, error)


Job = Pending[Any]  # what the scheduler holds: a ScoreJob, or a DecisionJob (engine/queue/decision_job.py)


@dataclass(kw_only=True)
class ScoreJob(Pending[JobResult]):
    num_items: int
    kind: ModelKind
    apply_softmax: bool
    temperature: float
    labels: list[list[int]] | None  # causal LM: one label list per item
    want_pooled: bool
    embed: bool = False  # embedding models: the items' embeddings (pooled, unit length if the model normalizes)
    scores: list[list[float] | None] = field(default_factory=list)
    pooled: list[list[float] | None] = field(default_factory=list)
    query: QueryVector = field(default_factory=QueryVector)

    def __post_init__(self) -> None:
        self.scores = [None] * self.num_items
        self.pooled = [None] * self.num_items

    def head(self, slot: int) -> RowHead:
        """Slot = item index, or QUERY_SLOT (embedding models pool the query once per request)."""
        if slot == QUERY_SLOT:
            return RowHead(QueryEmbedding(self.query))
        score: ScoreHead
        if self.kind == ModelKind.CAUSAL_LM:
            assert self.labels is not None
            score = LabelProbs(tuple(self.labels[slot]), self.apply_softmax, self.temperature)
        elif self.embed:
            score = Embedding()
        elif self.kind == ModelKind.EMBEDDING:
            score = Similarity(self.query)
        else:
            score = ClassProbs(self.apply_softmax, self.temperature)
        return RowHead(score, vector=self.want_pooled)

    def absorb(self, slots: list[int], rows: list[RowResult]) -> None:
        for slot, row in zip(slots, rows, strict=True):
            if slot == QUERY_SLOT:
                continue
            self.scores[slot] = row.scores
            if self.want_pooled:
                self.pooled[slot] = row.vector
        self.remaining -= len(slots)

    def result(self) -> JobResult:
        return JobResult(
            scores=[row for row in self.scores if row is not None],
            pooled_hidden_states=[v for v in self.pooled if v is not None] if self.want_pooled else None,
            prompt_tokens=self.prompt_tokens,
            multi_item=self.multi_item,
            queue_seconds=self.queue_seconds,
        )


def set_result(future: asyncio.Future[R], result: R) -> None:
    if not future.done():
        future.set_result(result)


def set_exception(future: asyncio.Future[R], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
