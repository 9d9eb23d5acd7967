"""POST /v1/embeddings (OpenAI): the published example's shape, OpenAI's own Python client (which asks for base64),
every input form, sentence-transformers' normalisation as the model directory says, and refusals that name the
field. The real all-MiniLM-L6-v2 against sentence-transformers is in test_real_rerankers.py."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from serving import RunningServer

# platform.openai.com, "Create embeddings": the request example and the fields of its response example
# {"object": "list", "data": [{"object": "embedding", "embedding": [0.0023064255, ...], "index": 0}],
#  "model": "text-embedding-ada-002", "usage": {"prompt_tokens": 8, "total_tokens": 8}}.
OPENAI_EXAMPLE = {"input": "The food was delicious and the waiter...", "model": "text-embedding-ada-002",
                  "encoding_format": "float"}
TEXTS = ["paris is the capital of france.", "", "the dog likes to run in the park."]


@pytest.fixture(scope="module")
def embed(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> tuple[RunningServer, Any,
                                                                                               Any]:
    path = tiny_model("bert-embed")  # no Normalize module: the pooled vectors as they are
    model, tok, _ = reference.load_model(path)
    return server_for(path, max_items_per_request=8), model, tok


def _embeddings(server: RunningServer, body: dict[str, Any], status: int = 200) -> Any:
    response = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def test_openai_example(embed: tuple[RunningServer, Any, Any]) -> None:
    server, model, tok = embed
    body = _embeddings(server, OPENAI_EXAMPLE)
    assert set(body) == {"object", "data", "model", "usage"} and body["object"] == "list"
    assert body["model"] == "text-embedding-ada-002"
    (row,) = body["data"]
    assert set(row) == {"object", "index", "embedding"} and row["object"] == "embedding" and row["index"] == 0
    ids = tok(OPENAI_EXAMPLE["input"])["input_ids"]
    np.testing.assert_allclose(row["embedding"], reference.embedding_pooled(model, ids), rtol=1e-4, atol=1e-5)
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens"}
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == len(ids)


@pytest.mark.parametrize("form", ["texts", "text", "token-ids", "token-id-lists"])
def test_every_input_form(embed: tuple[RunningServer, Any, Any], form: str) -> None:
    server, model, tok = embed
    ids = [tok(text)["input_ids"] for text in TEXTS]
    value: Any = {"texts": TEXTS, "text": TEXTS[0], "token-ids": ids[0], "token-id-lists": ids}[form]
    count = 3 if form in ("texts", "token-id-lists") else 1
    body = _embeddings(server, {"input": value})
    assert [row["index"] for row in body["data"]] == list(range(count))
    expected = [reference.embedding_pooled(model, sequence) for sequence in ids[:count]]
    np.testing.assert_allclose([row["embedding"] for row in body["data"]], expected, rtol=1e-4, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(len(sequence) for sequence in ids[:count])


def test_openai_client_reads_base64(embed: tuple[RunningServer, Any, Any]) -> None:
    import openai

    server, _, _ = embed
    floats = _embeddings(server, {"input": TEXTS})["data"]
    encoded = _embeddings(server, {"input": TEXTS, "encoding_format": "base64"})["data"]
    decoded = [np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in encoded]
    np.testing.assert_array_equal(decoded, np.array([row["embedding"] for row in floats], dtype=np.float32))
    client = openai.OpenAI(api_key="unused", base_url=server.url + "/v1")
    response = client.embeddings.create(input=TEXTS, model="tiny")  # the client asks for base64 and decodes it
    assert [row.index for row in response.data] == [0, 1, 2] and response.usage.prompt_tokens > 0
    np.testing.assert_allclose([row.embedding for row in response.data], decoded, rtol=0, atol=0)


def test_a_normalize_module_gives_unit_vectors(tiny_model: Callable[[str], Path],
                                               server_for: Callable[..., RunningServer], tmp_path: Path) -> None:
    path = tmp_path / "normalized"
    shutil.copytree(tiny_model("bert-embed"), path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    model, tok, _ = reference.load_model(path)
    body = _embeddings(server_for(path), {"input": TEXTS})
    pooled = np.array([reference.embedding_pooled(model, tok(text)["input_ids"]) for text in TEXTS])
    np.testing.assert_allclose([row["embedding"] for row in body["data"]],
                               pooled / np.linalg.norm(pooled, axis=1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_long_inputs_are_refused_or_cut(embed: tuple[RunningServer, Any, Any]) -> None:
    server, model, tok = embed
    long = "the dog likes to run in the park. " * 80
    error = _embeddings(server, {"input": ["short", long]}, 400)
    assert error["message"].startswith("input[1]: sequence of ") and "maximum of 512" in error["message"]
    body = _embeddings(server, {"input": [long], "truncate": True, "truncation_direction": "left"})
    tok.truncation_side = "left"
    ids = tok(long, truncation=True, max_length=512)["input_ids"]
    tok.truncation_side = "right"
    np.testing.assert_allclose(body["data"][0]["embedding"], reference.embedding_pooled(model, ids), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize(("body", "where"), [
    ({"input": "a", "dimensions": 16}, "dimensions: this model's embeddings have 32 dimensions"),
    ({"input": ["a"] * 9}, "input: 9 items exceed the limit of 8"),
    ({"input": [1, "a"]}, "input[1]"), ({"input": 5}, "input"), ({}, "input"), ({"input": "a", "user": 3}, "user"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"), ({"input": [[10 ** 6]]}, "input: token id"),
    ({"input": [0.5]}, "input[0]"), ({"input": [[1, 2.5]]}, "input[0][1]"),
])
def test_refusals_name_the_field(embed: tuple[RunningServer, Any, Any], body: dict[str, Any], where: str) -> None:
    server, _, _ = embed
    assert _embeddings(server, body, 400)["message"].startswith(where)


def test_only_embedding_models_embed(embed: tuple[RunningServer, Any, Any], tiny_model: Callable[[str], Path],
                                     server_for: Callable[..., RunningServer]) -> None:
    server, _, _ = embed
    assert _embeddings(server, {"input": "a", "dimensions": 32})["data"][0]["index"] == 0
    assert _embeddings(server, {"input": []}) == {"object": "list", "data": [], "model": "bert-embed",
                                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}}
    error = _embeddings(server_for(tiny_model("bert-cross")), {"input": "a"}, 400)
    assert error["message"] == ("model: /v1/embeddings needs an embedding model; this server serves a cross_encoder "
                                "(use /v1/score or /v1/rerank)")


def test_token_ids_written_as_integral_numbers_are_token_ids(embed: tuple[RunningServer, Any, Any]) -> None:
    """JSON Schema (the OpenAPI document's language) reads 0.0 as the integer 0, and so does /v1/score: the same
    vector as [0] (schemathesis sent {"input": [0.0]} and got "not a string")."""
    server, _, _ = embed
    as_float = _embeddings(server, {"input": [0.0, 5.0]})["data"][0]["embedding"]
    assert as_float == _embeddings(server, {"input": [0, 5]})["data"][0]["embedding"]
