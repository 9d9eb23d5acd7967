"""A real uvicorn server on loopback, in a background thread, serving one model (used by the worker tests)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningServer:
    """A real uvicorn server in a background thread, serving one model."""

    def __init__(self, **config: Any) -> None:
        import uvicorn
        from scorekeeper_worker.config import WorkerConfig
        from scorekeeper_worker.server import create_app

        self.port = free_port()
        self.config = WorkerConfig(host="127.0.0.1", port=self.port, **config)
        self.app = create_app(self.config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"
        # Loading (a GGUF conversion), capture and the start-up self-check take seconds alone and minutes on a shared,
        # overloaded machine; failing loads end the wait at once (service.failed).
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and self.thread.is_alive():
            if self.app.state.service.failed:
                raise RuntimeError(f"model failed to load ({config}): {self.app.state.service.failure}")
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server for {config} not ready")

    def score(self, **body: Any) -> httpx.Response:
        return httpx.post(self.url + "/v1/score", json=body, timeout=120)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def wait_until_ready(url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 120) -> None:
    """Poll GET /ready until it answers 200 (fails at once if the worker's process exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode} before becoming ready")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s")
