"""What the worker's resident memory grows by over requests of mixed shapes, per instruction set (issue 37: +399 and
+468 MB over 3,000 requests on an AVX2 Zen 3), and what of it is the allocator keeping freed memory.

Each configuration is a child process that loads the model as the worker does (all-MiniLM-L6-v2 embeddings by default,
float32, fused oneDNN linears, its allocator thresholds and cache bounds unless the configuration says otherwise), runs
a warm-up, then the same seeded mixed-shape requests (1–64 items of 1–12 words: nearly every batch a new token count)
through the engine (tokenize → plan → batches → forward, as `score_now` does), and reports RSS after the warm-up,
at the end, and after `malloc_trim(0)`, with glibc's view (`mallinfo2`: heap held, heap in use). "avx2" caps oneDNN,
ATen and FBGEMM to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2` ...): an AVX-512 machine computing like an AVX2 CPU.

    PYTHONPATH=worker python bench/http/bench_memory.py --requests 3000 --isa native,avx2
    PYTHONPATH=worker python bench/http/bench_memory.py --requests 600 --configs worker,unbounded-cache,no-mallopt
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from scorekeeper_worker.cli import CACHE_BOUNDS

from bench.harness.common import intel_openmp_env, log, machine_note, markdown_table

ISA_ENV = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
                                  "ATEN_CPU_CAPABILITY": "avx2"}}
# What `--openmp-runtime auto` preloads where intel-openmp is installed: libiomp5 and TCMalloc (whose RSS behaviour is
# its own: glibc's heap columns then read only what glibc still serves), with Intel's wait settings.
INTEL = intel_openmp_env()
# configuration → (environment, use the worker's mallopt thresholds)
CONFIGS: dict[str, tuple[dict[str, str], bool]] = {
    "worker": ({}, True),  # what `scorekeeper-worker serve --openmp-runtime gnu` sets (cache bounds: cli.CACHE_BOUNDS)
    "worker-intel": (INTEL, True),  # the default where intel-openmp is installed
    "ideep-1024": ({"LRU_CACHE_CAPACITY": "1024"}, True),  # ideep's own default (the worker before issue 37)
    "unbounded-cache": ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}, True),
    "no-primitive-cache": ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}, True),
    "no-mallopt": ({}, False),  # glibc's adaptive thresholds
}
WORDS = ("capital", "city", "river", "mountain", "history", "science", "music", "theatre", "language", "garden",
         "ocean", "forest", "winter", "summer", "bridge", "market", "station", "library", "museum", "harbour")


def mixed_requests(count: int, seed: int, max_items: int = 64, max_words: int = 12) -> list[tuple[str, list[str]]]:
    """The issue's mix: 1–`max_items` items of 1–`max_words` words, a query of the same."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))

    return [(text(), [text() for _ in range(rng.randint(1, max_items))]) for _ in range(count)]


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_mib() -> dict[str, float]:
    """glibc's heap: held from the kernel (all arenas and mmapped blocks) and in use; {} without mallinfo2."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"held": (info.arena + info.hblkhd) / 2**20, "used": (info.uordblks + info.hblkhd) / 2**20}


def run_requests(requests: list[tuple[str, list[str]]], model: Any, max_batch_tokens: int) -> None:
    from scorekeeper_worker.library import Executor, Limits, ScoreAsk, score_now, scored

    executor = Executor(model)
    for query, items in requests:
        scored(score_now(executor, [ScoreAsk(query=query, items=items)], Limits(max_batch_tokens=max_batch_tokens),
                         max_batch_tokens))


def child(args: argparse.Namespace, mallopt: bool) -> dict[str, Any]:
    import torch
    from scorekeeper_worker.library import DType, fuse_linears, keep_freed_memory, load_model, minilm_path

    torch.set_num_threads(args.threads)
    if mallopt:
        keep_freed_memory()
    model = load_model(Path(args.model) if args.model else minilm_path(), DType.FLOAT32, "cpu", "memory")
    fuse_linears(model.trunk)
    started = time.perf_counter()
    with torch.inference_mode():
        run_requests(mixed_requests(args.warmup, args.seed + 1), model, args.max_batch_tokens)
        before, heap_before = rss_mib(), heap_mib()
        run_requests(mixed_requests(args.requests, args.seed), model, args.max_batch_tokens)
    after, heap_after = rss_mib(), heap_mib()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"before": before, "after": after, "trimmed": rss_mib(), "heap_before": heap_before,
            "heap_after": heap_after, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--isa", default="native,avx2")
    parser.add_argument("--configs", default="worker")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args, CONFIGS[args.child][1])), flush=True)
        return
    rows = []
    for isa in args.isa.split(","):
        for config in args.configs.split(","):
            wait = {} if "KMP_BLOCKTIME" in CONFIGS[config][0] else {"OMP_WAIT_POLICY": "PASSIVE"}
            env = {**os.environ, **wait, **{k: str(v) for k, v in CACHE_BOUNDS.items()}, **ISA_ENV[isa],
                   **CONFIGS[config][0]}
            log(f"{isa} {config}: {args.requests} requests after {args.warmup}")
            out = subprocess.run([sys.executable, __file__, "--child", config, *sys.argv[1:]], env=env, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            r = json.loads(out.splitlines()[-1])
            held = r["heap_after"].get("held", 0) - r["heap_before"].get("held", 0)
            used = r["heap_after"].get("used", 0) - r["heap_before"].get("used", 0)
            rows.append([isa, config, f"{r['before']:.0f}", f"{r['after'] - r['before']:+.0f}",
                         f"{r['trimmed'] - r['before']:+.0f}", f"{held:+.0f}", f"{used:+.0f}", f"{r['seconds']:.0f}"])
    print(machine_note())
    print(markdown_table(["instructions", "configuration", "RSS after warm-up (MiB)", "RSS growth (MiB)",
                          "growth after malloc_trim (MiB)", "glibc heap held (MiB)", "glibc heap in use (MiB)",
                          "seconds"], rows))


if __name__ == "__main__":
    main()
