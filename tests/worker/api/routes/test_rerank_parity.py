"""/v1/rerank speaks Cohere v2 and Jina: their published request examples get responses of their published shape,
Cohere's own Python client (ClientV2, which posts to /v2/rerank) parses them, documents may be objects whose ids
are echoed, `top_n` is bounded, and equal scores keep request order."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from scorekeeper_worker.api.routes.rerank import best_per_document, ranked
from serving import RunningServer

# docs.cohere.com, v2 "Rerank" API reference: the request example, and the fields of its response example
# {"results": [{"index": 3, "relevance_score": 0.999071}, ...], "id": "07734bd2-...", "meta": {...}}.
COHERE_V2_EXAMPLE = {
    "model": "rerank-v3.5",
    "query": "What is the capital of the United States?",
    "top_n": 3,
    "documents": [
        "Carson City is the capital city of the American state of Nevada.",
        "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean. Its capital "
        "is Saipan.",
        "Washington, D.C. (also known as simply Washington or D.C., and officially as the District of Columbia) is "
        "the capital of the United States. It is a federal district.",
        "Capitalization or capitalisation in English grammar is the use of a capital letter at the start of a word.",
        "Capital punishment has existed in the United States since before the United States was a country.",
    ],
}
# jina.ai/reranker API example: documents as strings, return_documents; response
# {"model": ..., "usage": {"total_tokens": 815}, "results": [{"index": 0, "document": {"text": ...},
# "relevance_score": 0.93}, ...]}.
JINA_EXAMPLE = {
    "model": "jina-reranker-v2-base-multilingual",
    "query": "Organic skincare products for sensitive skin",
    "top_n": 3,
    "documents": [
        "Organic skincare for sensitive skin with aloe vera and chamomile.",
        "New makeup trends focus on bold colors and innovative techniques.",
        "Bio-Hautpflege für empfindliche Haut mit Aloe Vera und Kamille.",
        "Neue Make-up-Trends setzen auf kräftige Farben und innovative Techniken.",
    ],
    "return_documents": True,
}


def _rerank(server: RunningServer, body: dict[str, Any], status: int = 200, path: str = "/v1/rerank") -> Any:
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def _expected(model: Any, tok: Any, query: str, documents: list[str]) -> list[float]:
    return [reference.classifier_scores(model, *reference.encode_pair(tok, query, d, False), apply_softmax=True)[0]
            for d in documents]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_v2_example(cross: tuple[RunningServer, Any, Any], path: str) -> None:
    server, model, tok = cross
    body = _rerank(server, COHERE_V2_EXAMPLE, path=path)
    assert set(body) == {"id", "model", "results", "usage"} and isinstance(body["id"], str) and body["id"]
    assert body["model"] == "rerank-v3.5"
    expected = _expected(model, tok, COHERE_V2_EXAMPLE["query"], COHERE_V2_EXAMPLE["documents"])
    order = sorted(range(5), key=lambda i: -expected[i])[:3]
    assert [set(r) for r in body["results"]] == [{"index", "relevance_score"}] * 3  # no document unless asked
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], [expected[i] for i in order],
                               rtol=1e-4)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] == sum(
        len(tok([COHERE_V2_EXAMPLE["query"]], [d])["input_ids"][0]) for d in COHERE_V2_EXAMPLE["documents"])


def test_cohere_client_v2_parses_the_response(cross: tuple[RunningServer, Any, Any]) -> None:
    import cohere

    server, model, tok = cross
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    example = COHERE_V2_EXAMPLE
    response = client.rerank(model=example["model"], query=example["query"], documents=example["documents"],
                             top_n=2, max_tokens_per_doc=4096)
    expected = _expected(model, tok, example["query"], example["documents"])
    assert [r.index for r in response.results] == sorted(range(5), key=lambda i: -expected[i])[:2]
    assert all(math.isclose(r.relevance_score, expected[r.index], rel_tol=1e-4) for r in response.results)
    assert response.id


def test_jina_example(cross: tuple[RunningServer, Any, Any]) -> None:
    server, _, _ = cross
    body = _rerank(server, JINA_EXAMPLE)
    results = body["results"]
    assert len(results) == 3 and [set(r) for r in results] == [{"index", "relevance_score", "document"}] * 3
    assert all(r["document"] == {"text": JINA_EXAMPLE["documents"][r["index"]]} for r in results)
    assert isinstance(body["usage"]["total_tokens"], int) and body["usage"]["total_tokens"] > 0
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)


def test_document_objects_echo_their_ids(cross: tuple[RunningServer, Any, Any]) -> None:
    server, model, tok = cross
    query = "what is the capital of france?"
    documents = [{"text": "paris is the capital of france.", "id": "doc-paris"}, "a banana is yellow.",
                 {"text": "berlin is a large city.", "id": 42}, {"text": "the dog likes to run in the park."}]
    body = _rerank(server, {"query": query, "documents": documents, "return_documents": True})
    texts = [d if isinstance(d, str) else d["text"] for d in documents]
    expected = _expected(model, tok, query, texts)
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -expected[i])
    for result in body["results"]:
        document = documents[result["index"]]
        assert result["document"] == {"text": texts[result["index"]]}
        if isinstance(document, dict) and "id" in document:
            assert result["id"] == document["id"]  # a string or an integer, as sent
        else:
            assert "id" not in result


@pytest.mark.parametrize(("top_n", "count"), [(1, 1), (3, 3), (4, 4), (1000, 4), (None, 4)])
def test_top_n_bounds_the_results(cross: tuple[RunningServer, Any, Any], top_n: int | None, count: int) -> None:
    server, _, _ = cross
    body = _rerank(server, {"query": "q", "documents": ["a", "b", "c", "d"], "top_n": top_n})
    assert len(body["results"]) == count and len({r["index"] for r in body["results"]}) == count


@pytest.mark.parametrize("top_n", [0, -1, 2.5, True, "2"])
def test_invalid_top_n_is_a_400_naming_it(cross: tuple[RunningServer, Any, Any], top_n: Any) -> None:
    server, _, _ = cross
    error = _rerank(server, {"query": "q", "documents": ["a"], "top_n": top_n}, 400)
    assert error["message"].startswith("top_n"), error


@pytest.mark.parametrize(("documents", "where"), [
    ([{"id": "x"}], "documents[0].text"), ([{"text": "a", "id": 1.5}], "documents[0].id"),
    ([{"text": "a", "id": True}], "documents[0].id"), ([3], "documents[0]"), ([None], "documents[0]"),
])
def test_invalid_documents_are_a_400_naming_them(cross: tuple[RunningServer, Any, Any], documents: list[Any],
                                                 where: str) -> None:
    server, _, _ = cross
    error = _rerank(server, {"query": "q", "documents": documents}, 400)
    assert error["message"].startswith(where), error


def test_equal_scores_keep_request_order(cross: tuple[RunningServer, Any, Any]) -> None:
    assert ranked([0.5, 0.9, 0.5, 0.9, 0.5], None) == [1, 3, 0, 2, 4]
    assert ranked([0.5, 0.9, 0.5, 0.9, 0.5], 3) == [1, 3, 0]
    assert best_per_document([0.1, 0.7, 0.3, 0.2], [0, 0, 1, 1], 3) == [0.7, 0.3, float("-inf")]
    server, _, _ = cross
    documents = ["the dog", "paris is the capital", "the dog", "paris is the capital", "the dog"]
    results = _rerank(server, {"query": "what is the capital?", "documents": documents})["results"]
    # Identical documents may differ in the last bit (their place in a batch), so check the order the scores say.
    for first, second in itertools.pairwise(results):
        assert (first["relevance_score"], -first["index"]) > (second["relevance_score"], -second["index"])
    assert _rerank(server, {"query": "q", "documents": []})["results"] == []


def test_embedding_models_rank_by_cosine(tiny_model: Callable[[str], Path],
                                         server_for: Callable[..., RunningServer]) -> None:
    path = tiny_model("bert-embed")
    model, tok, _ = reference.load_model(path)
    documents = ["paris is the capital of france.", "a banana is yellow.", "the dog likes to run."]
    body = _rerank(server_for(path), {"query": "what is the capital of france?", "documents": documents})
    expected = [reference.embedding_scores(model, tok("what is the capital of france?")["input_ids"],
                                           tok(d)["input_ids"])[0] for d in documents]
    assert [r["index"] for r in body["results"]] == sorted(range(3), key=lambda i: -expected[i])
    np.testing.assert_allclose(sorted(r["relevance_score"] for r in body["results"]), sorted(expected), rtol=1e-4)


def test_a_causal_lm_without_label_tokens_says_how_to_rerank(tiny_model: Callable[[str], Path],
                                                            server_for: Callable[..., RunningServer]) -> None:
    error = _rerank(server_for(tiny_model("qwen3-causal")), {"query": "q", "documents": ["a"]}, 400)
    assert error["message"].startswith("model: /v1/rerank on a causal LM needs label tokens")
    assert "--label-tokens" in error["message"]
