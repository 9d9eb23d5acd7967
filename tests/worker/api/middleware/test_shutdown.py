"""SIGTERM drains: requests in flight when the worker is asked to stop still get their answers."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from serving import free_port, wait_until_ready


def test_sigterm_drains_in_flight_requests(tiny_model: Callable[[str], Path]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-reward")),
         "--host", "127.0.0.1", "--port", str(port), "--max-batch-tokens", "2048", "--log-level", "warning",
         "--drain-timeout-seconds", "600"],  # the drain is under test, not its timeout: a loaded CI machine is slow
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_until_ready(url, process, timeout=600)  # a bound for a broken start: loading is slow on a busy CPU
        items = [[10 + (i % 200)] * 60 for i in range(600)]  # ~36k tokens: a few seconds on CPU
        results: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/score", json={"query": [5, 6], "items": items}, timeout=900)))
        sender.start()
        while sender.is_alive() and "scorekeeper_queue_tokens 0.0" in httpx.get(url + "/metrics", timeout=5).text:
            time.sleep(0.02)  # wait for a state: the request is admitted (queued tokens > 0)
        process.send_signal(signal.SIGTERM)
        sender.join(900)
        assert results and results[0].status_code == 200, results
        assert len(results[0].json()["scores"]) == len(items)
        # A clean exit: uvicorn finishes its shutdown, then re-raises the signal it handled (exit by SIGTERM).
        assert process.wait(600) in (0, -signal.SIGTERM)
    finally:
        process.kill()


def test_ready_turns_503_as_soon_as_draining_starts_while_in_flight_work_finishes(
        tiny_model: Callable[[str], Path]) -> None:
    """Deterministic: the model thread is held inside the in-flight request's batch until the test releases it, and
    the drain starts through the same method uvicorn's signal handler calls."""
    from scorekeeper_worker.api.server import build_server
    from scorekeeper_worker.base.config import WorkerConfig

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = build_server(WorkerConfig(model=tiny_model("qwen3-cls3"), port=port, log_level="warning",
                                       gc_freeze=False))  # in-process: see tests/support/serving.py
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until_ready(url)
        scheduler = server.config.app.state.service.scheduler
        entered, release = threading.Event(), threading.Event()

        def held(_batch: object) -> None:  # the model thread waits here, just before it packs the batch
            entered.set()
            assert release.wait(60)

        scheduler.executor.fault = held
        results: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/score", json={"query": "q", "items": ["a", "b"]}, timeout=60)))
        sender.start()
        assert entered.wait(60)

        server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler calls

        ready = httpx.get(url + "/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["type"] == "ServiceUnavailable"
        assert "draining" in ready.json()["message"]
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # alive: liveness must not restart it
        assert thread.is_alive() and not results  # still serving; the request is still in flight
        release.set()
        sender.join(60)
        assert results and results[0].status_code == 200, results
        assert len(results[0].json()["scores"]) == 2
        thread.join(60)  # nothing left in flight: the server stops by itself
        assert not thread.is_alive()
    finally:
        server.should_exit = True
        thread.join(30)



def test_requests_still_running_when_the_drain_time_runs_out_get_the_error_shape(
        tiny_model: Callable[[str], Path]) -> None:
    """Deterministic: the model thread is held inside the request's batch until the drain time (1 s) has run out and
    the server cancelled the request; the client then gets one JSON error with its request id, and the log one
    line, not a traceback."""
    from scorekeeper_worker.api.server import build_server
    from scorekeeper_worker.base.config import WorkerConfig

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = build_server(WorkerConfig(model=tiny_model("qwen3-cls3"), port=port, log_level="warning",
                                       gc_freeze=False, drain_timeout_seconds=1))
    records: list[logging.LogRecord] = []
    recorder = logging.Handler()
    recorder.emit = records.append  # type: ignore[method-assign]
    for name in ("", "uvicorn"):  # the server's log configuration is in place now; uvicorn's loggers do not propagate
        logging.getLogger(name).addHandler(recorder)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    release = threading.Event()
    try:
        wait_until_ready(url)
        scheduler = server.config.app.state.service.scheduler
        entered = threading.Event()

        def held(_batch: object) -> None:  # the model thread waits here, just before it packs the batch
            entered.set()
            release.wait(120)

        scheduler.executor.fault = held
        results: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: results.append(httpx.post(
            url + "/v1/score", json={"query": "q", "items": ["a"]}, headers={"x-request-id": "late-1"},
            timeout=120)))
        sender.start()
        assert entered.wait(60)
        server.handle_exit(signal.SIGTERM, None)
        sender.join(120)  # answered once the drain time ran out, while the batch is still held
        assert results, "no answer"
        response = results[0]
        assert response.status_code == 503, response.text
        assert response.headers["x-request-id"] == "late-1"
        error = response.json()
        assert error["type"] == "ServiceUnavailable" and "drain" in error["message"], error
        release.set()
        thread.join(60)
        assert not [r for r in records if r.exc_info or "Exception in ASGI" in r.getMessage()], records
    finally:
        for name in ("", "uvicorn"):
            logging.getLogger(name).removeHandler(recorder)
        release.set()
        server.should_exit = True
        thread.join(30)
