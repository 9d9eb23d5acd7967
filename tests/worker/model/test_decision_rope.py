"""Decisions on a longrope model: each question's rows use the RoPE table transformers picks for the flat sequence
`prompt + option`, whatever else shares the forward; a question whose options would take different tables is
refused (docs/decisions.md "Limits and errors")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import decision_reference
import httpx
import pytest
import reference
from engine_runs import variant
from serving import RunningServer

THRESHOLD = 160  # the tiny tokenizer spells most words letter by letter: the bare prompt is 130 tokens
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": THRESHOLD,
            "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [4.0, 8.0, 16.0, 32.0]}
SHORT, LONG = "The order arrived.", "The order arrived late, damaged, and without the invoice that was promised " * 2


@pytest.fixture(scope="module")
def longrope_causal(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant(tiny_model("qwen2-causal"), tmp_path_factory.mktemp("rope") / "qwen2-causal-longrope",
                   rope_parameters=LONGROPE)


def _prompt(tokenizer: object, text: str, question: str) -> list[int]:
    return decision_reference.prompt_ids(tokenizer, [{"role": "user", "content": text}],  # type: ignore[arg-type]
                                         decision_reference.question_text("predicate", question, [("yes", None),
                                                                                                 ("no", None)]))


@pytest.mark.parametrize("multi_item", [True, False])
def test_answers_use_each_sequence_s_own_table(multi_item: bool, longrope_causal: Path,
                                               server_for: Callable[..., RunningServer]) -> None:
    """A short and a long input (below and past the original maximum), each in a request of two questions,
    sent together so that they share forwards: every answer equals transformers on its own flat sequence."""
    model, tokenizer, _ = reference.load_model(longrope_causal)
    questions = ["The order arrived.", "Something was missing."]
    assert len(_prompt(tokenizer, SHORT, questions[0])) < THRESHOLD < len(_prompt(tokenizer, LONG, questions[0]))
    server = server_for(longrope_causal, multi_item_scoring=multi_item)
    with httpx.Client(timeout=120) as client:
        for text in (SHORT, LONG):
            body = {"model": "any", "input": text,
                    "questions": [{"type": "predicate", "instructions": q} for q in questions]}
            response = client.post(server.url + "/v1/decisions", json=body)
            assert response.status_code == 200, response.text
            for question, answer in zip(questions, response.json()["answers"], strict=True):
                expected = decision_reference.option_probabilities(model, tokenizer, _prompt(tokenizer, text,
                                                                                             question), ["yes", "no"])
                assert abs(answer["probability"] - expected[0]) <= 1e-4, (text[:20], question)


def test_options_either_side_of_the_threshold_are_refused(longrope_causal: Path,
                                                          server_for: Callable[..., RunningServer]) -> None:
    """Options of 1 and of many tokens on a prompt just under the threshold: one flat sequence would take the short
    table and the other the long one, which no single forward of the question's rows can do."""
    _, tokenizer, _ = reference.load_model(longrope_causal)
    long_option = "a refund of both charges"
    options = [("a", None), (long_option, None)]
    extra = len(tokenizer(long_option, add_special_tokens=False)["input_ids"]) - 1
    text = next(text for text in (" ".join(["word"] * n) for n in range(1, 40))
                if THRESHOLD - extra < len(decision_reference.prompt_ids(
                    tokenizer, [{"role": "user", "content": text}],
                    decision_reference.question_text("choice", "What?", options))) <= THRESHOLD)
    server = server_for(longrope_causal)
    body = {"model": "any", "input": text, "questions": [
        {"type": "choice", "instructions": "What?", "choices": [{"value": "a"}, {"value": long_option}]}]}
    response = httpx.post(server.url + "/v1/decisions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "RoPE threshold" in response.json()["message"] and "questions[0]" in response.json()["message"]
