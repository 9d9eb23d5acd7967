"""Every score in a 200 is a finite number: any finite temperature > 0 is computed without overflow (its limits:
arg-max one-hot and uniform), huge logits stay finite, and a model that overflows gets a 500, never NaN in a 200."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

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
