"""A forward that raises fails only the request behind it (engine/queue/isolation.py): a batch of 32 requests whose
forward is made to raise on one of them (the executor's fault hook) answers that one with the error and the other 31
with the scores transformers gives them alone. An error that poisons the device (a CUDA device-side assert, injected
here as the RuntimeError PyTorch raises for one: no GPU in CI) fails every request in flight with 503 + Retry-After,
never 500, and the worker stops being ready (and alive), and asks to exit.

Deterministic: a BatchGate holds the model thread while the 32 requests queue, so they form one batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from prometheus_client.parser import text_string_to_metric_families
from scorekeeper_worker.engine.runner.packing import PackUnit
from serving import BatchGate, RunningServer, wait_until

BAD_ITEMS = 5  # the failing request alone has this many items (the others have 2)
RTOL, ATOL = 1e-4, 1e-6
TEXTS = ["alpha beta", "the quick brown fox", "gamma", "jumps over the lazy dog", "delta epsilon zeta", "eta"]


def _ask(i: int) -> dict[str, Any]:
    return {"query": TEXTS[i % len(TEXTS)] + f" {i}", "items": [TEXTS[(i + 1) % len(TEXTS)], TEXTS[(i + 2) % 6]]}


def _raise_on_mark(error: Exception) -> Callable[[list[tuple[Any, PackUnit]]], None]:
    def fault(batch: list[tuple[Any, PackUnit]]) -> None:
        if any(getattr(job, "num_items", 0) == BAD_ITEMS for job, _ in batch):
            raise error
    return fault


def _raise_in_absorb(error: Exception) -> Callable[[list[tuple[Any, PackUnit]]], None]:
    """The failing request's job raises when it takes its rows: after the forward, once the jobs before it in the
    batch have absorbed theirs (so the retried parts absorb them again)."""
    def fault(batch: list[tuple[Any, PackUnit]]) -> None:
        for job, _ in batch:
            if getattr(job, "num_items", 0) == BAD_ITEMS:
                job.absorb = _raiser(error)
    return fault


def _raiser(error: Exception) -> Callable[..., None]:
    def absorb(*_: Any) -> None:
        raise error
    return absorb


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _queue_32(server: RunningServer, gate: BatchGate, pool: ThreadPoolExecutor,
              bad_at: int) -> tuple[Future[httpx.Response], list[Future[httpx.Response]]]:
    """A primer request held at the gate, then 32 requests queued behind it (the `bad_at`-th is the one to fail)."""
    primer = pool.submit(server.score, query="primer", items=["x"])
    gate.wait_held()
    bodies = [_ask(i) if i != bad_at else {"query": "bad", "items": ["x"] * BAD_ITEMS} for i in range(32)]
    futures = [pool.submit(server.score, **body) for body in bodies]
    wait_until("32 requests queued behind the held batch", lambda: server.scheduler.open_requests == 33)
    return primer, futures


@pytest.fixture(scope="module")
def classifier(tiny_model: Callable[[str], Path]) -> Iterator[tuple[RunningServer, Any, Any]]:
    path = tiny_model("qwen3-cls3")
    server = RunningServer(model=path, max_batch_tokens=8192, max_queue_tokens=65536)
    model, tok, _ = reference.load_model(path)
    yield server, model, tok
    server.stop()


def test_one_failing_request_in_a_batch_of_32(classifier: tuple[RunningServer, Any, Any]) -> None:
    server, model, tok = classifier
    executor = server.scheduler.executor
    before = _metric(server, "scorekeeper_isolated_failures_total", cause="ValueError")
    with ThreadPoolExecutor(40) as pool, BatchGate(server.scheduler, hold=True) as gate:
        primer, futures = _queue_32(server, gate, pool, bad_at=13)
        executor.fault = _raise_on_mark(ValueError("injected forward failure"))
        try:
            gate.release()
            responses = [future.result() for future in futures]
            assert primer.result().status_code == 200
        finally:
            executor.fault = None
    assert len(gate.batches) == 2 and len({id(job) for job, _ in gate.batches[1]}) == 32  # one batch of 32
    statuses = [r.status_code for r in responses]
    assert statuses.count(500) == 1 and statuses[13] == 500 and statuses.count(200) == 31, statuses
    assert "ValueError" in responses[13].json()["message"]
    for i, response in enumerate(responses):
        if i == 13:
            continue
        ask = _ask(i)
        expected = reference.expected_scores(model, tok, "classifier", ask["query"], ask["items"])
        np.testing.assert_allclose(response.json()["scores"], expected, rtol=RTOL, atol=ATOL)
        alone = server.score(**ask).json()["scores"]  # the same request alone (float rounding of another batch)
        np.testing.assert_allclose(response.json()["scores"], alone, rtol=RTOL, atol=ATOL)
    assert _metric(server, "scorekeeper_isolated_failures_total", cause="ValueError") == before + 1
    assert server.score(**_ask(0)).status_code == 200  # and the worker serves on


def test_a_poisoned_device_fails_every_request_in_flight_with_503(tiny_model: Callable[[str], Path]) -> None:
    server = RunningServer(model=tiny_model("qwen3-cls3"), max_batch_tokens=8192, max_queue_tokens=65536)
    exits: list[str] = []
    server.app.state.on_load_failure = exits.append  # what `run` installs: write the reason, stop, exit status 4
    try:
        with ThreadPoolExecutor(40) as pool, BatchGate(server.scheduler, hold=True) as gate:
            primer, futures = _queue_32(server, gate, pool, bad_at=5)
            # What PyTorch raises for a device-side assert (torch.AcceleratorError on torch >= 2.8).
            server.scheduler.executor.fault = _raise_on_mark(
                RuntimeError("CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`"))
            gate.release()
            responses = [future.result() for future in futures]
            assert primer.result().status_code == 200
        assert {r.status_code for r in responses} == {503}, [r.status_code for r in responses]
        assert all(r.headers.get("retry-after") for r in responses)
        assert "retry" in responses[0].json()["message"]
        assert httpx.get(server.url + "/ready", timeout=30).status_code == 503
        assert httpx.get(server.url + "/health", timeout=30).status_code == 503
        after = server.score(**_ask(0))
        assert after.status_code == 503 and after.headers.get("retry-after")
        assert len(exits) == 1 and "accelerator failed" in exits[0]
        assert server.app.state.service.device_lost
        assert _metric(server, "scorekeeper_isolated_failures_total", cause="device_lost") == 1
    finally:
        server.stop()


def test_decisions_beside_a_failing_request_equal_the_same_decisions_alone(
        tiny_model: Callable[[str], Path]) -> None:
    """The batch is run again in parts: a decision job absorbs its rows again (multi-token options: child items)
    and its probabilities stay those of the request alone (each row's term is written, never added twice)."""
    server = RunningServer(model=tiny_model("qwen3-causal"), max_batch_tokens=8192, max_queue_tokens=65536,
                           multi_item_scoring=True)
    question = {"type": "choice", "instructions": "Which team?",
                "choices": [{"value": "billing"}, {"value": "technical support"}, {"value": "sales and renewals"}]}
    bodies = [{"model": "m", "input": f"message {i}", "questions": [question, {"type": "predicate",
                                                                               "instructions": f"It is {i}."}]}
              for i in range(6)]

    def decide(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(server.url + "/v1/decisions", json=body, timeout=120)

    try:
        alone = [decide(body).json()["answers"] for body in bodies]
        with ThreadPoolExecutor(10) as pool, BatchGate(server.scheduler, hold=True) as gate:
            primer = pool.submit(server.score, query="primer", items=["x"], label_token_ids=[1, 2])
            gate.wait_held()
            futures = [pool.submit(decide, body) for body in bodies[:3]]
            bad = pool.submit(server.score, query="bad", items=["x"] * BAD_ITEMS, label_token_ids=[1, 2])
            futures += [pool.submit(decide, body) for body in bodies[3:]]
            wait_until("7 requests queued", lambda: server.scheduler.open_requests == 8)
            server.scheduler.executor.fault = _raise_in_absorb(ValueError("injected failure taking its rows"))
            gate.release()
            responses = [future.result() for future in futures]
            assert primer.result().status_code == 200 and bad.result().status_code == 500
        assert len({id(job) for job, _ in gate.batches[1]}) == 7  # all of them in one batch
        for response, expected in zip(responses, alone, strict=True):
            assert response.status_code == 200, response.text
            got = response.json()["answers"]
            assert got[1]["probability"] == pytest.approx(expected[1]["probability"], abs=1e-5)
            assert [p["probability"] for p in got[0]["probabilities"]] == pytest.approx(
                [p["probability"] for p in expected[0]["probabilities"]], abs=1e-5)
    finally:
        server.scheduler.executor.fault = None
        server.stop()
