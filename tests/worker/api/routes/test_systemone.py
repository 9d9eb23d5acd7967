"""POST /v1/systemone (TypeSafe's System One format) against its documented examples: the request and response
shape of LiteLLM's `/v1/systemone` page (docs.litellm.ai/docs/decisions/systemone_format: the example request, and
its response's fields) and Databricks' "Query models with the TypeSafe System One API" (a JSON state, a noul with
criteria); the answer fields of Cloudflare's published output schema for Jev (`noul`: type and noul only; `choice`:
choice, probabilities, confidence; `score`: score, legend, probabilities, confidence). Answers equal each question
asked alone and plain transformers on the documented prompt."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import decision_reference
import httpx
import pytest
import reference
from serving import RunningServer

LITELLM_EXAMPLE = {
    "model": "jev",
    "state": "Customer wrote: I was charged twice for my order #4411 and want one of the charges refunded today.",
    "questions": {
        "is_refund_request": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
        "urgency": {"type": "choice", "instructions": "How urgent is this?",
                    "criteria": {"low": "can wait a week", "high": "needs action today"}},
        "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                        "criteria": ["calm", "mildly annoyed", "angry"]},
    },
}
DATABRICKS_EXAMPLE = {
    "model": "system.ai.openjev-qwen35-4b",
    "state": {"message": "My card was charged twice for the same order and I need a refund.", "channel": "support"},
    "questions": {
        "is_billing": {"type": "noul", "instructions": "Is this a billing-related request?",
                       "criteria": {"true": "The message concerns a charge, payment, invoice, or refund.",
                                    "false": "The message does not concern billing."}},
        "intent": {"type": "choice", "instructions": "Which intent best matches the message?",
                   "criteria": {"refund": None, "cancel": "The customer wants to cancel.", "question": None}},
    },
}


def systemone(server: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.url + "/v1/systemone", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def values(answer: dict[str, Any]) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


def test_litellm_example(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    body = systemone(server_for(tiny_model("qwen3-causal"), multi_item_scoring=True), LITELLM_EXAMPLE)
    assert set(body) == {"model", "answers", "usage"} and body["model"] == "qwen3-causal"
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    answers = body["answers"]
    assert list(answers) == ["is_refund_request", "urgency", "frustration"]
    noul, urgency, frustration = answers.values()
    assert set(noul) == {"type", "noul"} and noul["type"] == "noul" and 0 <= noul["noul"] <= 1
    assert set(urgency) == {"type", "choice", "probabilities", "confidence"} and urgency["type"] == "choice"
    assert list(urgency["probabilities"]) == ["low", "high"]
    assert urgency["choice"] == max(urgency["probabilities"], key=urgency["probabilities"].get)
    assert set(frustration) == {"type", "score", "legend", "probabilities", "confidence"}
    assert frustration["legend"] == {"0": "calm", "1": "mildly annoyed", "2": "angry"}
    levels = frustration["probabilities"]
    assert list(levels) == ["0", "1", "2"] and sum(levels.values()) == pytest.approx(1)
    assert frustration["score"] == pytest.approx(sum(int(i) * p for i, p in levels.items()))
    assert frustration["confidence"] == pytest.approx((3 * max(levels.values()) - 1) / 2)


@pytest.mark.parametrize("multi_item", [True, False])
@pytest.mark.parametrize("example", [LITELLM_EXAMPLE, DATABRICKS_EXAMPLE], ids=["litellm", "databricks"])
def test_answers_equal_each_question_alone_and_transformers(
        example: dict[str, Any], multi_item: bool, tiny_model: Callable[[str], Path],
        server_for: Callable[..., RunningServer]) -> None:
    path = tiny_model("qwen3-causal")
    server = server_for(path, multi_item_scoring=multi_item)
    model, tok, _ = reference.load_model(path)
    state = example["state"]
    messages = [{"role": "user", "content": state if isinstance(state, str) else json.dumps(
        state, ensure_ascii=False, separators=(",", ":"))}]
    answers = systemone(server, example)["answers"]
    for name, question in example["questions"].items():
        alone = systemone(server, {**example, "questions": {name: question}})["answers"][name]
        got = values(answers[name])
        assert max(abs(a - b) for a, b in zip(got, values(alone), strict=True)) <= 1e-4
        criteria = question.get("criteria") or {}
        if question["type"] == "noul":
            kind, options = "yes_no", [("yes", criteria.get("true")), ("no", criteria.get("false"))]
        elif question["type"] == "choice":
            kind, options = "choice", list(criteria.items())
        else:
            kind, options = "score", [(str(i), level) for i, level in enumerate(criteria)]
        prompt = decision_reference.prompt_ids(tok, messages, decision_reference.question_text(
            kind, question["instructions"], options))
        expected = decision_reference.option_probabilities(model, tok, prompt, [option for option, _ in options])
        expected = expected[:1] if kind == "yes_no" else expected
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-4, (name, got, expected)


@pytest.mark.parametrize(("questions", "message"), [
    ({}, "questions: Dictionary should have at least 1 item"),
    ({"q": {"type": "maybe", "instructions": "x"}}, "questions.q: Input should be a question of type noul, choice or"),
    ({"q": {"type": "choice", "instructions": "x", "criteria": {"only": None}}},
     "questions.q.criteria: Dictionary should have at least 2 items"),
    ({"q": {"type": "score", "instructions": "x", "criteria": ["one"]}},
     "questions.q.criteria: List should have at least 2 items"),
    ({"q": {"type": "choice", "instructions": "x", "criteria": {"": None, "b": None}}}, "at least 1 character"),
])
def test_bad_questions(questions: dict[str, Any], message: str, tiny_model: Callable[[str], Path],
                       server_for: Callable[..., RunningServer]) -> None:
    response = httpx.post(server_for(tiny_model("qwen3-causal")).url + "/v1/systemone",
                          json={"state": "x", "questions": questions}, timeout=60)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["object"] == "error" and body["type"] == "BadRequestError" and message in body["message"], body
