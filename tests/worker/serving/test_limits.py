"""Limits a client cannot get around: tokens a request would run (--max-request-tokens, checked on the plan before
anything is built or queued) and the size of the response it asks for (--max-response-bytes, before any work)."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import scorekeeper_worker.planning.planner as planning
from prometheus_client.parser import text_string_to_metric_families
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.base.errors import TooLarge
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.model.templates.special_tokens import PairLayout
from scorekeeper_worker.planning.planner import plan, tokenize
from serving import RunningServer

# The probe: a 6.7 KB body that plans 64 × (2040 + 2) = 130,688 tokens (single-item: the query per item).
HOSTILE = {"query": [5] * 2040, "items": [[6, 7]] * 64}
SMALL = {"query": [7, 8], "items": [[9, 10], [11]]}


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def test_a_small_body_planning_too_many_tokens_is_413_and_others_are_served(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_request_tokens=8192, max_queue_tokens=4096,
                        max_batch_tokens=2048)
    assert len(json.dumps(HOSTILE)) < 7000
    with ThreadPoolExecutor(2) as pool:
        hostile, small = pool.submit(server.score, **HOSTILE), pool.submit(server.score, **SMALL)
        hostile_response, small_response = hostile.result(), small.result()
    assert hostile_response.status_code == 413, hostile_response.text
    error = hostile_response.json()
    assert error["object"] == "error" and error["code"] == 413 and error["type"] == "RequestTooLarge"
    assert error["message"].startswith("items:") and "130688" in error["message"]
    assert "--max-request-tokens" in error["message"]
    assert small_response.status_code == 200, small_response.text
    assert server.scheduler.queued_tokens == 0 and _metric(server, "scorekeeper_queue_tokens") == 0
    assert _metric(server, "scorekeeper_rejected_requests_total", reason="request_tokens") >= 1
    # Under the cap, a request larger than --max-queue-tokens still enters an empty queue.
    assert server.score(query=[5] * 100, items=[[6, 7]] * 50).status_code == 200


CASES = [  # (model, multi-item scoring, delimiter, request)
    ("qwen3-cls3", False, None, {"query": "a question about rivers", "items": ["one", "two words", ""]}),
    ("qwen3-cls3", True, None, {"query": "a question about rivers", "items": ["one", "two words", ""] * 30}),
    ("llama-causal", True, 3, {"query": [5] * 40, "items": [[6] * k for k in range(1, 40)],
                               "label_token_ids": [1, 2]}),
    ("llama-causal", False, None, {"query": "q", "items": ["x y"] * 5, "item_first": True,
                                   "label_token_ids": [1]}),
    ("bert-cross", False, None, {"query": "a question", "items": ["an answer", "another answer"]}),
    ("bert-embed", False, None, {"query": "a question", "items": ["an answer", "another answer"]}),
]


@pytest.mark.parametrize(("name", "multi_item", "delimiter", "body"), CASES)
def test_the_limit_is_the_planned_count_checked_before_any_unit_is_built(
        name: str, multi_item: bool, delimiter: int | None, body: dict[str, Any],
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    request = ScoreRequest.model_validate(body).ask()
    tokens = tokenize(model, request)
    planned = plan(model, request, tokens, multi_item, 64, delimiter)
    assert planned.prompt_tokens == sum(unit.num_tokens for unit in planned.units)
    assert len(planned.units) >= 2  # several sequences or multi-item chunks
    assert plan(model, request, tokens, multi_item, 64, delimiter, planned.prompt_tokens).prompt_tokens \
        == planned.prompt_tokens
    built: list[object] = []
    monkeypatch.setattr(planning, "PackUnit", lambda *a, **k: built.append(a))
    with pytest.raises(TooLarge, match=rf"^items: .* {planned.prompt_tokens} tokens"):
        plan(model, request, tokens, multi_item, 64, delimiter, planned.prompt_tokens - 1)
    assert built == []


def test_cross_encoder_pairs_are_refused_before_they_are_built(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cross-encoder pairs the query with every item: 200 query tokens × 64 items are refused from the lengths,
    with the query tokenized once and no pair ever built."""
    server = server_for(tiny_model("bert-cross"), max_request_tokens=4096)
    joined: list[object] = []
    tokenized: list[int] = []
    plain = planning.plain_tokens
    monkeypatch.setattr(PairLayout, "join", lambda *args: joined.append(args))
    monkeypatch.setattr(planning, "plain_tokens", lambda model, query, items, *rest: tokenized.append(len(items))
                        or plain(model, query, items, *rest))
    for query in (" ".join(["a"] * 200), [100] * 200):
        items: Any = ["an item"] * 64 if isinstance(query, str) else [[101]] * 64
        response = server.score(query=query, items=items)
        assert response.status_code == 413, response.text
        assert response.json()["message"].startswith("items:")
    assert joined == [] and tokenized == [64, 64]  # one call per request: the query once, each item once


