"""Bad /v1/decisions requests get a 4xx in the one error shape, naming the field, never a 5xx: no questions, an
unknown type, a choice with one option, values the model cannot tell apart, images, an input over the model's
maximum, a request over --max-request-tokens or --max-request-bytes, too many questions, a response over
--max-response-bytes or --max-intermediate-bytes, a model that is not a causal LM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import RunningServer

PREDICATE = {"type": "predicate", "instructions": "It is true."}


def post(server: RunningServer, body: Any, path: str = "/v1/decisions") -> httpx.Response:
    """The body as ASCII JSON, so a lone surrogate is sent escaped (as a client might)."""
    return httpx.post(server.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=120)


def assert_error(response: httpx.Response, status: int, *texts: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"object", "message", "type", "code"} and body["object"] == "error" and body["code"] == status
    for text in texts:
        assert text in body["message"], body["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "m", "input": "x", "questions": []}, "questions: List should have at least 1 item"),
    ({"model": "m", "input": "x", "questions": [{"type": "vote", "instructions": "x"}]},
     "questions[0]: Input should be a question of type predicate, choice or score"),
    ({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
     "questions[0].choices: List should have at least 2 items"),
    ({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "x",
                                                 "choices": [{"value": "a"}, {"value": "b"}, {"value": "a"}]}]},
     "questions[0].choices: [2].value: 'a' repeats [0].value"),
    ({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "x",
                                                 "choices": [{"value": "true"}, {"value": True}]}]},
     "questions[0]: options 0 and 1 ('true') are the same text to the model"),
    ({"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "x",
                                                 "choices": [{"value": ""}, {"value": "b"}]}]},
     "questions[0].choices[0].value: String should have at least 1 character"),
    ({"model": "m", "input": "x", "questions": [{"type": "score", "instructions": "x", "levels": [{"label": "a"}]}]},
     "questions[0].levels: List should have at least 2 items"),
    ({"model": "m", "input": "x", "questions": [{"type": "predicate"}]}, "questions[0].instructions: Field required"),
    ({"input": "x", "questions": [PREDICATE]}, "model: Field required"),
    ({"model": "m", "questions": [PREDICATE]}, "input: Field required"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}], "questions": [PREDICATE]},
     "input[0]: Input should be a message (role user, developer, system or assistant)"),
    ({"model": "m", "input": 7, "questions": [PREDICATE]}, "input: Input should be text or a list of messages"),
    ({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look:"}, {"type": "input_image", "image_url": "https://x/y.png"}]}],
      "questions": [PREDICATE]}, "input[0].content[1]: images are not supported"),
    ({"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "questions[0].instructions[0]: images are not supported"),
    ({"model": "m", "input": "a\udc80b", "questions": [PREDICATE]}, "input: not valid Unicode text at character 1"),
    ({"model": "m", "input": "x", "questions": [PREDICATE] * 9}, "questions: 9 questions exceed the limit of 8"),
])
def test_bad_requests(body: dict[str, Any], message: str, tiny_model: Callable[[str], Path],
                      server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-causal"), max_items_per_request=8)
    assert_error(post(server, body), 400, message)


def test_oversized_inputs(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    """Over the model's maximum (2048 positions), before any prompt is rendered; over --max-request-tokens, on the
    planned tokens (one sequence per question: the input counts once per question); over --max-request-bytes."""
    server = server_for(tiny_model("qwen3-causal"), max_request_tokens=3000, max_request_bytes=200_000)
    long_input = "Paris is the capital of France. " * 400
    assert_error(post(server, {"model": "m", "input": long_input, "questions": [PREDICATE]}), 400,
                 "input: sequence of", "exceeds the model's maximum of 2048")
    some_input = "Paris is the capital of France. " * 40
    assert_error(post(server, {"model": "m", "input": some_input, "questions": [PREDICATE] * 30}), 413,
                 "questions: the request would run", "over this server's limit of 3000 (--max-request-tokens)")
    assert post(server, {"model": "m", "input": some_input, "questions": [PREDICATE] * 3}).status_code == 200
    assert_error(post(server, {"model": "m", "input": "x" * 300_000, "questions": [PREDICATE]}), 413)
    huge = {"type": "choice", "instructions": "x", "choices": [{"value": f"v{i}"} for i in range(600)]}
    assert_error(post(server_for(tiny_model("qwen3-causal")), {"model": "m", "input": "x", "questions": [huge]}), 400,
                 "questions[0]: sequence of", "exceeds the model's maximum of 2048")


def test_response_size_is_bounded_before_any_work(tiny_model: Callable[[str], Path],
                                                  server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-causal"), max_response_bytes=4096)
    many = {"type": "choice", "instructions": "x", "choices": [{"value": f"value {i}"} for i in range(100)]}
    assert_error(post(server, {"model": "m", "input": "x", "questions": [many]}), 400,
                 "questions: the response could reach", "(--max-response-bytes)")
    assert post(server, {"model": "m", "input": "x", "questions": [PREDICATE]}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
def test_other_model_kinds_are_refused(path: str, tiny_model: Callable[[str], Path],
                                       server_for: Callable[..., RunningServer]) -> None:
    body = {"model": "m", "input": "x", "questions": [PREDICATE]} if path == "/v1/decisions" else {
        "state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}}
    assert_error(post(server_for(tiny_model("qwen3-cls3")), body, path), 400,
                 f"model: {path} reads answers from a causal LM's next-token probabilities; this server serves a "
                 "classifier")


def test_the_largest_intermediate_is_bounded_before_any_work(tiny_model: Callable[[str], Path],
                                                              server_for: Callable[..., RunningServer]) -> None:
    """--max-intermediate-bytes of 1 MiB: a prompt of a few hundred tokens needs 4 heads × its tokens² attention
    scores (over 1 MiB), refused naming the input; a short one is answered."""
    server = server_for(tiny_model("qwen3-causal"), max_intermediate_bytes=1 << 20)
    some_input = "Paris is the capital of France. " * 40
    assert_error(post(server, {"model": "m", "input": some_input, "questions": [PREDICATE]}), 400,
                 "input: the request needs", "attention scores", "(--max-intermediate-bytes)")
    assert post(server, {"model": "m", "input": "x", "questions": [PREDICATE]}).status_code == 200
