"""The largest intermediate of a request (serving/prepare.py, --max-intermediate-bytes): what each term counts, which
field it names, and that the issue's request (issue 48, defect 1) needs items × labels, not items × labels × hidden."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tiny_models
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.base.errors import IntermediateTooLarge
from scorekeeper_worker.engine.runner.forward import NORMALISER_ELEMENTS
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.serving.prepare import (
    Limits,
    check,
    label_lists,
    largest,
    shape_intermediates,
    token_intermediates,
    widest_layer,
)


def _largest(model: ScoringModel, **body: Any) -> tuple[int, str, str]:
    ask = ScoreRequest(**body).ask()
    worst = largest(shape_intermediates(model, ask, label_lists(model, ask, len(ask.items))))
    return worst.nbytes, worst.field, worst.what


@pytest.fixture(scope="module")
def causal512(tiny_dir: Path) -> ScoringModel:
    path = tiny_models.build("qwen3-causal", tiny_dir, variant="hidden512", config_edits={"hidden_size": 512})
    return load_model(path, DType.FLOAT32, "cpu", "qwen3-causal")


def test_the_issues_request_needs_its_scores_not_items_times_labels_times_hidden(causal512: ScoringModel) -> None:
    nbytes, field, what = _largest(causal512, query=[5], items=[[10]] * 4096, label_token_ids=list(range(290)),
                                   apply_softmax=True)
    assert (nbytes, field) == (4096 * 290 * 8, "label_token_ids") and "label scores" in what
    assert nbytes * 100 < 4096 * 290 * 512 * 4  # the old gather: 2.4 GB


def test_a_long_label_list_needs_its_rows_of_the_output_embedding(causal512: ScoringModel) -> None:
    nbytes, field, what = _largest(causal512, query=[5], items=[[10]], label_token_ids=list(range(300)),
                                   apply_softmax=True)
    assert (nbytes, field) == (300 * 512 * 4, "label_token_ids") and "output embedding" in what


def test_true_probabilities_need_a_chunk_of_vocabulary_logits(tiny_model: Callable[[str], Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import scorekeeper_worker.serving.prepare as working_memory

    model = load_model(tiny_model("qwen3-causal"), DType.FLOAT32, "cpu", "qwen3-causal")  # hidden 32, vocabulary 300
    assert NORMALISER_ELEMENTS // 300 > 100  # the engine's chunk, which the estimate reads: 100 rows at once
    assert _largest(model, query=[5], items=[[10]] * 100, label_token_ids=[1, 2]) == (
        100 * 300 * 4, "apply_softmax", "vocabulary logits (100 rows × 300)")
    monkeypatch.setattr(working_memory, "NORMALISER_ELEMENTS", 64 * 300)  # chunks of 64 rows
    assert _largest(model, query=[5], items=[[10]] * 100, label_token_ids=[1, 2])[0] == 64 * 300 * 4
    assert _largest(model, query=[5], items=[[10]] * 100, label_token_ids=[1, 2], apply_softmax=True)[1] == "items"


def test_pooled_rows_and_class_scores(tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model("bert-embed"), DType.FLOAT32, "cpu", "bert-embed")
    assert _largest(model, query="q", items=["a"] * 100) == (100 * 32 * 4, "items", "pooled rows (100 × 32 floats)")
    classifier = load_model(tiny_model("qwen3-cls3"), DType.FLOAT32, "cpu", "qwen3-cls3")
    assert _largest(classifier, query="q", items=["a"] * 7)[0] == 7 * 32 * 4


def test_the_trunk_terms_grow_with_the_longest_sequence(causal512: ScoringModel) -> None:
    width = widest_layer(causal512)
    assert width == 512  # hidden 512, MLP 64, 4 heads × 8
    activations, attention = token_intermediates(causal512, 1000, "items")
    assert activations.nbytes == 1000 * 512 * 4 and attention.nbytes == 4 * 1000 * 1000 * 4
    assert token_intermediates(causal512, 100_000, "items")[1].nbytes == (1 << 24) * 4  # one tile of scores


def test_check_refuses_over_the_bound_naming_the_field(causal512: ScoringModel) -> None:
    ask = ScoreRequest(query=[5], items=[[10]] * 4096, label_token_ids=list(range(290)), apply_softmax=True).ask()
    assert check(causal512, ask, Limits(max_intermediate_bytes=4096 * 290 * 8)) is not None
    with pytest.raises(IntermediateTooLarge, match=r"^label_token_ids: .*--max-intermediate-bytes") as refused:
        check(causal512, ask, Limits(max_intermediate_bytes=4096 * 290 * 8 - 1))
    assert refused.value.field == "label_token_ids" and refused.value.reason == "intermediate_bytes"


def test_windows_of_chunked_documents_count_once_tokenized(causal512: ScoringModel) -> None:
    """Before tokenization a request has one row per item (max_chunks_per_doc is only a ceiling); once planned, each
    window of a chunked document is a row with its item's labels."""
    ask = ScoreRequest(query=[5], items=[[10]] * 2, label_token_ids=[[1, 2, 3], [4]], apply_softmax=False).ask()
    labels = label_lists(causal512, ask, 2)
    scores = next(i for i in shape_intermediates(causal512, ask, labels) if i.what.startswith("label scores"))
    assert scores.nbytes == (3 + 1) * 8
    windows = shape_intermediates(causal512, ask, labels, rows_of=[0, 0, 0, 1])
    assert next(i for i in windows if i.what.startswith("label scores")).nbytes == (3 * 3 + 1) * 8
    assert next(i for i in windows if i.what.startswith("pooled rows")).nbytes == 4 * 512 * 4
