"""Shared plumbing for the benchmarks: the worker as a subprocess, peers as line-protocol subprocesses, stats, tables.

Every system under test runs in its own process, in a session of its own, and is timed only once the one before it
is idle again (idle.py); repetitions are taken round-robin across systems so that the noise of a shared machine hits
every system alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import httpx

REPO = Path(__file__).resolve().parents[2]
PEERS_SCRIPT = REPO / "bench" / "cpu" / "peers.py"
BENCH_VENV_PYTHON = REPO / ".venv-bench" / "bin" / "python"

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}


# An AVX-512 CPU capped to AVX2 for torch's own kernels, oneDNN (torch's and OpenVINO's), FBGEMM and MKL (torch's
# nn.Linear on CPU): how the benchmarks emulate a CPU without AVX-512 or VNNI (set before a process loads any of them).
AVX2_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def intel_openmp_env() -> dict[str, str]:
    """What `--openmp-runtime auto` adds to a worker's environment where intel-openmp is installed: libiomp5 (and
    TCMalloc, where found) preloaded and Intel's wait settings; empty without libiomp5."""
    from scorekeeper_worker.base.config import OpenMPRuntime
    from scorekeeper_worker.serving.startup import openmp_env

    env = openmp_env.reexec_env(OpenMPRuntime.INTEL, {}, openmp_env.find_libiomp(), openmp_env.find_tcmalloc())
    return {k: v for k, v in (env or {}).items() if k != openmp_env.REEXEC_MARKER}


def background_load(condition: str, cpus: int) -> list[str] | None:
    """The command of a benchmark condition's background load, to start in a session of its own:
    - "quiet": none;
    - "stress": `stress --cpu N` at an equal share of the CPUs (like another pod with the same CPU request);
    - "neighbours": the same at the lowest priority, using only what CPU is spare (like BestEffort pods).
    With the kernel's autogroups (`/proc/sys/kernel/sched_autogroup_enabled`), `nice` counts only within a process
    session: a `nice -n 19` process in another process session still takes an equal share. So "neighbours" sets its
    process session's autogroup to nice 19 as well."""
    if condition == "quiet":
        return None
    stress = f"stress --cpu {cpus}"
    if condition == "stress":
        return stress.split()
    return ["sh", "-c", f"echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 {stress}"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


THREADS: int | None = None  # --threads: the same OMP/MKL thread count for every process under test


def exit_on_sigterm() -> None:
    """SIGTERM (a `timeout` ending a step of bench/gpu/run.sh) unwinds like an exception, so `finally` blocks stop the
    servers this process started: they run in sessions of their own and would outlive it, holding the device."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def set_threads(threads: int | None) -> None:
    global THREADS
    THREADS = threads


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    if THREADS:
        env.update({"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)})
    env.update(extra or {})
    return env


def _stop(proc: subprocess.Popen[Any], grace: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class ServerProcess(Protocol):
    """A server process under test and its HTTP client (`Worker`, `http_servers.HttpServer`)."""

    proc: subprocess.Popen[Any]
    client: httpx.Client

    def tail(self, chars: int = ...) -> str: ...

    def close(self) -> None: ...


def wait_ready(server: ServerProcess, name: str, path: str, timeout: float, interval: float = 1.0) -> None:
    """Poll `path` until it answers 200; a server that exits or stays unready is closed and raised with its log."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {server.proc.returncode}:\n{server.tail()}")
        try:
            if server.client.get(path, timeout=5.0).status_code == 200:
                log(f"{name} ready after {time.perf_counter() - started:.1f} s")
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    server.close()
    raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{server.tail()}")


