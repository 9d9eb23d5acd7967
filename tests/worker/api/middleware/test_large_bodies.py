"""Large bodies cost the event loop nothing (issue 48, defect 4): they are parsed in a worker thread, one at a time,
behind a bounded line (api/middleware/parse_gate.py), and the scan that refuses hostile ones before parsing works a
bounded chunk at a time (api/middleware/per_request.py `structure`).

The parser is held on an Event: /health and /ready answer while a large body is mid-parse, later large bodies wait
in line without being parsed, one past the line is refused with 429 at once, and a small body is not held behind
them. Every wait is for a state, with a generous bound; nothing is timed."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import scorekeeper_worker.api.middleware.per_request as per_request
from scorekeeper_worker.api.middleware.parse_gate import LARGE_BODY_BYTES, ParseGate
from serving import RunningServer

BOUND = 60.0  # seconds: the bound on every wait for a state
LARGE = json.dumps({"query": "q", "items": ["a"], "ignored": "x" * LARGE_BODY_BYTES}).encode()
SMALL = json.dumps({"query": "q", "items": ["a"]}).encode()


class HeldParser:
    """per_request.parse, held before it starts on a large body until `release` is set; counts the parses."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started = 0
        self.parse = per_request.parse

    def __call__(self, body: bytes, *args: Any) -> Any:
        if len(body) < LARGE_BODY_BYTES:
            return self.parse(body, *args)
        with self.lock:
            self.running += 1
            self.started += 1
            self.most = max(self.most, self.running)
        try:
            assert self.release.wait(BOUND), "never released"
            return self.parse(body, *args)
        finally:
            with self.lock:
                self.running -= 1


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)  # polls a state; the test's outcome never depends on how long this takes


@pytest.fixture(scope="module")
def server(tiny_model: Callable[[str], Path]) -> Iterator[RunningServer]:
    running = RunningServer(model=tiny_model("bert-cross"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def held(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldParser]:
    parser = HeldParser()
    monkeypatch.setattr(per_request, "parse", parser)
    monkeypatch.setattr(server.app.state, "parse_gate", ParseGate(slots=1, waiting=2), raising=False)
    try:
        yield parser
    finally:
        parser.release.set()


def _post(server: RunningServer, body: bytes) -> httpx.Response:
    return httpx.post(server.url + "/v1/score", content=body, headers={"content-type": "application/json"},
                      timeout=BOUND)


def test_health_and_ready_answer_while_a_large_body_is_parsed(server: RunningServer, held: HeldParser) -> None:
    with ThreadPoolExecutor(1) as pool:
        scored = pool.submit(_post, server, LARGE)
        _until(lambda: held.running == 1, "the large body reaches the parser")
        assert httpx.get(server.url + "/health", timeout=BOUND).status_code == 200
        assert httpx.get(server.url + "/ready", timeout=BOUND).status_code == 200
        assert not scored.done()
        held.release.set()
        assert scored.result().status_code == 200


def test_large_bodies_are_parsed_one_at_a_time_and_a_full_line_is_429(server: RunningServer,
                                                                       held: HeldParser) -> None:
    gate = server.app.state.parse_gate
    with ThreadPoolExecutor(3) as pool:
        posted: list[Future[httpx.Response]] = [pool.submit(_post, server, LARGE) for _ in range(3)]
        _until(lambda: held.started == 1 and gate.waiting == 2, "one large body parsed, two in line")
        refused = _post(server, LARGE)  # the line is full
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1" and refused.json()["type"] == "TooManyRequests"
        assert "large request bodies are being parsed" in refused.json()["message"]
        assert _post(server, SMALL).status_code == 200  # a small body does not wait behind them
        assert httpx.get(server.url + "/health", timeout=BOUND).status_code == 200
        assert held.started == 1 and not any(p.done() for p in posted)
        held.release.set()
        assert [p.result().status_code for p in posted] == [200, 200, 200]
    assert held.started == 3 and held.most == 1
    assert gate.running == 0 and gate.waiting == 0
    metrics = httpx.get(server.url + "/metrics", timeout=BOUND).text
    assert 'scorekeeper_rejected_requests_total{reason="parse_queue_full"} 1.0' in metrics


def test_a_client_gone_mid_parse_keeps_its_slot_until_the_parse_ends(server: RunningServer,
                                                                      held: HeldParser) -> None:
    """The thread cannot be stopped: the slot is freed when it is done, not when its client leaves."""
    gate = server.app.state.parse_gate
    with ThreadPoolExecutor(1) as pool:
        gone = pool.submit(lambda: httpx.post(server.url + "/v1/score", content=LARGE, timeout=1.0,
                                              headers={"content-type": "application/json"}))
        _until(lambda: held.running == 1, "the large body reaches the parser")
        with pytest.raises(httpx.TimeoutException):
            gone.result()
        assert gate.running == 1
        held.release.set()
    _until(lambda: gate.running == 0, "the slot is freed once the parse ends")
    assert _post(server, LARGE).status_code == 200


def _reference(body: bytes) -> per_request.Structure:
    """Brackets outside strings, counted one byte at a time."""
    containers = depth = level = 0
    inside = escaped = False
    for byte in body.decode("latin-1"):
        if inside:
            inside = escaped or byte != '"'
            escaped = not escaped and byte == "\\"
        elif byte == '"':
            inside = True
        elif byte in "[{":
            containers, level = containers + 1, level + 1
            depth = max(depth, level)
        elif byte in "]}":
            level -= 1
    return per_request.Structure(containers, depth)


@pytest.mark.parametrize("seed", range(20))
def test_the_scan_in_chunks_counts_as_the_whole_body(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 bytes cut strings, escapes and runs of backslashes anywhere: the same count and depth."""
    rng = random.Random(seed)
    parts = ['"a\\\\"', '"\\""', '"[{"', "[", "]", "{", "}", '"\\\\\\""', "1", ",", '"x"', ":"]
    body = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 300))).encode()
    whole = per_request.structure(body)
    assert whole == _reference(body)
    monkeypatch.setattr(per_request, "SCAN_CHUNK", 7)
    assert per_request.structure(body) == whole
