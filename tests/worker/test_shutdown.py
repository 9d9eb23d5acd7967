"""SIGTERM drains: requests in flight when the worker is asked to stop still get their answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from serving import free_port, wait_until


def test_sigterm_drains_in_flight_requests(tiny_model: Callable[[str], Path]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-reward")),
         "--host", "127.0.0.1", "--port", str(port), "--max-batch-tokens", "2048", "--log-level", "warning",
         # The drain must outlast the request however busy the machine is (the default 30 s does not under load).
         "--drain-timeout-seconds", "600"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        def ready() -> bool:
            try:
                return httpx.get(url + "/ready", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until("the worker to be ready", ready, timeout=600)  # a bound for a broken start, not a wait
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
