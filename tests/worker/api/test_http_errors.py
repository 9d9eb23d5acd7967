"""One error shape for every non-2xx answer: malformed bodies, strict types, unknown routes and internal errors all
answer `{"object": "error", "message", "type", "code"}` as JSON, never FastAPI's `{"detail": ...}` and never a 500
for bad input. Every response carries an `x-request-id`; an internal error is counted and logged once, with it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import RunningServer

JSON = {"content-type": "application/json"}
BIG_INT = b"9" * 5000  # past Python's 4,300-digit limit for int() of a decimal string

# (case, raw body, text the message must contain: the field at fault where there is one)
MALFORMED: list[tuple[str, bytes, str]] = [
    ("lone surrogate in query", b'{"query": "a\\ud800b", "items": ["x"], "label_token_ids": [1]}', "query"),
    ("lone surrogate in an item", b'{"query": "q", "items": ["x", "\\udfff"], "label_token_ids": [1]}', "items[1]"),
    ("lone surrogate in model", b'{"query": "q", "items": ["x"], "label_token_ids": [1], "model": "\\udc00"}',
     "model"),
    ("invalid UTF-8 in query", b'{"query": "a\xffb", "items": ["x"], "label_token_ids": [1]}', "query"),
    ("invalid UTF-8 in an item", b'{"query": "q", "items": ["\xc3\x28"], "label_token_ids": [1]}', "items[0]"),
    ("JSON nested 100k deep", b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "arrays and objects"),
    ("JSON nested 1,100 deep", b'{"query": ' + b"[" * 1100 + b"]" * 1100 + b"}", "nested 1101 deep"),
    ("JSON nested 40 deep in objects", b'{"query": "q", "items": ["x"], "label_token_ids": [1], "a": '
     + b'{"b": [' * 20 + b"]}" * 20 + b"}", "nested 41 deep"),
    ("integer of 5,000 digits", b'{"query": [' + BIG_INT + b'], "items": [[1]], "label_token_ids": [1]}', "digits"),
    ("integer beyond 64 bits", b'{"query": "q", "items": ["x"], "label_token_ids": [18446744073709551616]}',
     "label_token_ids[0]"),
    ("integer beyond 2**53", b'{"query": [9007199254740992], "items": [[1]], "label_token_ids": [1]}', "query[0]"),
    ("booleans as label ids", b'{"query": "q", "items": ["x"], "label_token_ids": [true, false]}',
     "label_token_ids[0]"),
    ("string as label id", b'{"query": "q", "items": ["x"], "label_token_ids": ["1"]}', "label_token_ids[0]"),
    ("fraction as token id", b'{"query": [1.5], "items": [[2]], "label_token_ids": [1]}', "query[0]"),
    ("integer as boolean", b'{"query": "q", "items": ["x"], "label_token_ids": [1], "apply_softmax": 1}',
     "apply_softmax"),
    ("string as temperature", b'{"query": "q", "items": ["x"], "label_token_ids": [1], "apply_softmax": true, '
     b'"temperature": "2"}', "temperature"),
    ("NaN temperature", b'{"query": "q", "items": ["x"], "label_token_ids": [1], "apply_softmax": true, '
     b'"temperature": NaN}', "temperature"),
    ("truncated JSON", b'{"query": ', "JSON"),
    ("not an object", b'["q", ["x"]]', "object"),
    ("empty body", b"", "body"),
]


@pytest.fixture(scope="module")
def causal(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> RunningServer:
    return server_for(tiny_model("qwen3-causal"), max_items_per_request=64)


def assert_error_shape(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"object", "message", "type", "code"}, body
    assert body["object"] == "error" and body["code"] == status and body["message"] and body["type"]
    return body


@pytest.mark.parametrize(("case", "body", "where"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_input_is_a_400_in_the_error_shape(causal: RunningServer, case: str, body: bytes,
                                                     where: str) -> None:
    response = httpx.post(causal.url + "/v1/score", content=body, headers=JSON, timeout=30)
    error = assert_error_shape(response, 400)
    assert error["type"] == "BadRequestError"
    assert where in error["message"], error["message"]


def test_rerank_refuses_invalid_text_and_lax_types(tiny_model: Callable[[str], Path],
                                                   server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"))
    for body, where in [(b'{"query": "q", "documents": ["ok", "\\ud83d"]}', "documents[1]"),
                        (b'{"query": "q", "documents": ["a"], "top_n": true}', "top_n"),
                        (b'{"query": "q", "documents": ["a"], "top_n": "1"}', "top_n")]:
        error = assert_error_shape(httpx.post(server.url + "/v1/rerank", content=body, headers=JSON, timeout=30), 400)
        assert where in error["message"], error["message"]


def test_a_body_that_is_not_json_says_which_content_type_to_send(causal: RunningServer) -> None:
    response = httpx.post(causal.url + "/v1/score", content=b"query=q&items=x", timeout=30,
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert "application/json" in assert_error_shape(response, 400)["message"]


def test_unknown_route_and_wrong_method_use_the_error_shape(causal: RunningServer) -> None:
    missing = assert_error_shape(httpx.get(causal.url + "/no/such/path", timeout=10), 404)
    assert missing["type"] == "NotFoundError" and "/no/such/path" in missing["message"]
    wrong = httpx.get(causal.url + "/v1/score", timeout=10)
    assert assert_error_shape(wrong, 405)["type"] == "MethodNotAllowed"
    assert wrong.headers["allow"] == "POST"


def test_request_ids_are_generated_or_echoed(causal: RunningServer) -> None:
    generated = {httpx.get(causal.url + "/health", timeout=10).headers["x-request-id"] for _ in range(2)}
    assert len(generated) == 2 and all(len(rid) >= 16 for rid in generated)
    mine = httpx.get(causal.url + "/no/such/path", headers={"x-request-id": "client-id-42"}, timeout=10)
    assert mine.headers["x-request-id"] == "client-id-42"
    # An id that could forge log lines (or is absurdly long) is replaced, not echoed.
    odd = httpx.get(causal.url + "/health", headers={"x-request-id": "x" * 500}, timeout=10)
    assert odd.headers["x-request-id"] != "x" * 500


def requests_total(server: RunningServer, route: str, code: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "scorekeeper_requests_total" and s.labels == {"route": route, "code": code})


@pytest.fixture()
def failing(tiny_model: Callable[[str], Path]) -> Iterator[RunningServer]:
    """A server whose model thread fails every batch, as a CUDA error would."""
    server = RunningServer(model=tiny_model("qwen3-cls3"))

    def broken(*_: object) -> None:
        raise RuntimeError("forced failure inside the forward pass")

    scheduler = server.app.state.service.scheduler
    assert scheduler is not None
    scheduler.executor.fault = broken
    yield server
    server.stop()


def test_internal_error_is_json_counted_and_logged_once(failing: RunningServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    before = requests_total(failing, "/v1/score", "500")
    with caplog.at_level(logging.INFO):
        response = httpx.post(failing.url + "/v1/score", json={"query": "q", "items": ["a"]},
                              headers={"x-request-id": "forced-500"}, timeout=30)
    error = assert_error_shape(response, 500)
    assert error["type"] == "InternalServerError" and "forced-500" in error["message"]
    assert response.headers["x-request-id"] == "forced-500"
    assert requests_total(failing, "/v1/score", "500") - before == 1
    mine = [r for r in caplog.records if getattr(r, "request_id", None) == "forced-500" and r.levelno >= logging.ERROR]
    assert len(mine) == 1, [r.getMessage() for r in mine]
    assert mine[0].exc_info is not None  # the traceback is in that one record
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    # The server keeps serving: probes still answer.
    assert httpx.get(failing.url + "/ready", timeout=10).status_code == 200


def test_a_body_of_too_many_arrays_is_refused_before_it_is_parsed(causal: RunningServer) -> None:
    """Nested ignored fields cost the parser (and the garbage collector) per array; a body with more arrays and
    objects than any valid request needs is refused from a scan of its bytes, whatever the field."""
    deep = b"[" * 50 + b"]" * 50
    body = b'{"query": "q", "items": ["x"], "label_token_ids": [1], "ignored": [' + b",".join([deep] * 2000) + b"]}"
    error = assert_error_shape(httpx.post(causal.url + "/v1/score", content=body, headers=JSON, timeout=60), 400)
    assert "arrays and objects" in error["message"] and "body" in error["message"], error["message"]
    # Brackets inside strings are text, not structure: such a body is scored.
    text = "[{" * 60_000
    response = httpx.post(causal.url + "/v1/score", json={"query": "q", "items": [text[:200]] * 20,
                                                           "label_token_ids": [1], "note": text}, timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("headers", "what"), [
    ({"content-encoding": "gzip"}, "content-encoding"),
    ({"content-type": "application/json; charset=latin-1"}, "charset"),
], ids=["gzip", "latin-1"])
def test_encodings_the_server_does_not_decode_are_refused(causal: RunningServer, headers: dict[str, str],
                                                          what: str) -> None:
    body = json.dumps({"query": "q", "items": ["x"], "label_token_ids": [1]}).encode()
    response = httpx.post(causal.url + "/v1/score", content=body, headers={**JSON, **headers}, timeout=30)
    error = assert_error_shape(response, 415)
    assert what in error["message"], error["message"]
    utf8 = httpx.post(causal.url + "/v1/score", content=body, timeout=30,
                      headers={"content-type": 'application/json; charset="UTF-8"', "content-encoding": "identity"})
    assert utf8.status_code == 200, utf8.text
