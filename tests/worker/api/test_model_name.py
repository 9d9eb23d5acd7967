"""One name for the served model: what GET /v1/models lists is what a response says when the request names no model
(`--served-name`, else the model directory's name). A request that names a model gets that name back, as SGLang,
Cohere and OpenAI clients expect: they send the name they were configured with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import RunningServer

ROUTES: dict[str, dict[str, Any]] = {
    "/v1/score": {"query": "q", "items": ["a", "b"]},
    "/v1/rerank": {"query": "q", "documents": ["a", "b"]},
}


def _listed(server: RunningServer) -> list[str]:
    return [card["id"] for card in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]


@pytest.mark.parametrize("served_name", [None, "ranker"])
def test_a_request_without_a_model_is_answered_with_the_listed_name(
        served_name: str | None, tiny_model: Callable[[str], Path],
        server_for: Callable[..., RunningServer]) -> None:
    path = tiny_model("qwen3-cls3")
    server = server_for(path, **({"served_name": served_name} if served_name else {}))
    assert _listed(server) == [served_name or path.name]
    for route, body in ROUTES.items():
        response = httpx.post(server.url + route, json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == (served_name or path.name), route
        named = httpx.post(server.url + route, json=body | {"model": "their-name"}, timeout=60)
        assert named.json()["model"] == "their-name", route


def test_embeddings_without_a_model_are_answered_with_the_listed_name(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("bert-embed"), served_name="embedder")
    assert _listed(server) == ["embedder"]
    for body in ({"input": "a"}, {"input": []}):
        response = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert response.status_code == 200 and response.json()["model"] == "embedder", response.text
    named = httpx.post(server.url + "/v1/embeddings", json={"input": "a", "model": "text-embedding-3-small"},
                       timeout=60)
    assert named.json()["model"] == "text-embedding-3-small"
