"""/v1/decisions on real weights: SmolLM2-135M-Instruct (converted from its GGUF), through its own chat template,
with multi-item scoring. The worker's start-up self-check has already proved the decision path on this model (it
would not be ready otherwise); here every answer equals the question asked alone and plain transformers on the
documented prompt, to 1e-4 in float32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import decision_reference
import httpx
import pytest
import reference
from serving import RunningServer

pytestmark = pytest.mark.slow

INPUT = "Paris is the capital of France. It is a beautiful city, famous for its museums and its food."
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "instructions": "The text says that Paris is the capital of France."},
    {"type": "choice", "instructions": "Which city is the capital of France according to the text?",
     "choices": [{"value": "Paris"}, {"value": "Berlin"}, {"value": "Madrid"}]},
    {"type": "choice", "instructions": "What is the topic of the text?",
     "choices": [{"value": "geography"}, {"value": "cooking", "description": "recipes"}, {"value": "team sports"}]},
    {"type": "score", "instructions": "How positive is the text?",
     "levels": [{"label": "negative"}, {"label": "neutral"}, {"label": "positive"}]},
]


def _probabilities(answer: dict[str, Any]) -> list[float]:
    return [answer["probability"]] if answer["type"] == "predicate" else [
        p["probability"] for p in answer["probabilities"]]


def test_smollm2_answers_equal_alone_and_transformers(smollm2_converted: Path,
                                                      server_for: Callable[..., RunningServer]) -> None:
    server = server_for(smollm2_converted, multi_item_scoring=True)
    model, tok, _ = reference.load_model(smollm2_converted)
    assert tok.chat_template  # the built-in decision template is the model's own chat template

    def decide(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = httpx.post(server.url + "/v1/decisions", json={"model": "m", "input": INPUT,
                                                                  "questions": questions}, timeout=600)
        assert response.status_code == 200, response.text
        return response.json()["answers"]  # type: ignore[no-any-return]

    together = decide(QUESTIONS)
    for question, answer in zip(QUESTIONS, together, strict=True):
        got = _probabilities(answer)
        alone = _probabilities(decide([question])[0])
        kind, instructions, options = decision_reference.openai_question(question)
        prompt = decision_reference.prompt_ids(tok, [{"role": "user", "content": INPUT}],
                                               decision_reference.question_text(kind, instructions, options))
        expected = decision_reference.option_probabilities(model, tok, prompt, [name for name, _ in options])
        expected = expected[:1] if kind == "predicate" else expected
        for other in (alone, expected):
            assert max(abs(a - b) for a, b in zip(got, other, strict=True)) <= 1e-4, (question, got, other)
