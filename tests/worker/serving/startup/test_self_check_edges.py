"""The self-check sees what issue 22 found: its edge batch reaches the maximum length beside short sequences, holds
special tokens and pad tokens, crosses longrope's threshold and puts the multi-item delimiter on the last position;
an engine that got any of these wrong is refused at start-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from engine_runs import variant
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.model.trunk_patches import RopeTables
from scorekeeper_worker.planning import planner
from scorekeeper_worker.serving.startup import probes as probe_sets
from scorekeeper_worker.serving.startup import selfcheck

LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [4.0, 8.0, 16.0, 32.0]}


def _run(model: ScoringModel, multi_item: bool = False, delimiter: int | None = None) -> selfcheck.SelfCheckResult:
    return selfcheck.run(model, Executor(model), check=True, max_batch_tokens=8192, max_items=4096,
                         multi_item=multi_item, delimiter=delimiter)


@pytest.mark.parametrize("name", ["bert-embed", "xlmr-cross", "qwen2-reward", "mistral-causal"])
def test_edge_probes_reach_the_maximum_beside_short_sequences_with_special_tokens(
        name: str, tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", "t")
    edge = probe_sets.edge_probes(model, multi_item=True, delimiter=3)
    lengths = [len(p.query) + len(item) if model.kind != "embedding" else len(item) for p in edge for item in p.items]
    assert max(lengths) == min(model.max_positions, probe_sets.LONG_PROBE_LIMIT)
    assert min(lengths) <= 16  # a short sequence in the same batch
    special = set(model.tokenizer.all_special_ids)
    assert any(token in special for p in edge for item in p.items for token in item)
    assert any(item and item[-1] == model.tokenizer.pad_token_id for p in edge for item in p.items)
    if model.is_decoder:  # an item whose delimiter would pass the maximum, and one whose delimiter is the last
        group = next(p for p in edge if p.multi_item)
        assert {len(group.query) + len(item) for item in group.items} >= {max(lengths), max(lengths) - 1}


def test_a_batch_wide_rope_table_is_caught(tiny_model: Callable[[str], Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """longrope with the short table for every sequence (what a packed batch of short sequences gets from
    transformers' rule) deviates on the edge batch's long probe."""
    model = load_model(variant(tiny_model("qwen2-reward"), tmp_path / "longrope", rope_parameters=LONGROPE),
                       DType.FLOAT32, "cpu", "t")
    assert _run(model).deviation < 1e-5  # type: ignore[operator]
    monkeypatch.setattr(RopeTables, "table", lambda self, length: 0)
    with pytest.raises(selfcheck.SelfCheckFailed):
        _run(model)


def test_reading_a_pad_token_is_caught(tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model("qwen2-reward"), DType.FLOAT32, "cpu", "t")
    assert _run(model, multi_item=True, delimiter=3).deviation < 1e-5  # type: ignore[operator]
    monkeypatch.setattr(planner, "read_index", lambda model, ids: len(ids) - 1)
    with pytest.raises(selfcheck.SelfCheckFailed):
        _run(model)


def test_positions_across_a_pad_token_are_caught(tiny_model: Callable[[str], Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model("xlmr-embed"), DType.FLOAT32, "cpu", "t")
    assert _run(model).deviation < 1e-5  # type: ignore[operator]
    monkeypatch.setattr(planner, "positions", lambda model, ids: None)
    with pytest.raises(selfcheck.SelfCheckFailed):
        _run(model)
