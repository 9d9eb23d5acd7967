"""Every number in a 200 is finite: any finite temperature > 0 is computed without overflow (its limits: arg-max
one-hot and uniform), huge logits stay finite, and a model that overflows gets a 500, never NaN, inf or `null` in a
200, on every route: scores and pooled vectors (/v1/score), relevance (/v1/rerank), embeddings (/v1/embeddings),
option probabilities (/v1/decisions, /v1/systemone)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scorekeeper_worker.engine.runner import forward
from serving import RunningServer

EXTREME = [5e-324, 1e-300, 1e-30, 1e30, 1e300, 1.7976931348623157e308]
QUERY, ITEMS = [20, 21, 22], [[30, 31], [40], [50, 51, 52, 53]]


def _finite(rows: list[list[float]]) -> bool:
    return all(isinstance(x, float) and math.isfinite(x) for row in rows for x in row)


@pytest.mark.parametrize(("name", "extra"), [("qwen3-cls3", {}), ("qwen2-reward", {}), ("bert-cross", {}),
                                             ("llama-causal", {"label_token_ids": [5, 17, 42]})])
@pytest.mark.parametrize("temperature", EXTREME)
def test_extreme_temperatures_give_finite_limits(name: str, extra: dict[str, list[int]], temperature: float,
                                                 tiny_model: Callable[[str], Path],
                                                 server_for: Callable[..., RunningServer]) -> None:
    """`temperature: 1e-300` used to answer `"scores": [[null, null]]` with 200."""
    server = server_for(tiny_model(name))
    raw = server.score(query=QUERY, items=ITEMS, apply_softmax=False, **extra).json()["scores"]
    response = server.score(query=QUERY, items=ITEMS, apply_softmax=True, temperature=temperature, **extra)
    assert response.status_code == 200, response.text
    scores = response.json()["scores"]
    assert _finite(scores), scores
    for raw_row, row in zip(raw, scores, strict=True):
        if len(row) == 1:  # sigmoid(logit / T): 0 or 1 for tiny T (0.5 at 0), 0.5 for huge T
            want = 0.5 if temperature > 1 else float(raw_row[0] > 0)
            assert row[0] == pytest.approx(want, abs=1e-6)
        elif temperature < 1:  # one-hot at the arg-max (causal LM: raw scores are probabilities, same order)
            assert row == [float(i == int(np.argmax(raw_row))) for i in range(len(row))]
        else:  # uniform
            assert row == pytest.approx([1 / len(row)] * len(row), abs=1e-6)


@pytest.mark.parametrize("temperature", [*EXTREME, 1.0])
def test_heads_keep_huge_logits_finite(temperature: float) -> None:
    logits = torch.tensor([[3e38, -3e38, 1e38], [0.0, 0.0, 0.0], [1e-40, 0.0, -1e-40]], dtype=torch.float32)
    probabilities = forward.classifier_scores(logits, apply_softmax=True, temperature=temperature)
    assert torch.isfinite(probabilities).all()
    assert probabilities.sum(dim=-1).tolist() == pytest.approx([1.0] * 3)
    assert probabilities[1].tolist() == pytest.approx([1 / 3] * 3)  # ties share
    single = forward.classifier_scores(logits[:, :1], apply_softmax=True, temperature=temperature)
    assert torch.isfinite(single).all() and ((single >= 0) & (single <= 1)).all()


def test_overflowing_model_is_a_500_never_a_200(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """A head whose logits overflow float32: the start-up self-check refuses it; served without the check, its
    requests fail with a 500 that says why."""
    path = tmp_path / "overflow"
    shutil.copytree(tiny_model("qwen2-reward"), path)
    weights = load_file(path / "model.safetensors")
    weights["score.weight"] = torch.full_like(weights["score.weight"], 3e38)  # any row of 32 floats overflows
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=r"self-check failed: .* by inf \(non-finite scores"):
        RunningServer(model=path)
    server = RunningServer(model=path, self_check=False)
    try:
        response = server.score(query=QUERY, items=ITEMS)
        assert response.status_code == 500
        assert "non-finite score" in response.json()["message"]
    finally:
        server.stop()


def _overflowing(source: Path, target: Path, edits: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> Path:
    """A copy of a tiny model with some weights replaced (each edit maps the old tensor to the new one)."""
    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    for name, edit in edits.items():
        weights[name] = edit(weights[name])
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def _inf_at(index: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor[index] = float("inf")
        return tensor
    return edit


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[[Path], RunningServer]]:
    """Servers on models that overflow (their start-up self-check would refuse them), stopped after the test."""
    servers: list[RunningServer] = []

    def start(path: Path) -> RunningServer:
        servers.append(RunningServer(model=path, self_check=False))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("items", [2, 200])
def test_a_non_finite_pooled_vector_is_a_500(items: int, tiny_model: Callable[[str], Path], tmp_path: Path,
                                             served: Callable[[Path], RunningServer]) -> None:
    """RoBERTa with an outlier dimension in its last LayerNorm: that dimension of every pooled vector is inf, while
    its classifier (dense → tanh → out_proj, tanh(inf) = 1) keeps the scores finite. The pooled vectors used to be
    answered as `null` with 200; the scores alone are still a 200. 200 items: 6,400 pooled floats, checked in a
    worker thread (service.FINITE_CHECK_ON_LOOP)."""
    layer_norm = "roberta.encoder.layer.1.output.LayerNorm"
    path = _overflowing(tiny_model("roberta-cross"), tmp_path / "outlier", {
        f"{layer_norm}.bias": _inf_at(5), f"{layer_norm}.weight": lambda w: w.index_fill(0, torch.tensor([5]), 0.0),
        "classifier.dense.weight": lambda w: w.index_fill(1, torch.tensor([5]), 1.0)})
    server = served(path)
    texts = [f"town {i}" for i in range(items)]
    scores = server.score(query="capital of France", items=texts)
    assert scores.status_code == 200 and _finite(scores.json()["scores"]), scores.text
    pooled = server.score(query="capital of France", items=texts, return_pooled_hidden_states=True)
    assert pooled.status_code == 500, pooled.text
    assert "non-finite" in pooled.json()["message"]


def test_rerank_of_an_overflowing_model_is_a_500(tiny_model: Callable[[str], Path], tmp_path: Path,
                                                 served: Callable[[Path], RunningServer]) -> None:
    path = _overflowing(tiny_model("qwen2-reward"), tmp_path / "reward", {"score.weight": lambda w: w.fill_(3e38)})
    response = httpx.post(served(path).url + "/v1/rerank", json={"query": "capital", "documents": ["Paris", "x"]},
                          timeout=120)
    assert response.status_code == 500, response.text
    assert "non-finite" in response.json()["message"]


def test_embeddings_of_an_overflowing_model_are_a_500(tiny_model: Callable[[str], Path], tmp_path: Path,
                                                      served: Callable[[Path], RunningServer]) -> None:
    path = _overflowing(tiny_model("bert-embed"), tmp_path / "embed", {"encoder.layer.1.output.LayerNorm.bias":
                                                                       _inf_at(3)})
    response = httpx.post(served(path).url + "/v1/embeddings", json={"input": ["Paris", "Berlin"]}, timeout=120)
    assert response.status_code == 500, response.text
    assert "non-finite" in response.json()["message"]


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/decisions", {"model": "any", "input": "I was charged twice.",
                       "questions": [{"type": "predicate", "instructions": "Is it about billing?"}]}),
    ("/v1/systemone", {"model": "any", "state": "I was charged twice.",
                       "questions": {"billing": {"type": "noul", "instructions": "Is it about billing?"}}})])
def test_decisions_of_an_overflowing_model_are_a_500(route: str, body: dict[str, object],
                                                     tiny_model: Callable[[str], Path], tmp_path: Path,
                                                     served: Callable[[Path], RunningServer]) -> None:
    """The final norm overflows float32: every logit, and so every option's probability, is NaN."""
    path = _overflowing(tiny_model("qwen3-causal"), tmp_path / "causal", {"model.norm.weight": lambda w: w.fill_(3e38)})
    response = httpx.post(served(path).url + route, json=body, timeout=120)
    assert response.status_code == 500, response.text
    assert "non-finite" in response.json()["message"]
