"""Property-based fuzzing of the HTTP contract from the worker's own OpenAPI document (schemathesis, every check).

The schemathesis command line runs against real servers on loopback with every check it has (`--checks all`: status
codes, content types, headers and bodies as declared, schema-invalid bodies refused with 4xx, schema-valid bodies
accepted, 405s with Allow, auth not ignored, no 5xx, ...), derandomized and bounded for CI. tests/fuzz/ holds the
configuration it shares with scripts/fuzz.sh (the long, randomly seeded run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from serving import RunningServer, free_port

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "tests" / "fuzz" / "schemathesis.toml"
KEY = "fuzz-key-0123456789"


def schemathesis(url: str, examples: int, *extra: str) -> str:
    command = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(CONFIG), "run",
               url + "/openapi.json", "--checks", "all", "--max-examples", str(examples),
               "--generation-deterministic", "--workers", "1", "--no-color", *extra]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "COLUMNS": "200"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]  # warnings aside (see test_every_check_passes), no failure
    return output


def cases(output: str) -> int:
    match = re.search(r"(\d+) generated, (\d+) passed", output)
    assert match and match[1] == match[2], output[-2000:]
    return int(match[1])


@pytest.mark.parametrize("model", ["qwen3-cls3", "qwen3-causal", "bert-cross"])
def test_every_check_passes(model: str, tiny_model: Callable[[str], Path],
                            server_for: Callable[..., RunningServer]) -> None:
    """A decoder classifier, a causal LM with the decision routes and a cross-encoder. On the causal LM schemathesis
    also warns that most generated bodies are refused: they lack label_token_ids, which only a causal LM needs (the
    hooks accept that reason, and only reasons of that kind)."""
    server = server_for(tiny_model(model), max_items_per_request=64)
    paths = httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]
    scoring = [path for path in paths if "post" in paths[path]]  # the routes this model serves
    assert len(scoring) == (5 if model == "qwen3-causal" else 3), scoring  # with /v1/decisions and /v1/systemone
    assert cases(schemathesis(server.url, 300)) >= 300 * len(scoring)  # every scoring route got its 300 bodies


def test_every_check_passes_with_api_keys_and_a_metrics_port(tiny_model: Callable[[str], Path],
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEY + "\n")
    server = RunningServer(model=tiny_model("qwen3-cls3"), api_key_file=keys, metrics_port=free_port())
    try:  # ignored_auth checks that each /v1 operation refuses requests without the key
        cases(schemathesis(server.url, 100, "--header", f"Authorization: Bearer {KEY}"))
    finally:
        server.stop()


def test_openapi_document_declares_every_error(tiny_model: Callable[[str], Path],
                                               server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_items_per_request=64)
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert {"/v1/score", "/v1/rerank", "/v2/rerank", "/v1/models", "/health", "/ready",
            "/metrics"} == set(spec["paths"])  # /v1/embeddings: an embedding model's; /v1/decisions: a causal LM's
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            declared = {code: response for code, response in operation["responses"].items() if code != "200"}
            assert {"405", "413", "500"} <= set(declared), path
            for response in declared.values():
                assert response["content"]["application/json"]["schema"] == error, path
            assert all("x-request-id" in r["headers"] for r in operation["responses"].values()), path
    score = spec["paths"]["/v1/score"]["post"]["responses"]
    assert {"400", "429", "503", "504"} <= set(score) and "401" not in score  # 401 only with --api-key-file
    assert score["429"]["headers"]["Retry-After"]["required"]
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 200


@pytest.mark.parametrize(("model", "embeds"), [("qwen3-cls3", False), ("bert-cross", False), ("bert-embed", True)])
def test_the_document_describes_the_server_as_loaded(model: str, embeds: bool, tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer]) -> None:
    """A body the document calls valid is served; one it calls invalid is refused: /v1/embeddings is listed only
    where it can embed, and a query and item that would make a sequence of no tokens are excluded by the schema
    exactly where they do (text on a tokenizer without special tokens, token ids everywhere)."""
    import jsonschema

    server = server_for(tiny_model(model), max_items_per_request=64)
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert ("/v1/embeddings" in spec["paths"]) == embeds
    schemas = spec["components"]["schemas"]
    rows = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert "instruct" not in schemas["ScoreRequest"]["properties"]  # no prompt template: nothing to fill
    assert "instruct" not in schemas["RerankRequest"]["properties"]
    bound = schemas["ScoreRequest"]["properties"]["query"]["anyOf"][0]["oneOf"][1]["items"]["maximum"]
    assert server.score(query=[bound], items=[[bound]]).status_code == 200, rows  # the largest id the document allows
    assert server.score(query=[bound + 1], items=[[5]]).status_code == 400  # and the first it refuses
    if embeds:
        return  # an embedding model embeds every sequence alone: its empty sequences are not described
    bodies = [{"query": "", "items": [""]}, {"items": ["", "a"]}, {"query": None, "items": ""},
              {"query": "", "items": ["a"]}, {"query": "q", "items": [""]}, {"query": [], "items": [[]]},
              {"items": [[5], []]}, {"query": [5], "items": [[]]}, {"query": [], "items": [[5]]}]
    for body in bodies:
        valid = jsonschema.Draft202012Validator(
            {"$ref": "#/components/schemas/ScoreRequest", "components": spec["components"]}).is_valid(body)
        response = httpx.post(server.url + "/v1/score", json=body, timeout=60)
        assert (response.status_code == 200) == valid, (body, valid, response.text)
    for body in [{"query": "", "documents": [""]}, {"query": "", "documents": [{"text": ""}]},
                 {"query": "", "documents": ["a"]}, {"query": "q", "documents": [""]}]:
        valid = jsonschema.Draft202012Validator(
            {"$ref": "#/components/schemas/RerankRequest", "components": spec["components"]}).is_valid(body)
        response = httpx.post(server.url + "/v1/rerank", json=body, timeout=60)
        assert (response.status_code == 200) == valid, (body, valid, response.text)


def test_instruct_is_in_the_document_where_a_prompt_template_fills_it(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-reranker"), prompt_template="qwen3-reranker", max_batch_tokens=4096)
    schemas = httpx.get(server.url + "/openapi.json", timeout=10).json()["components"]["schemas"]
    assert "instruct" in schemas["ScoreRequest"]["properties"] and "instruct" in schemas["RerankRequest"]["properties"]
    assert schemas["ScoreRequest"]["anyOf"][1]["properties"]["instruct"] == {"type": "null"}  # not with token ids
    response = httpx.post(server.url + "/v1/rerank", json={"query": "q", "documents": ["a", "b"], "instruct": "x"},
                          timeout=60)
    assert response.status_code == 200, response.text
