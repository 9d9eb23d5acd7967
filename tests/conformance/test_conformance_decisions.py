"""Conformance of /v1/decisions and /v1/systemone over HTTP: hypothesis draws an input and questions of every kind
(predicate / noul, choice, score; options of one word or several, with descriptions or without), the same questions
in both wire formats, sent by concurrent clients held behind one batch; every answer must equal the per-question
reference of tests/support/decision_reference.py (the documented prompt through the tokenizer's own chat template, each
option scored by plain transformers) to 1e-4, and a request is refused with a 400 exactly when the reference cannot
score it (a token past the embedding rows, in the input, a question or an option)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import decision_reference
import httpx
import pytest
from compare import ATOL
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis_profile import conformance
from serving import BatchGate, RunningServer, wait_until
from subjects import Subject, subject
from variants import VARIANTS

DECIDED = ["qwen3-causal-oversized", "gemma2-causal-decisions"]
Question = tuple[str, str, list[tuple[str, str | None]]]  # kind (predicate, choice, score), instructions, options


def _words(subject: Subject, min_size: int, max_size: int) -> st.SearchStrategy[str]:
    pieces = st.sampled_from(subject.words)
    if subject.unembedded:
        pieces = st.one_of(pieces, pieces, pieces, st.sampled_from(subject.unembedded))
    return st.lists(pieces, min_size=min_size, max_size=max_size).map(" ".join)


@st.composite
def question(draw: st.DrawFn, subject: Subject) -> Question:
    kind = draw(st.sampled_from(["predicate", "choice", "score"]))
    instructions = draw(_words(subject, 1, 5))
    if kind == "predicate":
        return kind, instructions, [("yes", None), ("no", None)]
    names = draw(st.lists(_words(subject, 1, 2), min_size=2, max_size=4, unique=True))
    descriptions = [draw(st.one_of(st.none(), _words(subject, 1, 3))) for _ in names]
    return kind, instructions, list(zip(names, descriptions, strict=True))


def _openai(q: Question) -> dict[str, Any]:
    kind, instructions, options = q
    if kind == "predicate":
        return {"type": "predicate", "instructions": instructions}
    key, name = ("choices", "value") if kind == "choice" else ("levels", "label")
    return {"type": kind, "instructions": instructions,
            key: [{name: option} | ({"description": d} if d else {}) for option, d in options]}


def _systemone(q: Question) -> dict[str, Any]:
    """System One names a score's levels 0, 1, ... (its criteria are their descriptions)."""
    kind, instructions, options = q
    if kind == "predicate":
        return {"type": "noul", "instructions": instructions}
    if kind == "choice":
        return {"type": "choice", "instructions": instructions, "criteria": dict(options)}
    return {"type": "score", "instructions": instructions, "criteria": [name for name, _ in options]}


def _reference(tested: Subject, text: str, q: Question, systemone: bool) -> list[float] | None:
    """The probabilities the reference gives (a predicate / noul: of yes alone); None when it cannot score them."""
    kind, instructions, options = q
    if systemone and kind == "score":
        kind, options = "score", [(str(i), name) for i, (name, _) in enumerate(options)]
    wording = "yes_no" if systemone and kind == "predicate" else kind
    prompt = decision_reference.prompt_ids(tested.tokenizer, [{"role": "user", "content": text}],
                                           decision_reference.question_text(wording, instructions, options))
    ids = [tested.tokenizer(name, add_special_tokens=False)["input_ids"] for name, _ in options]
    assume(len(prompt) + max(len(option) for option in ids) <= tested.max_positions)  # length: another suite's
    if max(prompt + [token for option in ids for token in option]) >= tested.vocab_size:
        return None
    probabilities = decision_reference.option_probabilities(tested.hf, tested.tokenizer, prompt,
                                                            [name for name, _ in options])
    return probabilities[:1] if kind == "predicate" else probabilities


def _got(answer: dict[str, Any]) -> list[float]:
    if answer["type"] == "predicate":
        return [answer["probability"]]
    if answer["type"] == "noul":
        return [answer["noul"]]
    if isinstance(answer["probabilities"], dict):  # System One: by name
        return list(answer["probabilities"].values())
    return [entry["probability"] for entry in answer["probabilities"]]


def _send_held(server: RunningServer, requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    scheduler = server.scheduler
    with BatchGate(scheduler, hold=True) as gate, concurrent.futures.ThreadPoolExecutor(len(requests) + 1) as pool:
        blocker = pool.submit(httpx.post, server.url + "/v1/score", json={"query": [5], "items": [[6]],
                                                                          "label_token_ids": [1]}, timeout=120)
        gate.wait_held()
        sent = [pool.submit(httpx.post, server.url + route, json=body, timeout=120) for route, body in requests]
        wait_until("every request queued or answered",
                   lambda: scheduler.open_requests - 1 + sum(f.done() for f in sent) >= len(sent))
        gate.release()
        assert blocker.result().status_code == 200
        return [future.result() for future in sent]


@pytest.mark.parametrize("name", DECIDED)
@conformance(ci_examples=3, long_examples=60)
@given(data=st.data())
def test_decisions_and_systemone_match_the_reference(name: str, variants_dir: Path, data: st.DataObject,
                                                      server_for: Callable[..., RunningServer]) -> None:
    tested = subject(next(v for v in VARIANTS if v.name == name), variants_dir)
    server = server_for(tested.path, multi_item_scoring=data.draw(st.booleans(), label="multi_item"))
    text = data.draw(_words(tested, 1, 8), label="input")
    questions = data.draw(st.lists(question(tested), min_size=1, max_size=3), label="questions")
    expected = {route: [_reference(tested, text, q, route == "/v1/systemone") for q in questions]
                for route in ("/v1/decisions", "/v1/systemone")}
    requests = [("/v1/decisions", {"model": "m", "input": text, "questions": [_openai(q) for q in questions]}),
                ("/v1/systemone", {"model": "m", "state": text,
                                   "questions": {f"q{i}": _systemone(q) for i, q in enumerate(questions)}})]
    for (route, body), response in zip(requests, _send_held(server, requests), strict=True):
        want = expected[route]
        if any(w is None for w in want):
            assert response.status_code == 400 and "embedding rows" in response.json()["message"], response.text
            continue
        assert response.status_code == 200, (body, response.text)
        answers = response.json()["answers"]
        got = [_got(a) for a in (answers if isinstance(answers, list) else answers.values())]
        for g, w in zip(got, want, strict=True):
            assert w is not None and len(g) == len(w), (body, got, want)
            assert max(abs(a - b) for a, b in zip(g, w, strict=True)) <= 1e-4 + ATOL, (body, got, want)
