"""Only the pooled rows through the last layer's per-token tail (model/trunk_patches.py): with CLS pooling the last
feed-forward sees one row per sequence, with mean pooling every token, and the served values are those of the whole
forward (and of transformers: the conformance suite and the self-check compare them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_runs import one_batch
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import ScoringModel, load_model

REQUESTS = [ScoreRequest(query="what is a packed batch", items=["rows of tokens", "one row", "a long list of words "
                                                                 "that goes on for a while"]),
            ScoreRequest(query="short", items=["x", "tokens of the second request"])]
SEQUENCES = 5


def _last_feed_forward_rows(model: ScoringModel) -> tuple[list[list[float]], list[int]]:
    """Scores (or embeddings) of REQUESTS in one batch, and the rows the last layer's feed-forward received."""
    rows: list[int] = []
    last = model.trunk.config.num_hidden_layers - 1
    module = model.trunk.get_submodule(f"encoder.layer.{last}.intermediate")
    handle = module.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[1]))
    try:
        results = one_batch(model, REQUESTS)
    finally:
        handle.remove()
    return [value for result in results for row in result for value in row], rows


@pytest.mark.parametrize("name, cls_pooled", [("bert-cross", True), ("xlmr-cross", True), ("roberta-cross", True),
                                              ("electra-cross", True), ("xlmr-embed", True), ("bert-embed", False)])
def test_last_layer_runs_pooled_rows_only(tiny_model: Callable[[str], Path], name: str, cls_pooled: bool) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    assert model.selects_rows
    selected, rows = _last_feed_forward_rows(model)
    model.selects_rows = False  # the whole forward, as before the selection
    whole, all_rows = _last_feed_forward_rows(model)
    tokens = all_rows[0]
    assert tokens > 4 * SEQUENCES  # so the check below tells the two apart
    # Embedding requests pool the query too (one more sequence per request); a cross-encoder pools each pair.
    assert rows == [SEQUENCES + (len(REQUESTS) if model.kind == "embedding" else 0) if cls_pooled else tokens]
    np.testing.assert_allclose(selected, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["modernbert-cross", "deberta-v2-cross", "qwen3-cls3", "qwen3-causal"])
def test_other_architectures_run_whole(tiny_model: Callable[[str], Path], name: str) -> None:
    """Layers whose residual stays inside the layer's forward (ModernBERT, decoders) or that run padded (DeBERTa)
    have no hook point: they are not listed, and run every row."""
    assert not load_model(tiny_model(name), DType.FLOAT32, "cpu", name).selects_rows
