"""The support matrix: every row is served exactly (also packed with other requests' sequences), anything else is
refused at load with a message naming it, and so are checkpoints whose weights transformers would not load as saved."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference
from safetensors.torch import load_file, save_file
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType, WorkerConfig
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ModelKind, load_model
from scorekeeper_worker.model.support import UnsupportedModel, supported_architectures
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.prepare import Limits
from scorekeeper_worker.serving.startup.load import load
from tiny_models import ALL_TINY_MODELS, SPECS, TinyModel

LABELS = [5, 17, 42]
# Two clients' requests, one batch: different queries, items of different lengths (an empty one too).
REQUESTS = [("what is the capital of the state", ["the capital is a city", "", "rivers, mountains and cities"]),
            ("bananas?", ["bananas are yellow and sweet, and the dog likes to run in the park", "no"])]


def test_every_matrix_row_has_a_tiny_model_and_back() -> None:
    """What the docs call supported is exactly what the tests build and compare with transformers."""
    assert {spec.architecture for spec in SPECS.values()} == set(supported_architectures())


@cache
def _loaded(path: Path) -> tuple[Any, Any, str]:
    return reference.load_model(path)


def _packed_scores(path: Path, requests: list[ScoreRequest], multi_item: list[bool]) -> list[list[list[float]]]:
    """Plan every request as the server does and run all their units as ONE batch through the executor."""
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    causal = model.kind == ModelKind.CAUSAL_LM
    asks = [dataclasses.replace(request.ask(), label_token_ids=[LABELS] * len(request.item_list) if causal else None,
                                multi_item_scoring=mis)
            for request, mis in zip(requests, multi_item, strict=True)]
    jobs = scored(score_now(Executor(model), asks, Limits(max_batch_tokens=8192)))
    assert all(job.remaining == 0 for job in jobs)
    return [[list(row or []) for row in job.scores] for job in jobs]


@pytest.mark.parametrize("name", ALL_TINY_MODELS, ids=str)
def test_packed_requests_match_transformers(name: TinyModel, tiny_model: Callable[[str], Path]) -> None:
    """Two requests' sequences in one packed batch (the first under multi-item scoring for decoders) score exactly
    what each sequence scores alone in plain transformers."""
    path = tiny_model(name)
    model, tok, kind = _loaded(path)
    causal = SPECS[name].kind == "causal_lm"
    requests = [ScoreRequest(query=query, items=items, apply_softmax=causal,
                             label_token_ids=LABELS if causal else None) for query, items in REQUESTS]
    if SPECS[name].kind == "embedding":  # an embedding of no tokens is undefined: keep items non-empty
        requests = [ScoreRequest(query=q, items=[i for i in items if i]) for q, items in REQUESTS]
    served = _packed_scores(path, requests, [True, False])
    for request, rows in zip(requests, served, strict=True):
        expected = reference.expected_scores(model, tok, kind, str(request.query), list(request.item_list),
                                             apply_softmax=causal, labels=LABELS if causal else None)
        np.testing.assert_allclose(rows, expected, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------- refusals


def _copy(tiny_model: Callable[[str], Path], name: str, tmp_path: Path) -> Path:
    target = tmp_path / f"{name}-edited"
    shutil.copytree(tiny_model(name), target)
    return target


def _edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def _rename_weights(path: Path, rename: Callable[[str], str | None]) -> None:
    """Rewrite model.safetensors with renamed (or, for None, dropped) tensors."""
    weights = load_file(path / "model.safetensors")
    renamed = {new: tensor for name, tensor in weights.items() if (new := rename(name)) is not None}
    save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})


def test_distilbert_is_refused_naming_it_and_the_supported_list(tmp_path: Path) -> None:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    DistilBertForSequenceClassification(DistilBertConfig(vocab_size=50, dim=16, hidden_dim=32, n_layers=1,
                                                         n_heads=2)).save_pretrained(tmp_path / "distilbert")
    with pytest.raises(UnsupportedModel) as refused:
        load_model(tmp_path / "distilbert", DType.FLOAT32, "cpu", "t")
    message = str(refused.value)
    assert "'DistilBertForSequenceClassification'" in message and "'distilbert'" in message
    assert "ModernBertForSequenceClassification" in message and "Qwen2ForSequenceClassification" in message


def test_reward_model_class_outside_the_matrix_is_refused(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """A remote-code `Qwen2ForRewardModel` would load through AutoModelForSequenceClassification with a new head."""
    path = _copy(tiny_model, "qwen2-reward", tmp_path)
    _edit_config(path, architectures=["Qwen2ForRewardModel"])
    with pytest.raises(UnsupportedModel, match="'Qwen2ForRewardModel'"):
        load_model(path, DType.FLOAT32, "cpu", "t")


def test_missing_head_weights_are_refused_naming_them(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """A trunk-only checkpoint under a classifier config: transformers would initialise `score` at random."""
    path = _copy(tiny_model, "qwen2-reward", tmp_path)
    _rename_weights(path, lambda name: None if name.startswith("score.") else name)
    with pytest.raises(UnsupportedModel, match=r"missing from the checkpoint.*'score\.weight'"):
        load_model(path, DType.FLOAT32, "cpu", "t")


def test_head_saved_under_other_names_is_refused(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """A reward model saved by a class whose head has other parameter names (e.g. `score.0.weight` of a two-layer
    head), loaded through the auto class of the config: the real head is unused and a new one would be random."""
    path = _copy(tiny_model, "qwen2-reward", tmp_path)
    _rename_weights(path, lambda name: "score.0.weight" if name == "score.weight" else name)
    with pytest.raises(UnsupportedModel) as refused:
        load_model(path, DType.FLOAT32, "cpu", "t")
    assert "'score.weight'" in str(refused.value) and "'score.0.weight'" in str(refused.value)


def test_missing_trunk_weights_are_refused(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    path = _copy(tiny_model, "modernbert-cross", tmp_path)
    _rename_weights(path, lambda name: None if name.startswith("model.layers.1.attn.Wo") else name)
    with pytest.raises(UnsupportedModel, match=r"model\.layers\.1\.attn\.Wo\.weight"):
        load_model(path, DType.FLOAT32, "cpu", "t")


def test_unused_pooler_may_be_missing_from_an_embedding_model(tiny_model: Callable[[str], Path],
                                                              tmp_path: Path) -> None:
    """sentence-transformers checkpoints often omit BERT's pooler, which an embedding model never runs."""
    path = _copy(tiny_model, "bert-embed", tmp_path)
    _rename_weights(path, lambda name: None if name.startswith("pooler.") else name)
    assert load_model(path, DType.FLOAT32, "cpu", "t").kind == ModelKind.EMBEDDING


