"""A batch's heads: one computation per distinct head over every row that needs it (never one per request), enqueued
on the device right after the forward, with no device value read on the host; the results come back in one set of
non-blocking copies that the batch's completion covers.

Each pooled row of a batch carries a `RowHead` from its job: what its scores are (label-token probabilities, the
next token's log-probability, class probabilities, an embedding, the similarity to its request's query embedding)
and whether its pre-head vector goes back too (`return_pooled_hidden_states`). `plan` groups the rows by head on the
host; `launch` computes the groups on the device (the index tensors reach it staged through pinned memory, one copy);
`collect`, once the batch has completed, turns the host copies into each row's floats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from scorekeeper_worker.engine.runner import forward
from scorekeeper_worker.model.loader import ScoringModel


@dataclass
class CopyStats:
    """Device→host copies of pooled hidden states (`return_pooled_hidden_states`), for the copy-overhead metrics."""

    vectors: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class LabelProbs:
    """Causal LMs: the label tokens' probabilities (a softmax over them, or true probabilities over the vocabulary);
    `log`: their logarithm (decisions' first-token term)."""

    labels: tuple[int, ...]
    softmax: bool
    temperature: float
    log: bool = False


@dataclass(frozen=True)
class NextTokenLogProb:
    """Decisions' option tokens after the first: log p(token | row) over the full vocabulary."""

    token: int


@dataclass(frozen=True)
class ClassProbs:
    """Classifiers, reward models, cross-encoders: the model's own head, as logits or probabilities."""

    softmax: bool
    temperature: float


@dataclass(frozen=True)
class Embedding:
    """Embedding models (/v1/embeddings): the row's embedding is its vector; no scores."""


@dataclass(eq=False)
class QueryVector:
    """A request's query embedding (a device tensor), kept from the batch that pooled it for the batches after."""

    vector: torch.Tensor | None = None


@dataclass(frozen=True)
class QueryEmbedding:
    """The row is its request's query: its embedding is kept in `query`, and it has no scores."""

    query: QueryVector


@dataclass(frozen=True)
class Similarity:
    """Embedding models (/v1/score): the similarity of the row's embedding to its request's query embedding."""

    query: QueryVector


ScoreHead = LabelProbs | NextTokenLogProb | ClassProbs | Embedding | QueryEmbedding | Similarity


@dataclass(frozen=True)
class RowHead:
    score: ScoreHead
    vector: bool = False  # the pre-head vector goes back to the host too


@dataclass
class Group:
    """The batch rows of one head; `tokens`: NextTokenLogProb's token per row."""

    head: ScoreHead
    rows: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


@dataclass
class HeadPlan:
    groups: list[Group]
    vector_rows: list[int]  # rows whose pre-head vector goes back (not Embedding rows: their vector is the score's)
    rows: int


def plan(heads: list[RowHead]) -> HeadPlan:
    """Group a batch's rows (in batch order) by head. Query embeddings come first: a similarity of the same batch
    reads them."""
    groups: dict[object, Group] = {}
    for row, head in enumerate(heads):
        score = head.score
        key = NextTokenLogProb if isinstance(score, NextTokenLogProb) else score
        group = groups.setdefault(key, Group(score))
        group.rows.append(row)
        if isinstance(score, NextTokenLogProb):
            group.tokens.append(score.token)
    ordered = sorted(groups.values(), key=lambda g: not isinstance(g.head, QueryEmbedding))
    vector_rows = [row for row, head in enumerate(heads) if head.vector and not isinstance(head.score, Embedding)]
    return HeadPlan(ordered, vector_rows, len(heads))


@dataclass
class VectorCopy:
    """Pre-head vectors on their way to the host: the host tensor (final once the batch completes) and, on CUDA, the
    events around its device→host copy."""

    host: torch.Tensor
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def values(self, copies: CopyStats) -> list[list[float]]:
        """The vectors as Python floats, once complete; counts the copy (its device time and the conversion, which
        every device pays) into `copies`."""
        started = time.perf_counter()
        vectors = self.host.float().tolist()
        seconds = time.perf_counter() - started
        if self.events is not None:
            seconds += self.events[0].elapsed_time(self.events[1]) / 1000
        copies.vectors += len(vectors)
        copies.bytes += self.host.numel() * self.host.element_size()
        copies.seconds += seconds
        return vectors


def copy_vectors(vectors: torch.Tensor) -> VectorCopy:
    """Enqueue the copy of `vectors` to the host (pinned memory, non-blocking, between two timing events on CUDA)."""
    if not vectors.is_cuda:
        return VectorCopy(vectors)
    events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    events[0].record()
    host = _to_host(vectors)
    events[1].record()
    return VectorCopy(host, events)


@dataclass
class Pending:
    """A batch's heads on their way back: per group its result (on the host once the batch completes), and the
    pre-head vectors."""

    plan: HeadPlan
    outputs: list[torch.Tensor | None]
    vectors: VectorCopy | None


def _staged(values: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Index lists as int64 tensors on `device`: on CUDA one pinned buffer and one non-blocking copy (a pageable copy
    would wait for the device to finish the work queued before it)."""
    flat = np.fromiter((v for part in values for v in part), dtype=np.int64, count=sum(map(len, values)))
    staged = torch.from_numpy(flat)
    if device.type == "cuda":
        staged = staged.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        staged = staged.to(device)
    return list(staged.split([len(part) for part in values]))


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_cuda:
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _scores(model: ScoringModel, group: Group, rows: torch.Tensor, features: torch.Tensor, index: torch.Tensor,
            extra: torch.Tensor) -> torch.Tensor | None:
    """One group's scores [n, k] on the device (None for query embeddings, which are kept instead)."""
    head = group.head
    if isinstance(head, LabelProbs):
        scores = forward.causal_lm_scores(model, features[index], extra, head.softmax, head.temperature)
        return scores.log() if head.log else scores
    if isinstance(head, NextTokenLogProb):
        return forward.token_log_probs(model, features[index], extra)[:, None]
    if isinstance(head, ClassProbs):
        logits = forward.classifier_logits(model, features[index])
        return forward.classifier_scores(logits, head.softmax, head.temperature, model.multi_label)
    if isinstance(head, Embedding):
        return forward.embeddings(model, features[index])
    if isinstance(head, QueryEmbedding):
        head.query.vector = forward.embeddings(model, rows[index])[-1]
        return None
    assert head.query.vector is not None, "a request's query is planned first, so it is pooled first"
    return forward.similarity_scores(model.sentence_config.similarity, head.query.vector,
                                     forward.embeddings(model, rows[index]))


def launch(model: ScoringModel, pooled: torch.Tensor, heads: HeadPlan) -> Pending:
    """Enqueue every group's scores on the device of `pooled` ([≥ rows, H] float32, the batch's rows first) and
    their copies to the host. Reads no device value on the host."""
    rows = pooled[:heads.rows]
    features = forward.pre_head(model, rows.to(model.dtype))
    extras = [list(g.head.labels) if isinstance(g.head, LabelProbs) else g.tokens for g in heads.groups]
    staged = _staged([g.rows for g in heads.groups] + extras + [heads.vector_rows], pooled.device)
    count = len(heads.groups)
    outputs = []
    for group, index, extra in zip(heads.groups, staged[:count], staged[count:2 * count], strict=True):
        scores = _scores(model, group, rows, features, index, extra)
        outputs.append(None if scores is None else _to_host(scores))
    vectors = copy_vectors(features[staged[-1]]) if heads.vector_rows else None
    return Pending(heads, outputs, vectors)


@dataclass
class RowResult:
    scores: list[float]
    vector: list[float] | None = None


def collect(pending: Pending, copies: CopyStats) -> list[RowResult]:
    """Each row's floats, once the batch has completed (the host copies are then final); counts the vectors'
    copy into `copies` (device→host time, and the conversion to Python floats that every device pays)."""
    results = [RowResult([]) for _ in range(pending.plan.rows)]
    for group, output in zip(pending.plan.groups, pending.outputs, strict=True):
        if output is None:
            continue
        if isinstance(group.head, Embedding):
            for row, vector in zip(group.rows, output.float().tolist(), strict=True):
                results[row].vector = vector
            continue
        for row, scores in zip(group.rows, output.tolist(), strict=True):
            results[row].scores = scores
    if pending.vectors is not None:
        for row, vector in zip(pending.plan.vector_rows, pending.vectors.values(copies), strict=True):
            results[row].vector = vector
    return results
