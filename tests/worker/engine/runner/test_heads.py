"""A batch's heads (engine/runner/heads.py): one computation per distinct head across every job of the batch, results
equal to each row scored alone, and nothing that waits for the device: no device value read on the host (the meta
device has none) and no pageable host→device copy (`torch.tensor(…, device=…)`) while they are enqueued."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner import forward, heads
from scorekeeper_worker.engine.runner.heads import (
    ClassProbs,
    CopyStats,
    LabelProbs,
    NextTokenLogProb,
    QueryEmbedding,
    QueryVector,
    RowHead,
    Similarity,
)
from scorekeeper_worker.model.loader import ScoringModel, load_model


@pytest.fixture(scope="module")
def causal(tiny_model: Callable[[str], Path]) -> ScoringModel:
    return load_model(tiny_model("qwen3-causal"), DType.FLOAT32, "cpu", "qwen3-causal")


def _rows(model: ScoringModel, count: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(count + 1, model.hidden_size, generator=torch.Generator().manual_seed(count)).to(device)


def test_rows_are_grouped_by_head_across_jobs() -> None:
    query = QueryVector()
    row_heads = [RowHead(LabelProbs((5, 9), True, 1.0)), RowHead(NextTokenLogProb(3)),
                 RowHead(LabelProbs((5, 9), True, 1.0)), RowHead(LabelProbs((5, 9), True, 0.5)),
                 RowHead(NextTokenLogProb(8)), RowHead(Similarity(query), vector=True), RowHead(QueryEmbedding(query))]
    plan = heads.plan(row_heads)
    groups = [(type(g.head).__name__, g.rows, g.tokens) for g in plan.groups]
    assert groups == [("QueryEmbedding", [6], []),  # first: a similarity of the same batch reads it
                      ("LabelProbs", [0, 2], []), ("NextTokenLogProb", [1, 4], [3, 8]), ("LabelProbs", [3], []),
                      ("Similarity", [5], [])]
    assert plan.vector_rows == [5] and plan.rows == 7


def test_label_heads_of_a_batch_equal_each_row_scored_alone(causal: ScoringModel) -> None:
    labels = [(5, 9), (5, 9), (7, 1, 2), (5, 9), (7, 1, 2)]
    softmax = [True, True, False, True, True]
    row_heads = [RowHead(LabelProbs(ls, s, 0.7)) for ls, s in zip(labels, softmax, strict=True)]
    row_heads.append(RowHead(NextTokenLogProb(11)))
    pooled = _rows(causal, len(row_heads))
    with torch.inference_mode():
        results = heads.collect(heads.launch(causal, pooled, heads.plan(row_heads)), CopyStats())
        features = forward.pre_head(causal, pooled[:len(row_heads)])
        for row, (ls, s) in enumerate(zip(labels, softmax, strict=True)):
            alone = forward.causal_lm_scores(causal, features[row:row + 1], torch.tensor(ls), s, 0.7)[0]
            assert results[row].scores == pytest.approx(alone.tolist(), rel=1e-6, abs=1e-9)
        token = forward.token_log_probs(causal, features[-1:], torch.tensor([11]))[0].item()
    assert results[-1].scores == pytest.approx([token], rel=1e-6)


def test_classifier_heads_and_vectors(tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model("qwen3-cls3"), DType.FLOAT32, "cpu", "qwen3-cls3")
    row_heads = [RowHead(ClassProbs(True, 1.0), vector=True), RowHead(ClassProbs(False, 1.0)),
                 RowHead(ClassProbs(True, 1.0), vector=True)]
    pooled = _rows(model, 3)
    copies = CopyStats()
    with torch.inference_mode():
        results = heads.collect(heads.launch(model, pooled, heads.plan(row_heads)), copies)
        features = forward.pre_head(model, pooled[:3])
        logits = forward.classifier_logits(model, features)
        probs = forward.classifier_scores(logits, True, 1.0)
    for result, want in zip(results, (probs[0], logits[1], probs[2]), strict=True):
        assert result.scores == pytest.approx(want.tolist())
    assert results[0].vector == pytest.approx(features[0].tolist()) and results[1].vector is None
    assert (copies.vectors, copies.bytes) == (2, 2 * model.hidden_size * 4)


def test_enqueueing_the_heads_reads_no_device_value_and_copies_nothing_pageable(
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """On the meta device any host read raises (`.item()`, `.tolist()`, `if tensor`, data-dependent shapes); and
    `torch.tensor` (a pageable copy on a GPU, which waits for the work before it) must not be called."""
    causal = load_model(tiny_model("qwen3-causal"), DType.FLOAT32, "cpu", "meta")
    causal.model.to("meta")
    row_heads = [RowHead(LabelProbs((5, 9), True, 0.7)), RowHead(LabelProbs((3, 4, 6), False, 1.0)),
                 RowHead(NextTokenLogProb(2)), RowHead(LabelProbs((5, 9), True, 1.0, log=True))]

    def pageable(*_: object, **__: object) -> torch.Tensor:
        raise AssertionError("torch.tensor(...) while enqueueing heads: a pageable copy to the device")

    monkeypatch.setattr(torch, "tensor", pageable)
    with torch.inference_mode():
        pending = heads.launch(causal, _rows(causal, 4, "meta"), heads.plan(row_heads))
    shapes = [tuple(output.shape) for output in pending.outputs if output is not None]
    assert shapes == [(1, 2), (1, 3), (1, 1), (1, 2)] and all(o.device.type == "meta" for o in pending.outputs
                                                                if o is not None)
