"""Conformance over HTTP: a real server on loopback per variant, concurrent clients whose requests are held behind
one batch (tests/support/serving.BatchGate) so that they are co-tenants of the next one; every 200 must hold the
reference's scores (for /v1/rerank: its relevance and ranking) and every refusal must be a 400 the reference
predicts. Zero wrong scores with a 200."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import strategies
from compare import check
from expected import expected
from expected_rerank import check_ranking, relevance
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_profile import conformance
from serving import BatchGate, RunningServer, wait_until
from subjects import Subject, subject
from variants import SENTENCE_VARIANTS, VARIANTS, SentenceVariant, Variant

DELIMITER = 3  # a token of every tiny vocabulary
SERVED = {"qwen2-reward-longrope": {"multi_item_scoring_delimiter": DELIMITER},
          "qwen2-reward-template-longrope": {"prompt_template": "qwen3-reranker",
                                             "multi_item_scoring_delimiter": DELIMITER},
          "qwen3-reranker-template": {"prompt_template": "qwen3-reranker", "multi_item_scoring": True},
          "gemma2-cls3-longrope-slidingwindow-attnlogitsoftcapping": {"multi_item_scoring": True},
          "xlmr-cross-plain": {}, "bert-embed-plain": {},
          # Tokenizers larger than the embedding matrix: a 400 for the requests that reach past it, beside co-tenants.
          "qwen3-cls3-oversized": {}, "bert-cross-oversized": {}}
# /v1/rerank: every relevance rule (an activation declared each way sentence-transformers reads it, several classes,
# multi-label, label tokens, an embedding model's similarity under its prompt), on servers of SERVED where they fit.
RERANKED = {name: SERVED[name] for name in ("xlmr-cross-plain", "qwen3-reranker-template", "qwen2-reward-longrope",
                                            "gemma2-cls3-longrope-slidingwindow-attnlogitsoftcapping")} | {
    "bert-cross-identity-st6": {}, "electra-cross-tanh-st6": {}, "bert-cross-identity-st5": {},
    "xlmr-cross-tanh-legacy": {}, "roberta-cross-multilabel": {}, "qwen3-cls3-multilabel": {},
    "bert-prompt-excluded": {}}


def _variant(name: str) -> Variant | SentenceVariant:
    return next(v for v in [*VARIANTS, *SENTENCE_VARIANTS] if v.name == name)


def test_served_variants_exist() -> None:
    assert all(_variant(name) for name in [*SERVED, *RERANKED])


def _send(server: RunningServer, body: dict[str, Any], route: str = "/v1/score") -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=120)


def _co_tenants(server: RunningServer, tested: Subject, bodies: list[dict[str, Any]], route: str
                ) -> list[httpx.Response]:
    """`bodies` sent at once, held behind one batch so that they are its co-tenants."""
    scheduler = server.scheduler
    with BatchGate(scheduler, hold=True) as gate, concurrent.futures.ThreadPoolExecutor(len(bodies) + 1) as pool:
        blocker = pool.submit(_send, server, {"query": [5], "items": [[6]]} | (
            {"label_token_ids": [1]} if tested.kind == "causal_lm" and tested.template is None else {}))
        gate.wait_held()
        sent = [pool.submit(_send, server, body, route) for body in bodies]
        # Every request is either queued behind the held batch or already answered (a 400 never queues).
        wait_until("every request queued or answered",
                   lambda: scheduler.open_requests - 1 + sum(f.done() for f in sent) >= len(sent))
        gate.release()
        responses = [future.result() for future in sent]
        assert blocker.result().status_code == 200, blocker.result().text
    for response in responses:
        assert response.status_code in (200, 400), response.text
    return responses


def _rows(answer: dict[str, Any]) -> list[list[float]]:
    """A /v1/score answer's rows, each followed by its pooled hidden state when it has them (as the reference)."""
    pooled = answer.get("pooled_hidden_states")
    return answer["scores"] if pooled is None else [row + state for row, state in zip(answer["scores"], pooled,
                                                                                       strict=True)]


@pytest.mark.parametrize("name", sorted(SERVED))
@conformance(ci_examples=3, long_examples=60)
@given(data=st.data())
def test_concurrent_clients_get_the_reference_scores(name: str, variants_dir: Path, data: st.DataObject,
                                                     server_for: Callable[..., RunningServer]) -> None:
    tested = subject(_variant(name), variants_dir)
    server = server_for(tested.path, **SERVED[name])
    bodies = data.draw(st.lists(strategies.score_body(tested), min_size=2, max_size=5), label="bodies")
    for body, response in zip(bodies, _co_tenants(server, tested, bodies, "/v1/score"), strict=True):
        refusal = response.json()["message"] if response.status_code == 400 else None
        check(body, None if refusal is not None else _rows(response.json()), refusal, expected(tested, body))


@pytest.mark.parametrize("name", sorted(RERANKED))
@conformance(ci_examples=3, long_examples=60)
@given(data=st.data())
def test_concurrent_rerank_clients_get_the_reference_ranking(name: str, variants_dir: Path, data: st.DataObject,
                                                             server_for: Callable[..., RunningServer]) -> None:
    tested = subject(_variant(name), variants_dir)
    server = server_for(tested.path, **RERANKED[name])
    bodies = data.draw(st.lists(strategies.rerank_body(tested), min_size=2, max_size=5), label="bodies")
    for body, response in zip(bodies, _co_tenants(server, tested, bodies, "/v1/rerank"), strict=True):
        refusal = response.json()["message"] if response.status_code == 400 else None
        check_ranking(body, response.json() if refusal is None else None, refusal, relevance(tested, body))
