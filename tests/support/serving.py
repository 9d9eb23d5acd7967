"""A real uvicorn server on loopback, in a background thread, serving one model (used by the worker tests)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from scorekeeper_worker.engine.queue.jobs import ScoreJob
    from scorekeeper_worker.engine.queue.scheduler import Scheduler
    from scorekeeper_worker.engine.runner.packing import PackUnit


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningServer:
    """A real uvicorn server in a background thread, serving one model."""

    def __init__(self, **config: Any) -> None:
        import uvicorn
        from scorekeeper_worker.api.http_protocol import server_options
        from scorekeeper_worker.api.server import create_app
        from scorekeeper_worker.base.config import WorkerConfig

        self.port = free_port()
        # gc.freeze() would freeze the whole test process (every server and model of the test run, never collected
        # again): in-process servers leave it off unless a test asks; test_gc.py runs the default in a subprocess.
        config.setdefault("gc_freeze", False)
        self.config = WorkerConfig(host="127.0.0.1", port=self.port, **config)
        self.app = create_app(self.config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=5, **server_options(self.config)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"
        # Loading (a GGUF conversion), capture and the start-up self-check take seconds alone and minutes on a shared,
        # overloaded machine; failing loads end the wait at once (service.failed).
        deadline = time.monotonic() + 600
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

    @property
    def scheduler(self) -> Scheduler:
        scheduler = self.app.state.service.scheduler
        assert scheduler is not None, "the model is not loaded"
        return scheduler

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


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for a state (never for a duration): poll `check` until it holds; the timeout only bounds a broken run."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.01)


class BatchGate:
    """A scheduler observer for deterministic tests: records the composition of every batch (job, unit) and, when
    armed, holds the model thread just before the next batch runs until released, so that a test can queue work
    behind a running batch without relying on timing. Use as a context manager (it detaches itself on exit)."""

    def __init__(self, scheduler: Scheduler, hold: bool = False) -> None:
        self.scheduler = scheduler
        self.batches: list[list[tuple[ScoreJob, PackUnit]]] = []
        self._armed = hold
        self._held = threading.Event()
        self._released = threading.Event()

    def __call__(self, batch: list[tuple[ScoreJob, PackUnit]]) -> None:
        self.batches.append(batch)
        if self._armed:
            self._armed = False
            self._held.set()
            self._released.wait(120)

    def wait_held(self, timeout: float = 60) -> None:
        if not self._held.wait(timeout):
            raise TimeoutError("the model thread never reached the gate")

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> BatchGate:
        assert self.scheduler.observer is None, "another gate is attached"
        self.scheduler.observer = self
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
        self.scheduler.observer = None
