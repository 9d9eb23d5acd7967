"""The start-up self-check (and warm-up): within every configured limit, logged, exported, and it catches a broken
engine; `--no-self-check` skips only the comparison."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import leaky_attention
import numpy as np
import pytest
from scorekeeper_worker.base.config import DType, WorkerConfig
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.serving.startup import probes as probe_sets
from scorekeeper_worker.serving.startup import selfcheck
from scorekeeper_worker.serving.startup.load import load
from serving import RunningServer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


@pytest.mark.parametrize("name", ["mistral-cls3", "modernbert-cross", "bert-embed", "llama-causal"])
@pytest.mark.parametrize(("budget", "max_items", "mis"), [(16, 1, True), (16, 4096, False), (40, 2, True),
                                                          (8192, 4096, True)])
def test_probe_set_fits_every_limit(name: str, budget: int, max_items: int, mis: bool,
                                    tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", "t")
    delimiter = 3 if mis else None
    probes = probe_sets.probes(model, budget, max_items, mis, delimiter)
    assert len(probes) >= 2 and all(1 <= len(p.items) <= max_items for p in probes)
    assert sum(len(p.items) for p in probes) >= 3
    labels = [[[0, 1]] * len(p.items) if model.kind == "causal_lm" else None for p in probes]
    _, tokens = selfcheck.engine_scores(model, Executor(model), probes, labels, budget, delimiter)
    assert tokens <= budget  # one batch, as the scheduler would have packed it
    if budget == 8192:  # room for everything: mixed lengths, and a window crossed on both sides where there is one
        lengths = {len(p.query) + len(item) for p in probes for item in p.items}
        assert len(lengths) >= 4
        window = probe_sets.smallest_window(model)
        assert window is None or max(lengths) > 2 * window
        assert any(p.multi_item for p in probes) == (mis and model.is_decoder)


def test_broken_engine_is_caught_with_its_deviation(tiny_model: Callable[[str], Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model("bert-cross"), DType.FLOAT32, "cpu", "t")
    executor = Executor(model)
    passed = selfcheck.run(model, executor, check=True, max_batch_tokens=8192, max_items=4096, multi_item=False,
                           delimiter=None)
    assert passed.deviation is not None and passed.deviation < 1e-5 and passed.tolerance == 5e-4
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, ATTENTION_NAME, leaky_attention.leaky_attention)
    with pytest.raises(selfcheck.SelfCheckFailed, match=r"deviate from plain transformers by \d"):
        selfcheck.run(model, executor, check=True, max_batch_tokens=8192, max_items=4096, multi_item=False,
                      delimiter=None)
    # Without the check nothing notices: the engine pass alone is only a warm-up.
    skipped = selfcheck.run(model, executor, check=False, max_batch_tokens=8192, max_items=4096, multi_item=False,
                            delimiter=None)
    assert skipped.deviation is None


def test_tolerance_per_dtype_and_a_bfloat16_model_passes(tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model("qwen3-cls3"), DType.BFLOAT16, "cpu", "t")
    result = selfcheck.run(model, Executor(model), check=True, max_batch_tokens=8192, max_items=4096,
                           multi_item=True, delimiter=None)
    assert result.deviation is not None and 0 < result.deviation < result.tolerance == 5e-2


@pytest.mark.parametrize("limits", [{"max_items_per_request": 1}, {"max_batch_tokens": 16},
                                    {"max_items_per_request": 1, "max_batch_tokens": 16,
                                     "multi_item_scoring_delimiter": 3}])
def test_worker_starts_within_tight_limits_and_scores_right(limits: dict[str, int], tiny_model: Callable[[str], Path],
                                                            server_for: Callable[..., RunningServer]) -> None:
    """`--max-items-per-request 1` used to fail the two-item warm-up: never ready."""
    reference_server = server_for(tiny_model("qwen3-cls3"))
    server = server_for(tiny_model("qwen3-cls3"), **limits)
    body = {"query": [20, 21, 22], "items": [[30, 31]]}
    expected = reference_server.score(**body).json()["scores"]
    np.testing.assert_allclose(server.score(**body).json()["scores"], expected, rtol=1e-5)
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert "scorekeeper_self_check_deviation " in metrics and "scorekeeper_self_check_tolerance 0.0005" in metrics


def test_no_self_check_is_logged_and_still_warms_up(tiny_model: Callable[[str], Path],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    config = WorkerConfig(model=tiny_model("llama-reward"), self_check=False, max_items_per_request=1)
    metrics = WorkerMetrics()
    with caplog.at_level(logging.INFO, logger="scorekeeper_worker"):
        served = load(config, metrics)
    try:
        assert any("self-check skipped" in r.message and r.levelno == logging.WARNING for r in caplog.records)
        assert metrics.warmup_seconds._value.get() > 0  # the engine pass ran
    finally:
        served.scheduler.stop(config.drain_timeout_seconds)


def test_self_check_passes_are_logged_with_the_deviation(tiny_model: Callable[[str], Path],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    config, metrics = WorkerConfig(model=tiny_model("modernbert-cross")), WorkerMetrics()
    with caplog.at_level(logging.INFO, logger="scorekeeper_worker"):
        load(config, metrics).scheduler.stop(config.drain_timeout_seconds)
    passed = [r.message for r in caplog.records if r.message.startswith("self-check passed: deviation")]
    assert passed and "tolerance 0.0005" in passed[0]
    assert 0 <= metrics.self_check_deviation._value.get() < 5e-4