def test_a_response_over_the_limit_is_400_before_any_work(tiny_model: Callable[[str], Path],
                                                          server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("bert-embed"), max_response_bytes=20_000)
    items = [f"item {i}" for i in range(50)]
    batches = _metric(server, "scorekeeper_batch_tokens_count")
    tokenized = _metric(server, "scorekeeper_stage_duration_seconds_count", stage="tokenize")
    response = server.score(query="q", items=items, return_pooled_hidden_states=True)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["message"].startswith("return_pooled_hidden_states:") and "--max-response-bytes" in error["message"]
    assert _metric(server, "scorekeeper_batch_tokens_count") == batches
    assert _metric(server, "scorekeeper_stage_duration_seconds_count", stage="tokenize") == tokenized
    assert _metric(server, "scorekeeper_rejected_requests_total", reason="response_bytes") == 1
    scores = server.score(query="q", items=items)  # the same request without hidden states fits
    assert scores.status_code == 200 and len(scores.content) < 20_000
    few = server.score(query="q", items=items[:3], return_pooled_hidden_states=True)
    assert few.status_code == 200 and len(few.json()["pooled_hidden_states"]) == 3


class _CountingTokenizer:
    """The model's tokenizer, counting the characters it is asked to tokenize."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.characters = 0

    def __call__(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        self.characters += sum(map(len, [texts] if isinstance(texts, str) else texts))
        return self.tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@pytest.mark.parametrize("model_name", ["qwen3-cls3", "bert-cross", "bert-embed"])
def test_a_text_request_over_the_token_limit_is_refused_before_it_is_tokenized_whole(
        model_name: str, tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    """2 MB of text against a limit of 4096 tokens: a bounded count proves the 413 after a small part of it."""
    server = server_for(tiny_model(model_name), max_request_tokens=4096)
    model = server.app.state.service.model
    counting = _CountingTokenizer(model.tokenizer)
    model.tokenizer = counting
    try:
        items = [" ".join(["word"] * 100)] * 4000  # 2 MB, about 400,000 tokens
        response = httpx.post(server.url + "/v1/score", json={"query": "q", "items": items}, timeout=120)
        assert response.status_code == 413, response.text
        assert response.json()["type"] == "RequestTooLarge" and "--max-request-tokens" in response.json()["message"]
        assert counting.characters < sum(map(len, items)) / 10, counting.characters
        small = httpx.post(server.url + "/v1/score", json={"query": "q", "items": items[:3]}, timeout=120)
        assert small.status_code == 200, small.text  # under the limit: counted (or not) and served
    finally:
        model.tokenizer = counting.tokenizer


def test_a_request_whose_largest_intermediate_is_over_the_limit_is_400_naming_its_field(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    """--max-intermediate-bytes of 1 MiB: 500 items × 290 label probabilities (1.16 MB of float64) are refused
    naming label_token_ids, a 600-token item (4 heads × 600² attention scores) naming items; both before any
    tokenization or forward. Fewer labels, or a shorter item, are served."""
    server = server_for(tiny_model("qwen3-causal"), max_intermediate_bytes=1 << 20, max_response_bytes=1 << 26)
    batches = _metric(server, "scorekeeper_batch_tokens_count")
    tokenized = _metric(server, "scorekeeper_stage_duration_seconds_count", stage="tokenize")
    labels = server.score(query=[5], items=[[6]] * 500, label_token_ids=list(range(290)), apply_softmax=True)
    assert labels.status_code == 400, labels.text
    error = labels.json()
    assert error["type"] == "BadRequestError" and error["message"].startswith("label_token_ids: ")
    assert "145000 float64" in error["message"] and "--max-intermediate-bytes" in error["message"]
    assert _metric(server, "scorekeeper_stage_duration_seconds_count", stage="tokenize") == tokenized
    long_item = server.score(query=[5], items=[[6] * 600], label_token_ids=[1, 2])
    assert long_item.status_code == 400, long_item.text
    assert long_item.json()["message"].startswith("items: ") and "attention scores" in long_item.json()["message"]
    assert _metric(server, "scorekeeper_batch_tokens_count") == batches  # nothing reached the model
    assert _metric(server, "scorekeeper_rejected_requests_total", reason="intermediate_bytes") == 2
    fewer = server.score(query=[5], items=[[6]] * 500, label_token_ids=list(range(200)), apply_softmax=True)
    assert fewer.status_code == 200 and len(fewer.json()["scores"][0]) == 200
    assert server.score(query=[5], items=[[6] * 200], label_token_ids=[1, 2]).status_code == 200
