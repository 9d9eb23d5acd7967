"""The bounded load the observability tests send, and what it implies: every request's effect on the counters,
accumulated from the requests and the workers' responses (Sent)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from obs_harness import WorkerThread
from serving import BatchGate

OVERFLOW_REJECTIONS = 3


@dataclass
class Sent:
    """What the test's requests imply, accumulated from the requests and the workers' responses."""

    score_ok: int = 0
    rerank_ok: int = 0
    bad: int = 0
    unknown_path: int = 0
    items: dict[str, int] = field(default_factory=lambda: {"single_item": 0, "multi_item": 0})
    requests: dict[str, int] = field(default_factory=lambda: {"single_item": 0, "multi_item": 0})
    pooled_requests: int = 0
    pooled_items: int = 0
    prompt_tokens: int = 0
    sequences: int = 0  # pack units: one per single-item item, one per (small) multi-item request

    @property
    def scored(self) -> int:
        return self.requests["single_item"] + self.requests["multi_item"]


def score(worker: WorkerThread, sent: Sent, items: list[str], *, pooled: bool = False,
          multi_item: bool = False) -> None:
    body: dict[str, Any] = {"query": "which river runs through the city", "items": items,
                            "return_pooled_hidden_states": pooled, "multi_item_scoring": multi_item}
    response = httpx.post(worker.url + "/v1/score", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data = response.json()
    mode = "multi_item" if multi_item else "single_item"
    sent.score_ok += 1
    sent.items[mode] += len(items)
    sent.requests[mode] += 1
    sent.prompt_tokens += data["usage"]["prompt_tokens"]
    sent.sequences += 1 if multi_item else len(items)
    if pooled:
        sent.pooled_requests += 1
        sent.pooled_items += len(items)
        assert len(data["pooled_hidden_states"]) == len(items)
    else:
        assert data.get("pooled_hidden_states") is None


def rerank(worker: WorkerThread, sent: Sent, documents: list[str]) -> None:
    response = httpx.post(worker.url + "/v1/rerank", json={"query": "city rivers", "documents": documents},
                          timeout=60)
    assert response.status_code == 200, response.text
    sent.rerank_ok += 1
    sent.items["single_item"] += len(documents)
    sent.requests["single_item"] += 1
    sent.prompt_tokens += response.json()["usage"]["prompt_tokens"]
    sent.sequences += len(documents)


def sequential(worker: WorkerThread) -> Sent:
    """Sequential requests: each fits one batch, so the batch and stage counters are predictable exactly."""
    sent = Sent()
    for i in range(10):
        score(worker, sent, [f"item {i}.{j} about bridges and rivers" for j in range(1 + i % 4)], pooled=i % 2 == 0)
    for i in range(6):
        score(worker, sent, [f"candidate {i}.{j}" for j in range(2 + i % 3)], pooled=i % 3 == 0, multi_item=True)
    for i in range(2):
        rerank(worker, sent, [f"document {i}.{j}" for j in range(3)])
    for body in ({"query": "q", "items": ["a"], "temperature": 0}, {"query": "q"}):  # invalid: 400, never tokenized
        response = httpx.post(worker.url + "/v1/score", json=body, timeout=60)
        assert response.status_code == 400, response.text
        sent.bad += 1
    assert httpx.get(worker.url + "/no/such/path", timeout=10).status_code == 404
    sent.unknown_path += 1
    return sent


def concurrent(worker: WorkerThread) -> Sent:
    """Concurrent requests from several clients: batches mix requests; item and byte counters stay exact."""
    sent = Sent()
    lock = threading.Lock()

    def one(i: int) -> None:
        local = Sent()
        score(worker, local, [f"parallel {i}.{j} text" for j in range(3)], pooled=i % 3 == 0,
              multi_item=i % 4 == 1)
        with lock:
            for mode in ("single_item", "multi_item"):
                sent.items[mode] += local.items[mode]
                sent.requests[mode] += local.requests[mode]
            sent.score_ok += local.score_ok
            sent.pooled_requests += local.pooled_requests
            sent.pooled_items += local.pooled_items
            sent.prompt_tokens += local.prompt_tokens
            sent.sequences += local.sequences

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(one, range(24)))
    return sent


def overflow(worker: WorkerThread) -> int:
    """One large request (60 one-unit batches: batch budget 16 tokens) is admitted into the empty queue and its first
    batch is held (a scheduler observer), so the rest of it stays queued: small requests sent then find the queue over
    its 16-token limit and get 429, whatever the machine's load. Returns how many 429s came back."""
    body = {"query": "a query about rivers", "items": [f"a long item number {i}" for i in range(60)]}
    with BatchGate(worker.app.state.service.scheduler, hold=True) as gate, ThreadPoolExecutor(1) as pool:
        large = pool.submit(httpx.post, worker.url + "/v1/score", json=body, timeout=120)
        gate.wait_held()
        for _ in range(OVERFLOW_REJECTIONS):
            response = httpx.post(worker.url + "/v1/score", json={"query": "q", "items": ["x"]}, timeout=60)
            assert response.status_code == 429, response.text
            assert response.headers["retry-after"] == "1"
        gate.release()
        assert large.result().status_code == 200
    return OVERFLOW_REJECTIONS

