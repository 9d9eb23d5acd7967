"""POST /v1/decisions: OpenAI's own client (openai-python's `client.decisions.create`) against a real server, and
exactness: every answer equals the same question asked alone in its own request, with multi-item scoring (the input
shared by every question, options as child items) and without it (one sequence per question), chunked or not, on
tiny models of every decoder family; and it equals plain transformers on the documented prompt (decision_reference)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import decision_reference
import httpx
import pytest
import reference
from serving import RunningServer

INPUT = ("Customer wrote: I was charged twice for my order #4411 and I want one of the charges refunded today. "
         "This is the third time this happens and I am considering leaving.")
# 16 questions of every kind: options of one token and of several, long descriptions, typed values, a long scale.
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "instructions": "The customer asks for a refund.", "name": "refund"},
    {"type": "predicate", "instructions": "The customer is happy."},
    {"type": "choice", "instructions": "How urgent is this?", "name": "urgency",
     "choices": [{"value": "low", "description": "can wait a week"}, {"value": "high", "description": "today"}]},
    {"type": "choice", "instructions": "Which team should handle it?",
     "choices": [{"value": "billing"}, {"value": "technical support"}, {"value": "sales and renewals"},
                 {"value": "legal"}]},
    {"type": "choice", "instructions": "Is the order number given?", "choices": [{"value": True}, {"value": False}]},
    {"type": "choice", "instructions": "Pick one.", "choices": [{"value": "yes"}, {"value": True},
                                                                 {"value": "maybe, later"}]},
    {"type": "score", "instructions": "How frustrated is the customer?", "name": "frustration",
     "levels": [{"label": "calm"}, {"label": "mildly annoyed"}, {"label": "angry", "description": "shouting"}]},
    {"type": "score", "instructions": "Rate the churn risk.",
     "levels": [{"label": str(i)} for i in range(11)]},
    {"type": "predicate", "instructions": "The message mentions an order number."},
    {"type": "choice", "instructions": "Language of the message?",
     "choices": [{"value": "English"}, {"value": "German"}, {"value": "French"}]},
    {"type": "predicate", "instructions": "The customer threatens to leave."},
    {"type": "score", "instructions": "How polite is the message?",
     "levels": [{"label": "rude"}, {"label": "neutral"}, {"label": "polite"}]},
    {"type": "choice", "instructions": "What does the customer want?",
     "choices": [{"value": "a refund of one charge"}, {"value": "an apology"}, {"value": "to cancel the account"}]},
    {"type": "predicate", "instructions": "The customer was charged once."},
    {"type": "choice", "instructions": "Channel?", "choices": [{"value": "email"}, {"value": "phone"}]},
    {"type": "score", "instructions": "Severity", "levels": [{"label": "S3"}, {"label": "S2"}, {"label": "S1"}]},
]
DECODERS = ["qwen3-causal", "llama-causal", "gemma2-causal", "mistral-causal"]


def decide(server: RunningServer, questions: list[dict[str, Any]], body_input: Any = INPUT) -> dict[str, Any]:
    response = httpx.post(server.url + "/v1/decisions", json={"model": "any", "input": body_input,
                                                              "questions": questions}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def probabilities(answer: dict[str, Any]) -> list[float]:
    if answer["type"] == "predicate":
        return [answer["probability"]]
    return [entry["probability"] for entry in answer["probabilities"]]


def assert_close(got: list[float], expected: list[float], tolerance: float = 1e-4) -> None:
    assert len(got) == len(expected)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= tolerance, (got, expected)


def test_openai_client(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    """The client's own types parse the response: answers in question order with their names, typed choice values,
    probabilities that sum to 1, the expected level and the confidence as documented, usage."""
    import openai

    server = server_for(tiny_model("qwen3-causal"), multi_item_scoring=True)
    client = openai.OpenAI(api_key="unused", base_url=server.url + "/v1")
    decision = client.decisions.create(model="gpt-6-luna", input=INPUT, questions=QUESTIONS)
    assert decision.model == "qwen3-causal"
    assert [a.type for a in decision.answers] == [q["type"] for q in QUESTIONS]
    assert [a.name for a in decision.answers] == [q.get("name") for q in QUESTIONS]
    usage = decision.usage
    assert usage.input_tokens == usage.total_tokens > 0 and usage.output_tokens == 0
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
    for question, answer in zip(QUESTIONS, decision.answers, strict=True):
        if question["type"] == "predicate":
            assert 0 < answer.probability < 1
            continue
        ps = [p.probability for p in answer.probabilities]
        assert abs(sum(ps) - 1) < 1e-9 and all(0 <= p <= 1 for p in ps)
        k = len(ps)
        assert answer.confidence == pytest.approx((k * max(ps) - 1) / (k - 1))
        if question["type"] == "choice":
            values = [c["value"] for c in question["choices"]]
            assert [p.value for p in answer.probabilities] == values  # typed: True stays a boolean
            assert [type(p.value) for p in answer.probabilities] == [type(v) for v in values]
            assert answer.choice == values[ps.index(max(ps))]
        else:
            assert [(p.label, p.value) for p in answer.probabilities] == [
                (level["label"], i) for i, level in enumerate(question["levels"])]
            assert answer.score == pytest.approx(sum(i * p for i, p in enumerate(ps)))


def test_unnamed_answers_carry_a_null_name(tiny_model: Callable[[str], Path],
                                           server_for: Callable[..., RunningServer]) -> None:
    answers = decide(server_for(tiny_model("qwen3-causal")), QUESTIONS[:2])["answers"]
    assert answers[0]["name"] == "refund" and "name" in answers[1] and answers[1]["name"] is None


@pytest.mark.parametrize("multi_item", [True, False])
@pytest.mark.parametrize("name", DECODERS)
def test_each_answer_equals_the_question_asked_alone(name: str, multi_item: bool, tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model(name), multi_item_scoring=multi_item)
    together = decide(server, QUESTIONS)
    for question, answer in zip(QUESTIONS, together["answers"], strict=True):
        assert_close(probabilities(answer), probabilities(decide(server, [question])["answers"][0]))
    if multi_item:  # the input ran once, not once per question (its tokens, give or take one at each seam)
        from transformers import AutoTokenizer

        shared = len(AutoTokenizer.from_pretrained(tiny_model(name))(INPUT, add_special_tokens=False)["input_ids"])
        alone = sum(decide(server, [q])["usage"]["input_tokens"] for q in QUESTIONS)
        assert together["usage"]["input_tokens"] <= alone - (len(QUESTIONS) - 1) * (shared - 2)


def test_chunked_requests_answer_alike(tiny_model: Callable[[str], Path],
                                       server_for: Callable[..., RunningServer]) -> None:
    """A batch budget far below the request: the shared input is repeated per chunk of questions; same answers."""
    path = tiny_model("qwen3-causal")
    small = decide(server_for(path, multi_item_scoring=True, max_batch_tokens=400), QUESTIONS)
    large = decide(server_for(path, multi_item_scoring=True), QUESTIONS)
    assert small["usage"]["input_tokens"] > large["usage"]["input_tokens"]  # the input ran once per chunk
    for a, b in zip(small["answers"], large["answers"], strict=True):
        assert_close(probabilities(a), probabilities(b))


@pytest.mark.parametrize("multi_item", [True, False])
def test_answers_equal_transformers_on_the_documented_prompt(
        multi_item: bool, tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    """A conversation input (system, user, assistant, user turns): the question joins the last user turn."""
    path = tiny_model("llama-causal")
    model, tok, _ = reference.load_model(path)
    messages = [{"role": "system", "content": "You route support tickets."},
                {"role": "user", "content": "Hello, I have a problem."},
                {"role": "assistant", "content": "Tell me more."}, {"role": "user", "content": INPUT}]
    got = decide(server_for(path, multi_item_scoring=multi_item), QUESTIONS[:8], messages)
    for question, answer in zip(QUESTIONS[:8], got["answers"], strict=True):
        kind, instructions, options = decision_reference.openai_question(question)
        prompt = decision_reference.prompt_ids(tok, messages, decision_reference.question_text(
            kind, instructions, options))
        expected = decision_reference.option_probabilities(model, tok, prompt, [name for name, _ in options])
        assert_close(probabilities(answer), expected[:1] if kind == "predicate" else expected)


def test_many_options_and_many_questions(tiny_model: Callable[[str], Path],
                                         server_for: Callable[..., RunningServer]) -> None:
    """No cap at 26 options: a choice of 300 values (numbers, most of several tokens: this tokenizer splits digits)
    and 400 questions in one request, each answer as if asked alone."""
    server = server_for(tiny_model("qwen3-causal"), multi_item_scoring=True, max_request_tokens=1 << 20,
                        max_batch_tokens=1 << 16)
    choice = {"type": "choice", "instructions": "Which code?", "choices": [{"value": str(i)} for i in range(300)]}
    answer = decide(server, [QUESTIONS[0], choice, QUESTIONS[3]], "short input")["answers"][1]
    assert [p["value"] for p in answer["probabilities"]] == [str(i) for i in range(300)]
    assert_close(probabilities(answer), probabilities(decide(server, [choice], "short input")["answers"][0]))
    many = [{"type": "predicate", "instructions": f"Statement number {i} holds."} for i in range(400)]
    together = decide(server, many, "short input")["answers"]
    assert len(together) == 400
    for i in (0, 199, 399):
        assert_close(probabilities(together[i]), probabilities(decide(server, [many[i]], "short input")["answers"][0]))


def test_metrics_count_the_routes(tiny_model: Callable[[str], Path],
                                  server_for: Callable[..., RunningServer]) -> None:
    """Requests by route and status, questions by type, the tokens that ran; nothing left in flight."""
    from prometheus_client.parser import text_string_to_metric_families

    server = server_for(tiny_model("qwen3-causal"), served_name="metrics-test")

    def samples() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    before = samples()
    tokens = decide(server, QUESTIONS[:4])["usage"]["input_tokens"]
    body = {"state": "x", "questions": {"a": {"type": "noul", "instructions": "y"},
                                        "b": {"type": "score", "instructions": "z", "criteria": ["0", "1"]}}}
    response = httpx.post(server.url + "/v1/systemone", json=body, timeout=60)
    tokens += response.json()["usage"]["input_tokens"]
    assert httpx.post(server.url + "/v1/decisions", json={"model": "m", "input": "x", "questions": []},
                      timeout=60).status_code == 400
    after = samples()
    assert delta("scorekeeper_requests_total", route="/v1/decisions", code="200") == 1
    assert delta("scorekeeper_requests_total", route="/v1/decisions", code="400") == 1
    assert delta("scorekeeper_requests_total", route="/v1/systemone", code="200") == 1
    types = {"predicate": 2, "choice": 2, "yes_no": 1, "score": 1}
    assert {t: delta("scorekeeper_decision_questions_total", type=t) for t in types} == types
    assert delta("scorekeeper_prompt_tokens_total") == tokens
    assert delta("scorekeeper_stage_duration_seconds_count", stage="end_to_end") == 3
    assert after[("scorekeeper_inflight_requests", frozenset())] == 0


def test_input_items_become_chat_messages(tiny_model: Callable[[str], Path],
                                          server_for: Callable[..., RunningServer]) -> None:
    """Parts, roles and tool items as documented: developer → system, parts joined by newlines, JSON compact, a
    function call → assistant, its output → tool; equal to transformers on those messages."""
    path = tiny_model("qwen3-causal")
    model, tok, _ = reference.load_model(path)
    items = [{"role": "developer", "content": [{"type": "input_text", "text": "Route tickets."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Order status?"},
                                          {"type": "input_json", "data": {"order": 4411, "items": ["a", "b"]}}]},
             {"type": "function_call", "call_id": "c1", "name": "lookup", "namespace": "orders",
              "arguments": '{"id": 4411}'},
             {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "It shipped."}]}]
    messages = [{"role": "system", "content": "Route tickets."},
                {"role": "user", "content": 'Order status?\n{"order":4411,"items":["a","b"]}'},
                {"role": "assistant", "content": 'Call orders.lookup (c1): {"id": 4411}'},
                {"role": "tool", "content": "Output of c1: shipped"},
                {"role": "assistant", "content": "It shipped."}]
    got = decide(server_for(path, multi_item_scoring=True), QUESTIONS[:3], items)["answers"]
    for question, answer in zip(QUESTIONS[:3], got, strict=True):
        kind, instructions, options = decision_reference.openai_question(question)
        prompt = decision_reference.prompt_ids(tok, messages, decision_reference.question_text(
            kind, instructions, options))
        expected = decision_reference.option_probabilities(model, tok, prompt, [name for name, _ in options])
        assert_close(probabilities(answer), expected[:1] if kind == "predicate" else expected)
