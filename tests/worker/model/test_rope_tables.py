"""RoPE tables per sequence: a score never depends on what else is in the packed batch (issue 22, defects 1 and 4).

transformers picks the RoPE table from the longest position of the whole forward (`longrope`: short or long
factors; `dynamic`: rescaled beyond the maximum, and kept so until a shorter forward resets it). The worker packs
many sequences into one row, so the choice must be made for each sequence, as its own forward would make it."""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import reference
from engine_runs import one_batch, variant
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import load_model
from serving import BatchGate, RunningServer, wait_until

LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [4.0, 8.0, 16.0, 32.0]}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
DELIMITER = 3


def _ids(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(10, 250) for _ in range(length)]


@pytest.fixture(scope="module")
def longrope_reward(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 reward model as a longrope checkpoint with original_max_position_embeddings 64."""
    return variant(tiny_model("qwen2-reward"), tmp_path_factory.mktemp("rope") / "qwen2-longrope",
                   rope_parameters=LONGROPE)


@pytest.fixture(scope="module")
def dynamic_reward(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 reward model with dynamic NTK RoPE and a maximum of 64 positions."""
    return variant(tiny_model("qwen2-reward"), tmp_path_factory.mktemp("rope") / "qwen2-dynamic",
                   rope_parameters=DYNAMIC, max_position_embeddings=64)


def _expected(path: Path, query: list[int], items: list[list[int]]) -> list[list[float]]:
    model, _, _ = reference.load_model(path)
    return [reference.classifier_scores(model, query + item, None, False) for item in items]


def test_longrope_short_request_alone_and_co_batched_with_long_items(longrope_reward: Path) -> None:
    """The issue's case: a 30-token request scores the same alone and packed with 220-token items."""
    rng = random.Random(1)
    model = load_model(longrope_reward, DType.FLOAT32, "cpu", "t")
    short = ScoreRequest(query=_ids(rng, 12), items=[_ids(rng, 18)])
    long = ScoreRequest(query=_ids(rng, 20), items=[_ids(rng, 200), _ids(rng, 200)])
    alone = one_batch(model, [short])[0]
    co_batched, long_rows = one_batch(model, [short, long])
    expected = _expected(longrope_reward, short.query, short.items)  # type: ignore[arg-type]
    np.testing.assert_allclose(alone, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(co_batched, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(long_rows, _expected(longrope_reward, long.query, long.items),  # type: ignore[arg-type]
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("delimiter", [None, DELIMITER])
def test_longrope_multi_item_items_on_both_sides_of_the_original_maximum(longrope_reward: Path,
                                                                         delimiter: int | None) -> None:
    """Under multi-item scoring the query is shared: items whose sequence is short and items whose sequence is long
    need different tables for the query too."""
    rng = random.Random(2)
    model = load_model(longrope_reward, DType.FLOAT32, "cpu", "t")
    query = _ids(rng, 30)
    items = [_ids(rng, n) for n in (5, 34, 33, 35, 0, 90, 1)]  # 30 + 34 = 64: the last short one; 65: the first long
    rows = one_batch(model, [ScoreRequest(query=query, items=items)], multi_item=True, delimiter=delimiter)[0]
    np.testing.assert_allclose(rows, _expected(longrope_reward, query, items), rtol=1e-4, atol=1e-5)


def test_longrope_concurrent_clients_over_http(longrope_reward: Path,
                                               server_for: Callable[..., RunningServer]) -> None:
    """Through the real server: the short request queued behind a held batch, together with a client sending long
    items, lands in one batch with them and still scores what it scores alone."""
    rng = random.Random(3)
    server = server_for(longrope_reward)
    short = {"query": _ids(rng, 12), "items": [_ids(rng, 18)]}
    long = {"query": _ids(rng, 20), "items": [_ids(rng, 200)]}
    alone = server.score(**short).json()["scores"]
    with BatchGate(server.scheduler, hold=True) as gate, concurrent.futures.ThreadPoolExecutor(3) as pool:
        blocker = pool.submit(server.score, query=[5], items=[[6]])
        gate.wait_held()
        queued = [pool.submit(server.score, **short), pool.submit(server.score, **long)]
        wait_until("both requests queued", lambda: server.scheduler.queued_tokens >= 230)
        gate.release()
        responses = [future.result() for future in queued]
        assert blocker.result().status_code == 200
    assert all(response.status_code == 200 for response in responses)
    assert any(len({id(job) for job, _ in batch}) == 2 for batch in gate.batches[1:]), "not co-batched"
    np.testing.assert_allclose(responses[0].json()["scores"], alone, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(alone, _expected(longrope_reward, short["query"], short["items"]), rtol=1e-4,
                               atol=1e-5)


def test_dynamic_rope_multi_item_delimiter_at_the_maximum(dynamic_reward: Path) -> None:
    """query + item fills all 64 positions: the item's delimiter must not land at position 64 (transformers would
    rescale RoPE for the whole batch), and nothing of that batch may carry into the next forward."""
    rng = random.Random(4)
    model = load_model(dynamic_reward, DType.FLOAT32, "cpu", "t")
    query = _ids(rng, 24)
    edge = ScoreRequest(query=query, items=[_ids(rng, 40), _ids(rng, 7)])
    other = ScoreRequest(query=_ids(rng, 10), items=[_ids(rng, 20)])
    full = ScoreRequest(query=[], items=[_ids(rng, 64)])  # exactly the maximum: transformers' cache boundary
    edge_rows, other_rows = one_batch(model, [edge, other], multi_item=True, delimiter=DELIMITER)
    np.testing.assert_allclose(edge_rows, _expected(dynamic_reward, query, edge.items),  # type: ignore[arg-type]
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(other_rows, _expected(dynamic_reward, other.query, other.items),  # type: ignore[arg-type]
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(one_batch(model, [full])[0], _expected(dynamic_reward, [], full.items),  # type: ignore[arg-type]
                               rtol=1e-4, atol=1e-5)
