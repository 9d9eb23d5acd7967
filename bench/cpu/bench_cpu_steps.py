"""What each CPU float32 step of the worker is worth (issue 23; docs/benchmarks.md "float32: what was tried"), on the
bench_cpu.py workloads (1 query × 200 documents, MiniLM cross-encoder for rerank, all-MiniLM-L6-v2 for embed).

- Over HTTP, one worker per arm, all started together and timed round-robin (so a noisy neighbour hits them alike):
  the defaults, `--no-onednn-linear` (torch's nn.Linear) and `--max-batch-tokens 2048` (smaller forwards).
- In process (engine only, no HTTP), interleaved in one process, with the worker's Intel OpenMP and TCMalloc
  preloaded (the script re-executes itself with them): linear weights prepacked for oneDNN or plain, whole rows
  attended in place or gathered into blocks (`tiled.IN_PLACE_MIN_KEYS`), the forward with and without the
  pooled-rows selection of the last layer (rerank: CLS pooling), with batched attention products for short rows and
  with the flash kernel for every row (`tiled.BATCHED_MAX_KEYS` 0). Where glibc's allocator runs (no TCMalloc
  found), first the minor page faults per request before and after `keep_freed_memory()` (process-wide: it cannot
  be switched back, so the two halves are not interleaved; the fault counts are the measurement, the times are
  context; the arms then run under it, as the worker does). Each request
  runs through `score_now` (prepared as the server prepares it, in batches of the default --max-batch-tokens); its
  time is the executor's (inputs, forward, scoring of every batch), its faults are the whole request's.

    .venv/bin/python bench/cpu/bench_cpu_steps.py --task rerank --mix short
    .venv/bin/python bench/cpu/bench_cpu_steps.py --packing   # packing one 8,192-token graph bucket, nothing else

`--packing`: packing SGLang's scoring-benchmark batch (4 requests of a 120-token query and 10 items of 180 tokens,
with delimiters: 7,724 tokens) into an 8,192-token graph bucket and its staging buffer, the vectorised packer
(engine/runner/token_packing.py) against the per-token packer it replaced (kept as the tests' reference),
interleaved.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.cpu.bench_cpu import cross_encoder_dir
from bench.cpu.bench_minilm import make_workload
from bench.harness import http_servers
from bench.harness.common import intel_openmp_env, log, markdown_table, median

BATCH_TOKENS = 8192  # the worker's default --max-batch-tokens
ARMS = {"defaults": [], "--no-onednn-linear": ["--no-onednn-linear"],
        "--max-batch-tokens 2048": ["--max-batch-tokens", "2048"]}


def http_arms(task: str, model: Path, workload: dict[str, Any], reps: int, threads: int) -> list[list[str]]:
    servers = {}
    try:
        for name, flags in ARMS.items():
            servers[name] = http_servers.scorekeeper(name, model, threads, set(range(threads)), flags)
        call = {name: (s.rerank if task == "rerank" else s.embed) for name, s in servers.items()}
        times: dict[str, list[float]] = {name: [] for name in servers}
        for name in servers:  # warm-up
            call[name](workload["query"], workload["items"])
        for rep in range(reps):
            for name in list(servers) if rep % 2 == 0 else list(reversed(servers)):
                times[name].append(call[name](workload["query"], workload["items"])[0])
    finally:
        for server in servers.values():
            server.close()
    base = median(times["defaults"])
    return [[name, f"{median(t):.3f}", f"{median(t) / base:.2f}×"] for name, t in times.items()]


def in_process(model: Path, workload: dict[str, Any], reps: int) -> list[list[str]]:
    from scorekeeper_worker.library import (
        BatchStats,
        DType,
        Executor,
        FusedLinear,
        Limits,
        Pooling,
        ScoreAsk,
        fuse_linears,
        keep_freed_memory,
        load_model,
        score_now,
        scored,
        tiled,
    )

    scoring = load_model(model, DType.FLOAT32, "cpu", "bench")
    fuse_linears(scoring.trunk)
    ask = ScoreAsk(query=workload["query"], items=workload["items"])
    executor = Executor(scoring)
    limits = Limits(max_batch_tokens=BATCH_TOKENS)

    def once() -> tuple[float, int]:
        seconds = 0.0

        def on_batch(stats: BatchStats) -> None:
            nonlocal seconds
            seconds += (stats.pack_seconds + stats.copy_in_seconds + stats.device_seconds + stats.heads_seconds
                        + stats.copy_out_seconds)

        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        scored(score_now(executor, [ask], limits, BATCH_TOKENS, on_batch))  # the server's default --max-batch-tokens
        return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    def interleaved(switch: Callable[[bool], None], on: str, off: str) -> list[list[str]]:
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(2 * reps + 2):
            switch(rep % 2 == 0)
            seconds, _ = once()
            if rep >= 2:  # one warm-up each
                times[rep % 2 == 0].append(seconds)
        switch(True)
        ratio = median(times[False]) / median(times[True])
        return [[on, f"{median(times[True]):.3f}", "—", "1.00×"],
                [off, f"{median(times[False]):.3f}", "—", f"{ratio:.2f}×"]]

    def select_rows(on: bool) -> None:
        scoring.selects_rows = on

    def batched_attention(on: bool) -> None:
        tiled.BATCHED_MAX_KEYS = batched_keys if on else 0

    fused = [module for module in scoring.trunk.modules() if isinstance(module, FusedLinear)]
    packed, plain = [m.packed for m in fused], [m.weight for m in fused]

    def prepacked(on: bool) -> None:
        for module, weight in zip(fused, packed if on else plain, strict=True):
            module.packed = weight  # oneDNN's fused linear takes a plain weight too, reordering it at every call

    in_place_keys = tiled.IN_PLACE_MIN_KEYS

    def rows_in_place(on: bool) -> None:
        tiled.IN_PLACE_MIN_KEYS = in_place_keys if on else 1 << 62

    once()
    rows: list[list[str]] = []
    if "tcmalloc" not in os.environ.get("LD_PRELOAD", ""):  # glibc's allocator: its thresholds are a step
        glibc = [once() for _ in range(reps)]
        keep_freed_memory()  # the worker's setting from here on: the arms below run as the worker runs them
        once()
        kept = [once() for _ in range(reps)]
        rows += [["allocator thresholds (after keep_freed_memory)", f"{median([s for s, _ in kept]):.3f}",
                  f"{median([f for _, f in kept]):.0f}", "—"],
                 ["glibc's defaults (before)", f"{median([s for s, _ in glibc]):.3f}",
                  f"{median([f for _, f in glibc]):.0f}", "—"]]
    batched_keys = tiled.BATCHED_MAX_KEYS
    rows += interleaved(prepacked, "linear weights prepacked at load", "plain linear weights")
    rows += interleaved(rows_in_place, f"whole rows of ≥ {in_place_keys} keys attended in place",
                        "every row gathered into blocks")
    tiled.IN_PLACE_MIN_KEYS = 1 << 62  # the next arm compares the two kernels of gathered blocks
    rows += interleaved(batched_attention, f"batched attention for rows of ≤ {batched_keys} keys",
                        "the flash kernel for every row")
    tiled.IN_PLACE_MIN_KEYS = in_place_keys
    if scoring.selects_rows and scoring.pooling != Pooling.MEAN:  # mean pooling reads every row
        rows += interleaved(select_rows, "pooled rows only in the last layer's tail",
                            "every row through the last layer")
    return rows


def packing_rows(reps: int) -> list[list[str]]:
    """Milliseconds to pack SGLang's scoring-benchmark batch into an 8,192-token bucket: vectorised and per token."""
    import random
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "worker" / "engine" / "runner" / "packing"))
    import torch
    from python_packer import build_token_inputs
    from scorekeeper_worker.engine.runner import token_packing
    from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool
    from scorekeeper_worker.model.kernels.attention import LayoutKind

    rng = random.Random(0)
    units = []
    for _ in range(4):
        items = [[rng.randrange(100, 49000) for _ in range(180)] + [3] for _ in range(10)]
        unit = PackUnit([rng.randrange(100, 49000) for _ in range(120)] + [3], items=items, visible_prefix=120)
        end = 121
        for i, item in enumerate(items):
            end += len(item)
            unit.pools.append(Pool(range(end - 2, end - 1), i))
        units.append(unit)
    shape = GraphShape(8192, 256, pooled_tokens=256)
    staging = token_packing.Staging.for_shape(shape)
    buffer = staging.buffer(torch.device("cpu"))

    def vectorised() -> None:
        staging.write(token_packing.pack(units, shape), buffer)

    def per_token() -> None:
        build_token_inputs(units, torch.device("cpu"), LayoutKind.FLEX, shape)

    names = ("vectorised, into the staging buffer", "per token (the packer it replaced)")
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps + 1):
        for name, pack in zip(times, (vectorised, per_token), strict=True):
            started = time.perf_counter()
            pack()
            if rep:  # the first round warms up
                times[name].append(time.perf_counter() - started)
    base = median(next(iter(times.values())))
    return [[name, f"{1000 * median(t):.3f}", f"{median(t) / base:.1f}×"] for name, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["rerank", "embed"], default="rerank")
    parser.add_argument("--mix", choices=["short", "long"], default="short")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2, help="and CPUs 0..threads-1 for the servers")
    parser.add_argument("--no-http", action="store_true", help="the in-process arms only")
    parser.add_argument("--packing", action="store_true", help="only: packing one 8,192-token graph bucket")
    args = parser.parse_args()
    if args.packing:
        print(markdown_table(["packing SGLang's benchmark batch (7,724 tokens) into an 8,192-token bucket",
                              "ms (median)", "vs vectorised"], packing_rows(max(args.reps, 30))))
        return
    runtime = intel_openmp_env()  # the worker's own OpenMP runtime and allocator, as it runs them
    if runtime and runtime["LD_PRELOAD"] not in os.environ.get("LD_PRELOAD", ""):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **runtime})
    from scorekeeper_worker.library import minilm_path

    model = cross_encoder_dir() if args.task == "rerank" else minilm_path()
    workload = make_workload(minilm_path(), args.mix, args.items, 0)
    if not args.no_http:
        log("HTTP arms")
        print(markdown_table(["worker (HTTP)", "s/request (median)", "vs defaults"],
                             http_arms(args.task, model, workload, args.reps, args.threads)))
    log("in-process arms")
    import torch

    torch.set_num_threads(args.threads)
    header = ["engine, in process", "s/request (median)", "minor faults/request", "time vs the arm above it"]
    print(markdown_table(header, in_process(model, workload, args.reps)))


if __name__ == "__main__":
    main()
