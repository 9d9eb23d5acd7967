"""A scoring job: one request's parameters and results, filled in as its pooled rows come out of batches; and what
every job shares (`Pending`: its future, its counts, finishing and failing on the model thread)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from scorekeeper_worker.engine.runner import forward
from scorekeeper_worker.engine.runner.device_copy import CopyStats, host_vectors
from scorekeeper_worker.model.loader import ModelKind, ScoringModel

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

    def absorb(self, model: ScoringModel, slots: list[int], rows: torch.Tensor, copies: CopyStats) -> None:
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
    apply_softmax: bool
    temperature: float
    labels: list[list[int]] | None  # causal LM: one label list per item
    want_pooled: bool
    embed: bool = False  # embedding models: the items' embeddings (pooled, unit length if the model normalizes)
    scores: list[list[float] | None] = field(default_factory=list)
    pooled: list[list[float] | None] = field(default_factory=list)
    query_embedding: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.scores = [None] * self.num_items
        self.pooled = [None] * self.num_items

    def absorb(self, model: ScoringModel, slots: list[int], rows: torch.Tensor, copies: CopyStats) -> None:
        """Score this job's pooled rows from one batch (slot = item index, or QUERY_SLOT)."""
        if model.kind == ModelKind.EMBEDDING and QUERY_SLOT in slots:
            at = slots.index(QUERY_SLOT)
            self.query_embedding = forward.embeddings(model, rows[at:at + 1])[0]
            self.remaining -= 1
            slots, rows = slots[:at] + slots[at + 1 :], torch.cat([rows[:at], rows[at + 1 :]])
        if not slots:
            return
        features = forward.pre_head(model, rows.to(model.dtype))
        if model.kind == ModelKind.CAUSAL_LM:
            scores = self._label_scores(model, slots, features)
        elif self.embed:
            scores = [[] for _ in slots]
            features = forward.embeddings(model, features)
        elif model.kind == ModelKind.EMBEDDING:
            assert self.query_embedding is not None  # the query unit is planned first, so it is scored first
            scores = forward.similarity_scores(model.sentence_config.similarity, self.query_embedding,
                                             forward.embeddings(model, rows))
        else:
            logits = forward.classifier_logits(model, features)
            scores = forward.classifier_scores(logits, self.apply_softmax, self.temperature, model.multi_label)
        for slot, row in zip(slots, scores if isinstance(scores, list) else scores.tolist(), strict=True):
            self.scores[slot] = row
        if self.want_pooled:
            # The copy being measured: pinned + non-blocking + CUDA events on GPU. Host tensor → Python floats is
            # part of the cost on every device, and the whole cost on CPU, so the metric measures real work everywhere.
            vectors, seconds, nbytes = host_vectors(features)
            copies.seconds += seconds
            copies.vectors += features.shape[0]
            copies.bytes += nbytes
            for slot, vector in zip(slots, vectors, strict=True):
                self.pooled[slot] = vector
        self.remaining -= len(slots)

    def _label_scores(self, model: ScoringModel, slots: list[int], features: torch.Tensor) -> list[list[float]]:
        """Label-token scores; items whose label lists differ in length are scored in groups of equal length."""
        assert self.labels is not None
        by_length: dict[int, list[int]] = {}
        for at, slot in enumerate(slots):
            by_length.setdefault(len(self.labels[slot]), []).append(at)
        rows: list[list[float]] = [[] for _ in slots]
        for positions in by_length.values():
            labels = torch.tensor([self.labels[slots[at]] for at in positions], device=features.device)
            scores = forward.causal_lm_scores(model, features[positions], labels, self.apply_softmax, self.temperature)
            for at, row in zip(positions, scores.tolist(), strict=True):
                rows[at] = row
        return rows

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
