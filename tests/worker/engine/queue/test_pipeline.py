"""Two batches in flight (engine/queue/scheduler.py): batch N+1 is packed and enqueued before batch N is finished, and
everything the serial loop promised still holds with N+1 in flight: failure isolation (the batch split), cancellation,
drain on SIGTERM, the poisoned-device path, decisions' row-by-slot writes and pooled hidden states.

The device is a `HeldStream` (tests/support/held_stream.py): forwards run on the CPU when launched, and each batch
stays in flight until the test releases it, so the pipeline's states are set up deterministically, never by timing."""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from held_stream import HeldStream
from scorekeeper_worker.engine.runner.device_stream import HostStream
from serving import BatchGate, RunningServer, free_port, wait_until, wait_until_ready

# One unit each: max_batch_tokens 64 puts each of these alone in its batch, the two small ones together.
PRIMER = {"query": [5] * 30, "items": [[6] * 10]}
A = {"query": [7] * 46, "items": [[8] * 10]}  # 56 tokens
B = {"query": [9] * 30, "items": [[10] * 10]}  # 40 tokens
SMALL = {"query": [11] * 8, "items": [[12] * 2]}  # 10 tokens
BAD = {"query": [13] * 8, "items": [[14] * 2] * 3}  # three units of 10 tokens; num_items marks it


@pytest.fixture(scope="module")
def classifier(tiny_model: Callable[[str], Path]) -> Iterator[RunningServer]:
    server = RunningServer(model=tiny_model("qwen3-cls3"), max_batch_tokens=64, max_queue_tokens=4096)
    yield server
    server.stop()


@pytest.fixture()
def held(classifier: RunningServer) -> Iterator[HeldStream]:
    """The classifier's device, held: restored to the CPU's own stream after the test."""
    stream = HeldStream()
    executor = classifier.scheduler.executor
    executor.stream = stream
    yield stream
    stream.release_all()
    executor.stream, executor.fault = HostStream(), None


def _in_flight_behind_primer(server: RunningServer | _Local, stream: HeldStream, pool: ThreadPoolExecutor,
                             bodies: list[dict[str, Any]], gate: BatchGate,
                             post: Callable[..., httpx.Response] | None = None,
                             primer: dict[str, Any] = PRIMER) -> tuple[Future[httpx.Response],
                                                                      list[Future[httpx.Response]]]:
    """The primer's batch held at the gate, `bodies` queued behind it; then released until the primer's batch and the
    next one are both in flight (the stream holds them)."""
    post = post or (lambda body: server.score(**body))
    first = pool.submit(server.score, **primer)
    gate.wait_held()
    futures = []
    for queued, body in enumerate(bodies, start=2):
        futures.append(pool.submit(post, body))
        wait_until("the request to be queued", lambda n=queued: server.scheduler.open_requests == n)  # type: ignore[misc]
    gate.release()
    wait_until("two batches in flight", lambda: stream.in_flight() == 2)
    return first, futures


def _alone(server: RunningServer, body: dict[str, Any]) -> Any:
    response = server.score(**body)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_next_batch_is_enqueued_before_the_running_one_is_finished(classifier: RunningServer,
                                                                       held: HeldStream) -> None:
    expected = [_alone(classifier, body)["scores"] for body in (PRIMER, A, B)]
    held.hold()
    with ThreadPoolExecutor(3) as pool, BatchGate(classifier.scheduler, hold=True) as gate:
        primer, (a, b) = _in_flight_behind_primer(classifier, held, pool, [A, B], gate)
        assert not primer.done() and not a.done()  # launched, not finished: nothing answered yet
        held.completions[0].release()
        assert primer.result().status_code == 200
        wait_until("the third batch enqueued behind the second", lambda: len(held.completions) == 3)
        assert held.in_flight() == 2 and not a.done() and not b.done()
        held.release_all()
        responses = [primer.result(), a.result(), b.result()]
    assert [[job.num_items for job, _ in batch] for batch in gate.batches] == [[1], [1], [1]]
    for response, want in zip(responses, expected, strict=True):
        np.testing.assert_allclose(response.json()["scores"], want, rtol=1e-6, atol=1e-7)


def _fault_for_bad(error: Exception) -> Callable[[list[tuple[Any, Any]]], None]:
    def fault(batch: list[tuple[Any, Any]]) -> None:
        if any(getattr(job, "num_items", 0) == len(BAD["items"]) for job, _ in batch):
            raise error
    return fault