def post_json(client: httpx.Client, path: str, body: dict[str, Any], name: str = "") -> tuple[float, dict[str, Any]]:
    """POST `body` as JSON: (seconds to the whole response, its JSON); anything but a 200 raises."""
    payload = json.dumps(body)
    started = time.perf_counter()
    response = client.post(path, content=payload, headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        where = f"{name} {path}" if name else path
        raise RuntimeError(f"{where} → {response.status_code}: {response.text[:500]}")
    return elapsed, response.json()


def parse_worker_args(parser: argparse.ArgumentParser, worker_arg_help: str = "",
                      threads_help: str = "OMP_NUM_THREADS for every process under test (default: torch's own "
                      "choice, the core count)", json_help: str = "write the raw records here") -> argparse.Namespace:
    """The flags of the benchmarks that start workers (--worker-arg, --threads, --json), parsed, with --threads set
    for every child process."""
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="extra flag for `scorekeeper-worker serve` (repeatable)" + worker_arg_help)
    parser.add_argument("--threads", type=int, help=threads_help)
    parser.add_argument("--json", type=Path, help=json_help)
    args = parser.parse_args()
    set_threads(args.threads)
    return args


class Worker:
    """`scorekeeper-worker serve` on a loopback port; `score(body)` → (seconds, response json)."""

    def __init__(self, model: Path | str, dtype: str, extra_args: list[str] | None = None,
                 ready_timeout: float = 600.0, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = tempfile.NamedTemporaryFile(prefix="scorekeeper-worker-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-c", "from scorekeeper_worker.cli import main; main()", "serve",
               "--model", str(model), "--dtype", dtype, "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning", *(extra_args or [])]
        self.cmd = cmd
        log(f"starting worker: {' '.join(cmd[3:])}")
        # A process session of its own: a stray signal to the benchmark's process group does not reach the server first.
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=child_env(env),
                                     start_new_session=True)
        self.client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(3600.0, connect=10.0))
        wait_ready(self, "worker", "/ready", ready_timeout, interval=0.5)

    def tail(self, chars: int = 4000) -> str:
        return Path(self.log_file.name).read_text(errors="replace")[-chars:]

    def score(self, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return post_json(self.client, "/v1/score", body)

    def close(self) -> None:
        self.client.close()
        _stop(self.proc)
        self.log_file.close()
        os.unlink(self.log_file.name)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Peer:
    """A peer system in its own process (`bench/cpu/peers.py`), driven one repetition per `run()` call."""

    def __init__(self, system: str, model: Path | str, dtype: str, workload: dict[str, Any],
                 python: Path | str | None = None, options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.system = system
        self.workload_file = tempfile.NamedTemporaryFile("w", prefix="bench-workload-", suffix=".json", delete=False)  # noqa: SIM115
        json.dump(workload, self.workload_file)
        self.workload_file.close()
        self.stderr = tempfile.NamedTemporaryFile(prefix=f"bench-{system}-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [str(python or sys.executable), str(PEERS_SCRIPT), "--system", system, "--model", str(model),
               "--dtype", dtype, "--workload", self.workload_file.name, "--options", json.dumps(options or {})]
        log(f"starting peer {system} ({dtype}) with {cmd[0]}")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=child_env(env), start_new_session=True)
        self.info = self._read()  # the peer reports {"ready": ..., versions} once loaded

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"peer {self.system} exited with {self.proc.returncode}:\n{self.tail()}")
        message = json.loads(line)
        if "error" in message:
            raise RuntimeError(f"peer {self.system}: {message['error']}")
        return message

    def tail(self, chars: int = 4000) -> str:
        return Path(self.stderr.name).read_text(errors="replace")[-chars:]

    def run(self, **params: Any) -> tuple[float, dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "run", **params}) + "\n")
        self.proc.stdin.flush()
        result = self._read()
        return float(result["seconds"]), result

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        _stop(self.proc)
        self.stderr.close()
        for name in (self.stderr.name, self.workload_file.name):
            if os.path.exists(name):
                os.unlink(name)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"
    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in rows)])


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def machine_note() -> str:
    import platform

    import torch

    threads = THREADS or torch.get_num_threads()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
            f"{threads} threads per process{' (--threads)' if THREADS else ' (torch default)'}, load average {load}")
