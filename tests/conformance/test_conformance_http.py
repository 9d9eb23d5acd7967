"""Conformance over HTTP: a real server on loopback per variant, concurrent clients whose requests are held behind
one batch (tests/serving.BatchGate) so that they are co-tenants of the next one; every 200 must hold the
reference's scores and every refusal must be a 400 the reference predicts. Zero wrong scores with a 200."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conformance import strategies
from conformance.compare import check
from conformance.expected import expected
from conformance.hypothesis_profile import conformance
from conformance.subjects import subject
from conformance.variants import VARIANTS, Variant
from hypothesis import given
from hypothesis import strategies as st
from serving import BatchGate, RunningServer, wait_until

DELIMITER = 3  # a token of every tiny vocabulary
SERVED = {"qwen2-reward-longrope": {"multi_item_scoring_delimiter": DELIMITER},
          "qwen2-reward-template-longrope": {"prompt_template": "qwen3-reranker",
                                             "multi_item_scoring_delimiter": DELIMITER},
          "qwen3-reranker-template": {"prompt_template": "qwen3-reranker", "multi_item_scoring": True},
          "gemma2-cls3-longrope-slidingwindow-attnlogitsoftcapping": {"multi_item_scoring": True},
          "xlmr-cross-plain": {}, "bert-embed-plain": {}}


def _variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def test_served_variants_exist() -> None:
    assert all(_variant(name) for name in SERVED)


def _send(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/v1/score", json=body, timeout=120)


@pytest.mark.parametrize("name", sorted(SERVED))
@conformance(ci_examples=3, long_examples=60)
@given(data=st.data())
def test_concurrent_clients_get_the_reference_scores(name: str, variants_dir: Path, data: st.DataObject,
                                                     server_for: Callable[..., RunningServer]) -> None:
    variant = _variant(name)
    tested = subject(variant, variants_dir)
    server = server_for(tested.path, **SERVED[name])
    bodies = data.draw(st.lists(strategies.score_body(tested), min_size=2, max_size=5), label="bodies")
    scheduler = server.scheduler
    with BatchGate(scheduler, hold=True) as gate, concurrent.futures.ThreadPoolExecutor(len(bodies) + 1) as pool:
        blocker = pool.submit(_send, server, {"query": [5], "items": [[6]]} | (
            {"label_token_ids": [1]} if variant.kind == "causal_lm" and tested.template is None else {}))
        gate.wait_held()
        sent = [pool.submit(_send, server, body) for body in bodies]
        # Every request is either queued behind the held batch or already answered (a 400 never queues).
        wait_until("every request queued or answered",
                   lambda: scheduler.open_requests - 1 + sum(f.done() for f in sent) >= len(sent))
        gate.release()
        responses = [future.result() for future in sent]
        assert blocker.result().status_code == 200, blocker.result().text
    for body, response in zip(bodies, responses, strict=True):
        assert response.status_code in (200, 400), response.text
        refusal = response.json()["message"] if response.status_code == 400 else None
        check(body, response.json()["scores"] if refusal is None else None, refusal, expected(tested, body))