def test_a_batch_failing_at_launch_is_split_after_the_batch_in_flight_is_finished(classifier: RunningServer,
                                                                                  held: HeldStream) -> None:
    expected = {name: _alone(classifier, body)["scores"] for name, body in (("a", A), ("small", SMALL))}
    held.hold()
    classifier.scheduler.executor.fault = _fault_for_bad(ValueError("injected launch failure"))
    with ThreadPoolExecutor(4) as pool, BatchGate(classifier.scheduler, hold=True) as gate:
        primer, (a, small, bad) = _in_flight_behind_primer(classifier, held, pool, [A, SMALL, BAD], gate)
        held.completions[0].release()
        assert primer.result().status_code == 200
        # The small and bad requests' batch failed at launch: nothing of it was enqueued, and it waits for A.
        assert len(held.completions) == 2 and not small.done() and not bad.done()
        held.release_all()
        responses = {"a": a.result(), "small": small.result(), "bad": bad.result()}
    assert [sorted(job.num_items for job, _ in batch) for batch in gate.batches] == [[1], [1], [1, 3, 3, 3]]
    assert responses["bad"].status_code == 500 and "ValueError" in responses["bad"].json()["message"]
    for name in ("a", "small"):
        np.testing.assert_allclose(responses[name].json()["scores"], expected[name], rtol=1e-6, atol=1e-7)


def test_a_batch_failing_when_finished_is_split_while_the_next_is_in_flight(classifier: RunningServer,
                                                                           held: HeldStream) -> None:
    """SMALL and BAD share the batch behind the primer; BAD's job raises when it takes its rows, with A's batch
    already enqueued behind: SMALL is answered from the parts run again, A from its own batch."""
    expected = {name: _alone(classifier, body)["scores"] for name, body in (("a", A), ("small", SMALL))}
    held.hold()

    def raise_in_absorb(batch: list[tuple[Any, Any]]) -> None:
        for job, _ in batch:
            if job.num_items == len(BAD["items"]):
                job.absorb = _raiser

    classifier.scheduler.executor.fault = raise_in_absorb
    with ThreadPoolExecutor(4) as pool, BatchGate(classifier.scheduler, hold=True) as gate:
        primer, (small, bad, a) = _in_flight_behind_primer(classifier, held, pool, [SMALL, BAD, A], gate)
        held.completions[0].release()
        wait_until("A's batch enqueued behind the failing one", lambda: len(held.completions) == 3)
        held.release_all()
        responses = {"primer": primer.result(), "small": small.result(), "bad": bad.result(), "a": a.result()}
    assert [sorted(job.num_items for job, _ in batch) for batch in gate.batches] == [[1], [1, 3, 3, 3], [1]]
    assert responses["primer"].status_code == 200
    assert responses["bad"].status_code == 500, responses["bad"].text
    for name in ("a", "small"):
        np.testing.assert_allclose(responses[name].json()["scores"], expected[name], rtol=1e-6, atol=1e-7)


def _raiser(*_: Any) -> None:
    raise ValueError("injected failure taking its rows")


