"""What a person reads when the real `scorekeeper-worker serve` starts, at its default log level: first where it
listens and that the model is loading (never uvicorn's "Uvicorn running on", which reads as success), then the load,
then `ready:`; every API request has its access line, with --metrics-port as without, and scrapes have none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
from serving import free_port, wait_until_ready


def test_the_log_says_listening_and_loading_first_then_ready_and_logs_every_request(
        tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOREKEEPER_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-cls3")),
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
         "--termination-log", str(tmp_path / "termination-log"), "--no-gc-freeze"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, timeout=300)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)  # nothing in flight: the drain ends at once
        stdout, stderr = process.communicate(timeout=120)
    lines = stderr.splitlines()
    assert "Uvicorn running" not in stderr and "Traceback" not in stderr, stderr
    assert (f"listening on http://127.0.0.1:{port} (/metrics on http://127.0.0.1:{metrics_port}); loading "
            f"{tiny_model('qwen3-cls3')}: /ready answers 503 until it is loaded and checked") in lines[0], lines[0]
    ready = [i for i, line in enumerate(lines) if " ready: qwen3-cls3" in line]
    assert len(ready) == 1 and not any(" ERROR " in line for line in lines), stderr
    assert '"GET /v1/models HTTP/1.1" 200' in stdout, stdout  # the API port's access line
    assert "/metrics" not in stdout, stdout  # the metrics port's scrapes are not logged
