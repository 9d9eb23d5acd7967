"""A request whose client went away, or that ran past --request-timeout-seconds, loses its queued work at once: the
queued-token gauge goes back, other requests are admitted, and none of its units runs later. The model thread is
held at a batch (a scheduler observer) so the queue is set up deterministically, never by timing."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from serving import BatchGate, RunningServer, wait_until

LARGE = {"query": [5] * 56, "items": [[6 + i] * 8 for i in range(20)]}  # 20 units of 64 tokens (one batch each)
SMALL = {"query": [7, 8], "items": [[9, 10]]}


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _send_and_keep_open(server: RunningServer, body: dict[str, object]) -> socket.socket:
    """A client that sends a request and will hang up without reading the answer (like `curl --max-time`)."""
    payload = json.dumps(body).encode()
    client = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    client.sendall(b"POST /v1/score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    return client


def test_a_disconnected_client_drops_its_queued_work(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_batch_tokens=64, max_queue_tokens=256)
    scheduler = server.scheduler
    expected = server.score(**SMALL).json()["scores"]
    with BatchGate(scheduler, hold=True) as gate, ThreadPoolExecutor(2) as pool:
        first = pool.submit(server.score, **SMALL)
        gate.wait_held()  # the first request's batch is formed; the model thread waits before running it
        client = _send_and_keep_open(server, LARGE)
        wait_until("the large request to be queued", lambda: scheduler.queued_tokens == 20 * 64)
        refused = server.score(**SMALL)
        assert refused.status_code == 429, refused.text  # the large request fills the queue
        client.shutdown(socket.SHUT_RDWR)
        client.close()
        # Dropped at once, while the model thread is still held: no batch had to run for it.
        wait_until("the large request's work to be dropped", lambda: scheduler.open_requests == 1)
        assert scheduler.queued_tokens == 0 and _metric(server, "scorekeeper_queue_tokens") == 0
        later = pool.submit(server.score, **SMALL)
        wait_until("a later request to be admitted", lambda: scheduler.open_requests == 2)
        gate.release()
        responses = [first.result(), later.result()]
    for response in responses:
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["scores"], expected, rtol=1e-5, atol=1e-6)
    assert [[job.num_items for job, _ in batch] for batch in gate.batches] == [[1], [1]]  # no large unit ran
    assert _metric(server, "scorekeeper_cancelled_requests_total", reason="disconnect") == 1
    assert _metric(server, "scorekeeper_requests_total", route="/v1/score", code="499") == 1
    assert _metric(server, "scorekeeper_queue_depth") == 0


def test_a_request_past_its_timeout_gets_504_and_its_work_is_dropped(
        tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("qwen3-cls3"), max_batch_tokens=64, request_timeout_seconds=0.5)
    scheduler = server.scheduler
    with BatchGate(scheduler, hold=True) as gate, ThreadPoolExecutor(2) as pool:
        running = pool.submit(server.score, **SMALL)
        gate.wait_held()
        queued = pool.submit(server.score, **LARGE)
        # The model thread stays held, so both requests run past their timeout whatever the machine's speed.
        responses = [running.result(), queued.result()]
        for response in responses:
            assert response.status_code == 504, response.text
            error = response.json()
            assert error["object"] == "error" and error["code"] == 504 and error["type"] == "GatewayTimeout"
            assert "--request-timeout-seconds" in error["message"]
        assert scheduler.queued_tokens == 0 and scheduler.open_requests == 0
        gate.release()
        after = server.score(**SMALL)
    assert after.status_code == 200, after.text
    # The held batch ran (a forward cannot be interrupted); no unit of the large request ever did.
    assert [[job.num_items for job, _ in batch] for batch in gate.batches] == [[1], [1]]
    assert _metric(server, "scorekeeper_cancelled_requests_total", reason="timeout") == 2
    assert _metric(server, "scorekeeper_queue_tokens") == 0 and _metric(server, "scorekeeper_queue_depth") == 0