def test_a_client_gone_while_its_batch_is_in_flight_costs_nobody_else(classifier: RunningServer,
                                                                     held: HeldStream) -> None:
    expected = _alone(classifier, B)["scores"]
    held.hold()
    scheduler = classifier.scheduler
    with ThreadPoolExecutor(3) as pool, BatchGate(scheduler, hold=True) as gate:
        primer = pool.submit(classifier.score, **PRIMER)
        gate.wait_held()
        client = socket.create_connection(("127.0.0.1", classifier.port), timeout=60)
        payload = json.dumps(A).encode()
        client.sendall(b"POST /v1/score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        wait_until("A queued", lambda: scheduler.open_requests == 2)
        b = pool.submit(classifier.score, **B)
        wait_until("B queued", lambda: scheduler.open_requests == 3)
        gate.release()
        wait_until("the primer's and A's batches in flight", lambda: held.in_flight() == 2)
        client.shutdown(socket.SHUT_RDWR)
        client.close()
        wait_until("A's request dropped while its batch is in flight", lambda: scheduler.open_requests == 2)
        held.release_all()
        assert primer.result().status_code == 200 and b.result().status_code == 200
    np.testing.assert_allclose(b.result().json()["scores"], expected, rtol=1e-6, atol=1e-7)
    wait_until("every request closed", lambda: scheduler.open_requests == 0)


def test_sigterm_with_two_batches_in_flight_answers_both_and_the_queue(tiny_model: Callable[[str], Path]) -> None:
    """The drain (the worker's own server, as `run` builds it) waits for both batches in flight and the queued one."""
    from scorekeeper_worker.api.server import build_server
    from scorekeeper_worker.base.config import WorkerConfig

    port = free_port()
    server = build_server(WorkerConfig(model=tiny_model("qwen3-cls3"), port=port, log_level="warning",
                                       gc_freeze=False, max_batch_tokens=64))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    held = HeldStream()
    try:
        wait_until_ready(f"http://127.0.0.1:{port}")
        scheduler = server.config.app.state.service.scheduler
        held.hold()
        scheduler.executor.stream = held
        local = _Local(f"http://127.0.0.1:{port}", port, scheduler)
        with ThreadPoolExecutor(3) as pool, BatchGate(scheduler, hold=True) as gate:
            primer, (a, b) = _in_flight_behind_primer(local, held, pool, [A, B], gate)
            server.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
            ready = httpx.get(local.url + "/ready", timeout=10)
            assert ready.status_code == 503 and "draining" in ready.json()["message"]
            held.release_all()
            assert [f.result().status_code for f in (primer, a, b)] == [200, 200, 200]
        thread.join(60)  # nothing left in flight: the server stops by itself
        assert not thread.is_alive()
    finally:
        held.release_all()
        server.should_exit = True
        thread.join(30)


class _Local:
    """What `_in_flight_behind_primer` needs of a server started by `build_server`."""

    def __init__(self, url: str, port: int, scheduler: Any) -> None:
        self.url, self.port, self.scheduler = url, port, scheduler

    def score(self, **body: Any) -> httpx.Response:
        return httpx.post(self.url + "/v1/score", json=body, timeout=120)


def test_a_device_error_with_two_batches_in_flight_fails_them_and_the_queue_with_503(
        tiny_model: Callable[[str], Path]) -> None:
    server = RunningServer(model=tiny_model("qwen3-cls3"), max_batch_tokens=64)
    server.app.state.on_load_failure = lambda reason: None  # what `run` installs: exit once the device is lost
    held = HeldStream()
    held.hold()
    server.scheduler.executor.stream = held
    try:
        with ThreadPoolExecutor(3) as pool, BatchGate(server.scheduler, hold=True) as gate:
            primer, (a, b) = _in_flight_behind_primer(server, held, pool, [A, B], gate)
            # What PyTorch raises at the wait when a kernel of the batch hit a device-side assert.
            held.completions[0].release(RuntimeError("CUDA error: device-side assert triggered"))
            responses = [f.result() for f in (primer, a, b)]
        assert [r.status_code for r in responses] == [503, 503, 503], [r.text for r in responses]
        assert all(r.headers.get("retry-after") for r in responses)
        assert httpx.get(server.url + "/ready", timeout=30).status_code == 503
    finally:
        held.release_all()
        server.stop()


def test_pooled_hidden_states_with_two_batches_in_flight(classifier: RunningServer, held: HeldStream) -> None:
    bodies = [{**body, "return_pooled_hidden_states": True} for body in (A, B)]
    expected = [_alone(classifier, body) for body in bodies]
    held.hold()
    with ThreadPoolExecutor(3) as pool, BatchGate(classifier.scheduler, hold=True) as gate:
        _, futures = _in_flight_behind_primer(classifier, held, pool, bodies, gate)
        held.release_all()
        responses = [f.result() for f in futures]
    for response, want in zip(responses, expected, strict=True):
        got = response.json()
        np.testing.assert_allclose(got["pooled_hidden_states"], want["pooled_hidden_states"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-6, atol=1e-7)


def test_decisions_with_two_batches_in_flight_equal_the_same_decisions_alone(
        tiny_model: Callable[[str], Path]) -> None:
    """Decisions write their rows' terms by slot: with the next batch in flight (multi-token options: child items,
    rows of one request in two batches) the probabilities are those of each request alone."""
    server = RunningServer(model=tiny_model("qwen3-causal"), max_batch_tokens=64, multi_item_scoring=True)
    question = {"type": "choice", "instructions": "Which team?",
                "choices": [{"value": "billing"}, {"value": "technical support"}, {"value": "sales and renewals"}]}
    bodies = [{"model": "m", "input": f"message {i}", "questions": [question, {"type": "predicate",
                                                                               "instructions": f"It is {i}."}]}
              for i in range(3)]

    def decide(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(server.url + "/v1/decisions", json=body, timeout=120)

    held = HeldStream()
    try:
        alone = [decide(body).json()["answers"] for body in bodies]
        held.hold()
        server.scheduler.executor.stream = held
        with ThreadPoolExecutor(4) as pool, BatchGate(server.scheduler, hold=True) as gate:
            primer, futures = _in_flight_behind_primer(server, held, pool, bodies, gate, post=decide,
                                                       primer={**PRIMER, "label_token_ids": [1, 2]})
            held.release_all()
            responses = [f.result() for f in futures]
        assert primer.result().status_code == 200
        for response, expected in zip(responses, alone, strict=True):
            assert response.status_code == 200, response.text
            got = response.json()["answers"]
            assert got[1]["probability"] == pytest.approx(expected[1]["probability"], abs=1e-6)
            assert [p["probability"] for p in got[0]["probabilities"]] == pytest.approx(
                [p["probability"] for p in expected[0]["probabilities"]], abs=1e-6)
    finally:
        held.release_all()
        server.stop()
