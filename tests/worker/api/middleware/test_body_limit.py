"""--max-request-bytes counts bytes as they arrive: a body past the limit is refused with 413 without being buffered,
whether it is sized (Content-Length) or chunked. The server runs in its own process so that its peak memory can be
read from the kernel (VmHWM, reset just before the upload)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from serving import free_port, wait_until_ready

LIMIT = 4 * 1024 * 1024
UPLOAD = 50 * 1024 * 1024
CHUNK = 64 * 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture(scope="module")
def worker(tiny_model: Callable[[str], Path]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-cls3")),
         "--port", str(port), "--max-request-bytes", str(LIMIT), "--log-level", "warning"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_until_ready(url, process)
        yield process, url
    finally:
        process.kill()
        process.wait(30)


def _chunked_upload() -> Iterator[bytes]:
    yield b'{"query": "q", "items": ["'
    for _ in range(UPLOAD // CHUNK):
        yield b"x" * CHUNK
    yield b'"]}'


def test_chunked_body_past_the_limit_is_refused_without_buffering(
        worker: tuple[subprocess.Popen[bytes], str]) -> None:
    process, url = worker
    headers = {"content-type": "application/json"}
    # Warm every code path first (a scored request, a 413 by Content-Length), so the measurement sees the upload only.
    assert httpx.post(url + "/v1/score", json={"query": "q", "items": ["x"]}, timeout=60).status_code == 200
    assert httpx.post(url + "/v1/score", content=b"x" * (LIMIT + 1), headers=headers, timeout=60).status_code == 413
    Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
    baseline = _status_kib(process.pid, "VmRSS")

    response = httpx.post(url + "/v1/score", content=_chunked_upload(), headers=headers, timeout=300)

    assert response.status_code == 413, response.text
    error = response.json()
    assert error["type"] == "RequestTooLarge" and str(LIMIT) in error["message"]
    growth = (_status_kib(process.pid, "VmHWM") - baseline) * 1024
    print(f"peak RSS growth: {growth / 2**20:.1f} MiB (limit {LIMIT / 2**20:.0f} MiB)")
    assert growth < 2 * LIMIT, f"peak RSS grew by {growth / 2**20:.1f} MiB for a {LIMIT / 2**20:.0f} MiB limit"
    # The connection and the server stay usable.
    assert httpx.post(url + "/v1/score", json={"query": "q", "items": ["x"]}, timeout=60).status_code == 200


def test_sized_body_past_the_limit_is_refused_from_its_header(worker: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = worker
    response = httpx.post(url + "/v1/rerank", content=b"{" + b" " * LIMIT + b"}", timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["code"] == 413
