"""Bad input gets a 400 naming the field; overload gets 429; neither harms other requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from scorekeeper_worker.api.error_shape import error_for
from scorekeeper_worker.base.errors import Invalid
from serving import BatchGate, RunningServer

CAUSAL_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing items", {"query": "q"}, "items"),
    ("null items", {"query": "q", "items": None}, "items"),
    ("mixed kinds", {"query": "q", "items": [[1, 2]], "label_token_ids": [1]}, "items"),
    ("labels missing", {"query": "q", "items": ["a"]}, "label_token_ids"),
    ("labels empty", {"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids"),
    ("labels duplicated", {"query": "q", "items": ["a"], "label_token_ids": [4, 4]}, "label_token_ids"),
    ("labels negative", {"query": "q", "items": ["a"], "label_token_ids": [-1]}, "label_token_ids"),
    ("labels beyond logits", {"query": "q", "items": ["a"], "label_token_ids": [10**6]}, "label_token_ids"),
    ("labels per item count", {"query": "q", "items": ["a", "b"], "label_token_ids": [[1]]}, "label_token_ids"),
    ("labels wrong type", {"query": "q", "items": ["a"], "label_token_ids": "bad"}, "label_token_ids"),
    ("items wrong type", {"query": "q", "items": 42, "label_token_ids": [1]}, "items"),
    ("pooled on causal", {"query": "q", "items": ["a"], "label_token_ids": [1], "return_pooled_hidden_states": True},
     "return_pooled_hidden_states"),
    ("too long query", {"query": [5] * 3000, "items": [[6]], "label_token_ids": [1]}, "query"),
    ("too long item", {"query": [5], "items": [[6], [6] * 3000], "label_token_ids": [1]}, "items[1]"),
    ("query id out of range", {"query": [10**7], "items": [[6]], "label_token_ids": [1]}, "query"),
    ("item id out of range", {"query": [5], "items": [[-3]], "label_token_ids": [1]}, "items"),
    ("empty sequence", {"query": [], "items": [[]], "label_token_ids": [1]}, "items"),
    ("temperature zero", {"query": "q", "items": ["a"], "label_token_ids": [1], "apply_softmax": True,
                          "temperature": 0}, "temperature"),
    ("temperature infinite", {"query": "q", "items": ["a"], "label_token_ids": [1], "apply_softmax": True,
                              "temperature": float("inf")}, "temperature"),
    ("temperature without softmax", {"query": "q", "items": ["a"], "label_token_ids": [1], "temperature": 2.0},
     "temperature"),
    ("too many items", {"query": "q", "items": ["a"] * 65, "label_token_ids": [1]}, "items"),
    ("unsupported SGLang field", {"query": "q", "items": ["a"], "label_token_ids": [1],
                                  "score_extraction_token": "<x>"}, "score_extraction_token"),
]


@pytest.fixture(scope="module")
def causal(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> RunningServer:
    return server_for(tiny_model("qwen3-causal"), max_items_per_request=64)


@pytest.mark.parametrize(("case", "body", "field"), CAUSAL_CASES, ids=[c[0] for c in CAUSAL_CASES])
def test_bad_request_names_the_field(causal: RunningServer, case: str, body: dict[str, Any], field: str) -> None:
    response = httpx.post(causal.url + "/v1/score", content=json.dumps(body),  # allows Infinity, as clients may send
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["object"] == "error" and error["code"] == 400
    assert error["message"].startswith(field), error["message"]  # the field first: `field: problem`


def test_invalid_carries_its_field_and_the_400_names_it_first() -> None:
    error = Invalid("label_token_ids", "must not be empty")
    assert error.field == "label_token_ids"
    body, _ = error_for(error, "POST", "/v1/score", "request-1")
    assert (body.code, body.type, body.message) == (400, "BadRequestError", "label_token_ids: must not be empty")


def test_per_item_label_lists_may_differ_in_length(causal: RunningServer) -> None:
    mixed = causal.score(query="q", items=["a", "b"], label_token_ids=[[1, 2], [3]]).json()["scores"]
    first = causal.score(query="q", items=["a"], label_token_ids=[1, 2]).json()["scores"][0]
    second = causal.score(query="q", items=["b"], label_token_ids=[3]).json()["scores"][0]
    np.testing.assert_allclose(mixed[0], first, rtol=1e-5)
    np.testing.assert_allclose(mixed[1], second, rtol=1e-5)


def test_empty_items_score_nothing(causal: RunningServer) -> None:
    body = causal.score(query="q", items=[], label_token_ids=[1]).json()
    assert body["scores"] == [] and body["usage"]["prompt_tokens"] == 0


def test_model_name_is_echoed_never_rejected(causal: RunningServer) -> None:
    body = causal.score(query="q", items=["a"], label_token_ids=[1], model="/some/path/Qwen3").json()
    assert body["model"] == "/some/path/Qwen3" and body["object"] == "scoring"


def test_body_over_limit_is_413(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_request_bytes=2048)
    response = server.score(query="q", items=["x" * 4000])
    assert response.status_code == 413
    chunked = httpx.post(server.url + "/v1/score", content=iter([b'{"query": "q", "items": ["', b"x" * 4000, b'"]}']),
                         headers={"content-type": "application/json"}, timeout=30)
    assert chunked.status_code == 413, chunked.text
    assert server.score(query="q", items=["fine"]).status_code == 200


def test_full_queue_gives_429_and_keeps_serving(tiny_model: Callable[[str], Path],
                                                server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_queue_tokens=4000, max_batch_tokens=1024)
    items = [[7 + (i % 200)] * 40 for i in range(90)]  # 90 × 42 tokens ≈ one full queue per request
    expected = server.score(query=[1, 2], items=items).json()["scores"]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(server.url + "/v1/score", json={"query": [1, 2], "items": items}) for _ in range(11)]
            return await asyncio.gather(*calls)

    # The first request's first batch is held (a scheduler observer), so the rest of it fills the queue while the
    # burst arrives, on any machine.
    with BatchGate(server.scheduler, hold=True) as gate, ThreadPoolExecutor(1) as pool:
        first = pool.submit(server.score, query=[1, 2], items=items)
        gate.wait_held()
        responses = asyncio.run(burst())
        gate.release()
        assert first.result().status_code == 200
    assert [r.status_code for r in responses] == [429] * 11
    assert all(r.headers.get("retry-after") == "1" for r in responses)
    np.testing.assert_allclose(first.result().json()["scores"], expected, rtol=1e-5)
    after = server.score(query=[1, 2], items=items)
    assert after.status_code == 200
    np.testing.assert_allclose(after.json()["scores"], expected, rtol=1e-5)
