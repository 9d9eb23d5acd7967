"""Slow, silent and hostile clients cost the worker nothing: they are timed out, capped, cut off after a refusal,
and cannot write into its logs. No API key is needed for any of these, so none is used.

One worker process, with the file-descriptor limit of a default container (1024) and short HTTP timeouts, so that
1,100 half-open connections are more than it could hold; its log goes to a file the tests read. Every wait is for a
state (a closed socket, an answer) with a generous bound, never a duration."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from serving import free_port, wait_until_ready

KEY = "sk-hostile-clients-0123456789"
FD_LIMIT = 1024  # a default container's soft and hard limit
BOUND = 30.0  # seconds: the generous bound on every wait (the configured timeouts are 1 s)


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    metrics_port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module")
def worker(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    root = tmp_path_factory.mktemp("hostile")
    (root / "keys").write_text(KEY + "\n")
    port, metrics_port = free_port(), free_port()
    log = root / "worker.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-cls3")),
             "--port", str(port), "--metrics-port", str(metrics_port), "--api-key-file", str(root / "keys"),
             "--log-level", "info", "--http-header-timeout-seconds", "1", "--http-body-timeout-seconds", "1"],
            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=_limit_fds)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, timeout=600)
        yield Worker(process, url, port, metrics_port, log)
    finally:
        process.kill()
        process.wait(30)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    sock.settimeout(BOUND)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout after BOUND if it never does)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def _json_error(raw: bytes, status: int) -> dict[str, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), raw[:300]
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"] == "application/json" and headers.get("x-request-id"), headers
    error: dict[str, object] = json.loads(body)
    assert set(error) == {"object", "message", "type", "code"} and error["code"] == status, error
    return error


def test_a_silent_connection_is_closed(worker: Worker) -> None:
    with _connect(worker.port) as sock:
        assert _read_until_closed(sock) == b""  # nothing sent, nothing to answer: closed


def test_an_unfinished_request_head_is_timed_out(worker: Worker) -> None:
    with _connect(worker.port) as sock:
        sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # ... and never the rest
        error = _json_error(_read_until_closed(sock), 408)
    assert "header" in str(error["message"])


def test_an_unfinished_body_is_timed_out(worker: Worker) -> None:
    with _connect(worker.port) as sock:
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"query\": ".encode())
        error = _json_error(_read_until_closed(sock), 408)
    assert "body" in str(error["message"])


def test_an_unauthenticated_upload_is_cut_off_after_its_401(worker: Worker) -> None:
    """The client keeps sending, a byte at a time (each byte used to restart uvicorn's keep-alive timer)."""
    closed = threading.Event()

    def trickle(sock: socket.socket) -> None:
        try:
            while not closed.wait(0.2):  # the pace of the upload (the test's input), not a synchronisation
                sock.send(b" ")
        except OSError:  # the server closed the connection
            pass

    with _connect(worker.port) as sock:
        sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000\r\n\r\n" + b" " * 1000)  # 100 MB announced
        sender = threading.Thread(target=trickle, args=(sock,))
        sender.start()
        try:
            raw = _read_until_closed(sock)  # the server must close: it does not wait for the other 99.9 MB
        finally:
            closed.set()
            sender.join(BOUND)
    assert raw.startswith(b"HTTP/1.1 401 ")


def test_a_malformed_request_gets_the_error_shape(worker: Worker) -> None:
    with _connect(worker.port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n")
        error = _json_error(_read_until_closed(sock), 400)
    assert error["type"] == "BadRequestError"


def test_control_characters_in_the_path_forge_no_log_line(worker: Worker) -> None:
    """Without a key: the 401 is logged with the path as the client sent it, percent-decoded."""
    forged = "FORGED 2026-01-01 00:00:00,000 INFO uvicorn.access fake"
    response = httpx.post(worker.url + "/v1/score%0D%0A" + forged.replace(" ", "%20") + "%0A", timeout=BOUND)
    assert response.status_code == 401
    marker = response.headers["x-request-id"]
    httpx.get(worker.url + "/health", timeout=BOUND)  # one more access line, written after the forged request's
    lines = worker.log_text().splitlines()
    assert not [line for line in lines if line.startswith("FORGED")], lines[-5:]
    assert [line for line in lines if marker in line and "FORGED" in line]  # logged, escaped, on its own line


def test_a_trailing_slash_is_no_redirect_to_the_client_s_host(worker: Worker) -> None:
    response = httpx.get(worker.url + "/health/", headers={"host": "attacker.example"}, timeout=BOUND)
    assert "location" not in response.headers
    assert response.status_code == 404 and response.json()["type"] == "NotFoundError"


def test_half_open_connections_leave_health_and_metrics_answering(worker: Worker) -> None:
    sockets = []
    try:
        for _ in range(1100):  # more than the worker's 1024 file descriptors
            sockets.append(socket.create_connection(("127.0.0.1", worker.port), timeout=BOUND))
        assert httpx.get(worker.url + "/health", timeout=BOUND).status_code == 200
        scrape = httpx.get(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=BOUND)
        assert scrape.status_code == 200 and "scorekeeper_requests_total" in scrape.text
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.get(worker.url + "/health", timeout=BOUND).status_code == 200
    text = worker.log_text()
    assert "Too many open files" not in text and "Traceback" not in text, text[-3000:]


def test_a_slow_scrape_is_closed_on_the_metrics_port(worker: Worker) -> None:
    with _connect(worker.metrics_port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        _json_error(_read_until_closed(sock), 408)
