"""What hostile bodies and connections cost the worker's event loop (issue 26): /health's worst latency while four
8 MB bodies are parsed, and how long slow or silent connections stay open.

A worker (real all-MiniLM-L6-v2) runs from the worker source given by --worker-path (this checkout by default; pass
an older checkout to compare), so the numbers of two versions come from the same script on the same machine:
- four 8 MB bodies sent at once, their unknown field either 80,000 arrays nested 50 deep (refused from a scan of the
  bytes) or four million integers (a valid shape, parsed and validated in a worker thread), while a client asks for
  /health every 20 ms: the slowest /health answer;
- a connection that sends nothing, and one that sends half a request head: seconds until the worker closes it
  (60 s: still open when the benchmark gave up).

    python bench/http/bench_hostile_clients.py [--worker-path /path/to/other/checkout/worker]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import Worker, log, machine_note, markdown_table

GIVE_UP = 60.0
BODY_BYTES = 8_000_000


def _bodies() -> dict[str, bytes]:
    head = b'{"query": "capital of France?", "items": ["Paris"], "ignored": ['
    deep = b"[" * 50 + b"]" * 50
    return {"nested arrays (refused)": head + b",".join([deep] * (BODY_BYTES // 101)) + b"]}",
            "4M integers (parsed)": head + b",".join([b"1"] * (BODY_BYTES // 2)) + b"]}"}


def _worst_health(url: str, body: bytes) -> tuple[float, list[int]]:
    statuses: list[int] = []

    def send() -> None:
        response = httpx.post(url + "/v1/score", content=body, timeout=300,
                              headers={"content-type": "application/json"})
        statuses.append(response.status_code)

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    worst = 0.0
    with httpx.Client(timeout=GIVE_UP) as client:
        while any(sender.is_alive() for sender in senders):
            started = time.perf_counter()
            client.get(url + "/health")
            worst = max(worst, time.perf_counter() - started)
            time.sleep(0.02)
    for sender in senders:
        sender.join()
    return worst, statuses


def _seconds_open(port: int, send: bytes) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=GIVE_UP) as sock:
        started = time.perf_counter()
        sock.sendall(send)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return GIVE_UP
        except ConnectionResetError:
            pass
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker-path", type=Path, default=Path(__file__).resolve().parents[2] / "worker")
    parser.add_argument("--model", default=None, help="model directory (default: the packaged all-MiniLM-L6-v2)")
    args = parser.parse_args()
    if args.model is None:
        from scorekeeper_worker.library import minilm_path

        args.model = str(minilm_path())
    worker = Worker(args.model, "float32", env={"PYTHONPATH": str(args.worker_path.resolve())})
    rows = []
    try:
        for name, body in _bodies().items():
            worst, statuses = _worst_health(worker.url, body)
            log(f"{name}: worst /health {worst:.3f} s, answers {statuses}")
            rows.append([f"4 × 8 MB, {name}", f"slowest /health answer {worst:.2f} s",
                         f"answers {sorted(set(statuses))}"])
        silent = _seconds_open(worker.port, b"")
        half_head = _seconds_open(worker.port, b"POST /v1/score HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        rows.append(["a silent connection", f"closed after {silent:.1f} s", "60 s: still open" if silent >= GIVE_UP
                     else ""])
        rows.append(["half a request head", f"closed after {half_head:.1f} s",
                     "60 s: still open" if half_head >= GIVE_UP else ""])
    finally:
        worker.close()
    print(machine_note())
    print(f"worker source: {args.worker_path} (load: {os.getloadavg()[0]:.1f})")
    print(markdown_table(["case", "result", "note"], rows))


if __name__ == "__main__":
    main()