@pytest.mark.parametrize(("module", "settings", "match"), [
    ("sentence_transformers.models.Dense", None, "Dense"),
    (None, {"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, "max_tokens"),
])
def test_sentence_transformers_modules_that_change_embeddings_are_refused(
        tiny_model: Callable[[str], Path], tmp_path: Path, module: str | None, settings: dict[str, bool] | None,
        match: str) -> None:
    path = _copy(tiny_model, "bert-embed", tmp_path)
    if module is not None:
        modules = json.loads((path / "modules.json").read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": module})
        (path / "modules.json").write_text(json.dumps(modules))
    if settings is not None:
        pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling | settings))
    with pytest.raises(UnsupportedModel, match=match):
        load_model(path, DType.FLOAT32, "cpu", "t")


def test_heads_are_the_models_own_modules(tiny_model: Callable[[str], Path]) -> None:
    """No hand-written head: what runs on the pooled rows are modules of the loaded transformers model."""
    for name in ("modernbert-cross", "deberta-v2-cross", "bert-cross", "electra-cross", "qwen3-cls3"):
        model = load_model(tiny_model(name), DType.FLOAT32, "cpu", "t")
        own = {id(module) for module in model.model.modules()}
        assert model.head and all(id(module) in own for module, _ in model.pre_head + model.head), name


def test_cuda_graphs_are_refused_for_padded_architectures(tiny_model: Callable[[str], Path]) -> None:
    """DeBERTa-v2 runs its own attention on padded blocks, which the graph buckets (packed layouts) cannot hold."""
    config = WorkerConfig(model=tiny_model("deberta-v2-cross"), cuda_graph=True)
    with pytest.raises(ValueError, match="--cuda-graph: deberta-v2 runs its own attention on padded batches"):
        load(config, WorkerMetrics())
