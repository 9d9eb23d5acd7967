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
from serving import free_port


def test_sigterm_drains_in_flight_requests(tiny_model: Callable[[str], Path]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-reward")),
         "--host", "127.0.0.1", "--port", str(port), "--max-batch-tokens", "2048", "--log-level", "warning"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        items = [[10 + (i % 200)] * 60 for i in range(600)]  # ~36k tokens: a few seconds on CPU
        results: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: results.append(
            httpx.post(url + "/v1/score", json={"query": [5, 6], "items": items}, timeout=120)))
        sender.start()
        while sender.is_alive() and "scorekeeper_queue_tokens 0.0" in httpx.get(url + "/metrics", timeout=5).text:
            time.sleep(0.02)  # wait for a state: the request is admitted (queued tokens > 0)
        process.send_signal(signal.SIGTERM)
        sender.join(120)
        assert results and results[0].status_code == 200, results
        assert len(results[0].json()["scores"]) == len(items)
        # A clean exit: uvicorn finishes its shutdown, then re-raises the signal it handled (exit by SIGTERM).
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        process.kill()
