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
        if any(job.num_items == BAD_ITEMS for job, _ in batch):
            raise error
    return fault


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
