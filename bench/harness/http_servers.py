"""Servers under test over HTTP, each in its own process pinned to the same CPUs: the Scorekeeper worker (float32 and
int8), vLLM's CPU server and Infinity, started on loopback ports; `rerank` and `embed` post one request and return
(seconds, scores). vLLM and Infinity run from their own git-ignored venvs (docs/benchmarks.md installs them)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.harness.common import REPO, _stop, child_env, free_port, log, post_json, wait_ready

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# vLLM's CPU performance tips: TCMalloc and Intel OpenMP preloaded (Debian's libtcmalloc-minimal4; intel-openmp's
# wheel puts libiomp5.so in the venv's lib/).
VLLM_PRELOAD = (Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"), REPO / ".venv-vllm" / "lib" / "libiomp5.so")
INFINITY = REPO / ".venv-bench" / "bin" / "infinity_emb"


class HttpServer:
    """A server process on a loopback port, pinned to `cpus`, polled until `ready_path` answers 200."""

    def __init__(self, name: str, cmd: list[str], model: Path, port: int, cpus: set[int], env: dict[str, str],
                 ready_path: str, threads: str, ready_timeout: float = 900.0) -> None:
        self.name, self.port, self.threads = name, port, threads
        # What the tables print for this system: its environment and its command line after the model path.
        self.config = " ".join([*(f"{k}={v}" for k, v in env.items()), *cmd[cmd.index(str(model)) + 1:]])
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        log(f"starting {name}: {' '.join(cmd)}")
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=child_env(env),
                                     start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        self.client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(3600.0, connect=10.0))
        wait_ready(self, name, ready_path, ready_timeout)

    def tail(self, chars: int = 3000) -> str:
        return Path(self.log_file.name).read_text(errors="replace")[-chars:]

    def post(self, path: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return post_json(self.client, path, body, self.name)

    def rerank(self, query: str, documents: list[str]) -> tuple[float, list[float]]:
        """Relevance per document, in document order (every server here answers Cohere/Jina-shaped results)."""
        path = "/rerank" if self.name == "infinity" else "/v1/rerank"
        seconds, body = self.post(path, {"model": "m", "query": query, "documents": documents,
                                         "return_documents": False})
        scores = [0.0] * len(documents)
        for result in body["results"]:
            scores[result["index"]] = float(result["relevance_score"])
        return seconds, scores

    def embed(self, query: str, documents: list[str]) -> tuple[float, list[float]]:
        """The query and the documents embedded in one request; cosines of the documents with the query."""
        path = "/embeddings" if self.name == "infinity" else "/v1/embeddings"
        seconds, body = self.post(path, {"model": "m", "input": [query, *documents]})
        vectors = [row["embedding"] for row in sorted(body["data"], key=lambda row: row["index"])]
        return seconds, cosines(vectors)

    def close(self) -> None:
        self.client.close()
        _stop(self.proc)
        self.log_file.close()
        os.unlink(self.log_file.name)


def cosines(vectors: list[list[float]]) -> list[float]:
    def norm(v: list[float]) -> float:
        return math.sqrt(sum(x * x for x in v))

    query = vectors[0]
    return [sum(a * b for a, b in zip(query, v, strict=True)) / (norm(query) * norm(v)) for v in vectors[1:]]


def scorekeeper(name: str, model: Path, threads: int, cpus: set[int], extra: list[str],
                env: dict[str, str] | None = None) -> HttpServer:
    port = free_port()
    cmd = [sys.executable, "-c", "from scorekeeper_worker.cli import main; main()", "serve", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads), "--log-level", "warning",
           "--termination-log", os.devnull, *extra]
    return HttpServer(name, cmd, model, port, cpus, env or {}, "/ready", f"{threads} (--threads)")


def vllm(model: Path, cpus: set[int], bind: str) -> HttpServer:
    """vLLM's OpenAI server on CPU. `bind` is VLLM_CPU_OMP_THREADS_BIND: "auto" (vLLM's default: one OpenMP thread
    per core, one core kept for the frontend) or a core list ("0-1": compute threads on every core)."""
    port = free_port()
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
           "127.0.0.1", "--port", str(port), "--dtype", "float32", "--served-model-name", "m"]
    env = {"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
    preload = [str(path) for path in VLLM_PRELOAD if path.exists()]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    compute = len(cpus) - 1 if bind == "auto" and len(cpus) > 1 else len(cpus)
    threads = f"{compute} compute + frontend core (bind {bind})" if bind == "auto" else f"{compute} (bind {bind})"
    return HttpServer("vllm" if bind == "auto" else "vllm-bind-all", cmd, model, port, cpus, env, "/health", threads)


def infinity(model: Path, threads: int, cpus: set[int]) -> HttpServer:
    port = free_port()
    cmd = [str(INFINITY), "v2", "--model-id", str(model), "--served-model-name", "m", "--port", str(port),
           "--host", "127.0.0.1", "--engine", "torch", "--device", "cpu", "--batch-size", "32", "--no-model-warmup"]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return HttpServer("infinity", cmd, model, port, cpus, env, "/health", f"{threads} (OMP_NUM_THREADS)")


def available(system: str) -> str | None:
    """Why a system cannot run here, or None."""
    if system.startswith("vllm") and not VLLM_PYTHON.exists():
        return f"{VLLM_PYTHON} not found (docs/benchmarks.md installs vllm-cpu)"
    if system == "infinity" and not INFINITY.exists():
        return f"{INFINITY} not found (docs/benchmarks.md installs infinity-emb)"
    return None
