"""The worker's CPU engine when other processes share its cores (issue 37): OpenMP wait policy and spin time, one
thread against two, pinning, and two single-threaded requests at once (inter-request) against one two-threaded one;
libgomp arms, and `intel-N` arms: Intel's OpenMP and TCMalloc preloaded as the worker ships them, N threads.

Each arm is a child process that loads the model as the worker does (all-MiniLM-L6-v2 embeddings, float32, fused
oneDNN linears, its allocator thresholds and primitive-cache bound) with the arm's OpenMP environment, then scores
one request (1 query × `--items` documents of the `--mix`) each time it is told to. Arms are measured interleaved:
every round runs each arm once, in a shuffled order, and an arm not being measured is stopped (SIGSTOP), so a
spinning arm cannot burn CPU while another is timed. Conditions:

- quiet: nothing else started (the machine may still be shared: the load average is printed);
- neighbours: `nice -n 19 stress --cpu N`, low-priority processes that use whatever CPU is spare, like other pods'
  batch work on a node without dedicated CPUs;
- stress: `stress --cpu N` at normal priority (what the CPU benchmarks used so far).

    PYTHONPATH=worker python bench/cpu/bench_shared_cores.py --rounds 7
    PYTHONPATH=worker python bench/cpu/bench_shared_cores.py --arms passive-2,passive-1 --conditions quiet,neighbours
    PYTHONPATH=worker python bench/cpu/bench_shared_cores.py --arms intel-2,intel-1,intel-4 --mix long
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from scorekeeper_worker.cli import CACHE_BOUNDS

from bench.harness.common import background_load, intel_openmp_env, log, machine_note, markdown_table, median

# arm → (OpenMP environment, intra-op threads, concurrent single-threaded halves of the request)
ARMS: dict[str, tuple[dict[str, str], int, int]] = {
    "passive-2": ({"OMP_WAIT_POLICY": "PASSIVE"}, 2, 1),  # the worker's default so far
    "active-2": ({"OMP_WAIT_POLICY": "ACTIVE"}, 2, 1),
    "gomp-default-2": ({}, 2, 1),  # libgomp's own default: spin 300,000 iterations, then sleep
    "spin1k-2": ({"GOMP_SPINCOUNT": "1000"}, 2, 1),
    "spin10k-2": ({"GOMP_SPINCOUNT": "10000"}, 2, 1),
    "passive-2-pinned": ({"OMP_WAIT_POLICY": "PASSIVE", "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}, 2, 1),
    "passive-1": ({"OMP_WAIT_POLICY": "PASSIVE"}, 1, 1),
    "inter-2x1": ({"OMP_WAIT_POLICY": "PASSIVE"}, 1, 2),  # two halves at once, one thread each
    # Intel's OpenMP with TCMalloc, preloaded with Intel's wait as the worker ships them (--openmp-runtime auto, added
    # by Arm): 2, 1 and 4 threads (4 on 2 cores: a pod whose thread count is larger than the cores it really gets)
    "intel-2": ({}, 2, 1),
    "intel-1": ({}, 1, 1),
    "intel-4": ({}, 4, 1),
    # Intel's block time (ms a thread spins after a parallel region before it sleeps): the worker's 1, vLLM's 5, longer
    "intel-2-bt5": ({"KMP_BLOCKTIME": "5"}, 2, 1),
    "intel-2-bt20": ({"KMP_BLOCKTIME": "20"}, 2, 1),
    "intel-2-bt200": ({"KMP_BLOCKTIME": "200"}, 2, 1),
    "intel-2-thp": ({"THP_MEM_ALLOC_ENABLE": "1"}, 2, 1),  # torch's large CPU buffers on transparent huge pages
    "intel-2-pinned": ({"KMP_AFFINITY": "granularity=fine,compact,1,0"}, 2, 1),  # one thread per CPU, as vLLM binds
}
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES", "KMP_BLOCKTIME", "KMP_AFFINITY")


def child(args: argparse.Namespace, arm: str) -> None:
    """Load, warm up, then one request per line read from stdin; its seconds on stdout."""
    import torch
    from scorekeeper_worker.library import (
        DType,
        Executor,
        Limits,
        ScoreAsk,
        fuse_linears,
        keep_freed_memory,
        load_model,
        minilm_path,
        score_now,
        scored,
    )

    from bench.cpu.bench_minilm import make_workload

    _, threads, halves = ARMS[arm]
    torch.set_num_threads(threads)
    keep_freed_memory()
    model = load_model(minilm_path(), DType.FLOAT32, "cpu", "shared-cores")
    fuse_linears(model.trunk)
    workload = make_workload(minilm_path(), args.mix, args.items, 0)
    items = workload["items"]
    parts = [items[i::halves] for i in range(halves)]
    limits = Limits(max_batch_tokens=args.max_batch_tokens)

    def one(part: list[str]) -> None:
        torch.set_num_threads(threads)  # per thread: OpenMP's thread count is a per-thread setting
        with torch.inference_mode():
            scored(score_now(Executor(model), [ScoreAsk(query=workload["query"], items=part)], limits,
                             args.max_batch_tokens))

    pool = ThreadPoolExecutor(halves)
    for _ in range(2):  # warm-up: kernels for these shapes
        list(pool.map(one, parts))
    print("ready", flush=True)
    for _ in sys.stdin:
        started = time.perf_counter()
        list(pool.map(one, parts))
        print(f"{time.perf_counter() - started:.6f}", flush=True)


class Arm:
    def __init__(self, name: str, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES}
        env.update({k: str(v) for k, v in CACHE_BOUNDS.items()})
        if name.startswith("intel-"):
            intel = intel_openmp_env()
            if not intel:
                raise SystemExit(f"{name}: libiomp5 not found (pip install intel-openmp)")
            env.update(intel)
        env.update(ARMS[name][0])  # after the runtime's defaults: an arm's own setting wins
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", name, *argv], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", name
        os.kill(self.proc.pid, signal.SIGSTOP)

    def measure(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            return float(self.proc.stdout.readline())
        finally:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--conditions", default="quiet,neighbours,stress")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mix", default="short")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--neighbour-cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args, args.child)
        return
    names = args.arms.split(",")
    forwarded = ["--mix", args.mix, "--items", str(args.items), "--max-batch-tokens", str(args.max_batch_tokens)]
    rng = random.Random(args.seed)
    arms: list[Arm] = []
    seconds: dict[tuple[str, str], list[float]] = {}
    loads: dict[str, float] = {}
    try:
        for name in names:
            log(f"starting arm {name}")
            arms.append(Arm(name, forwarded))
        for condition in args.conditions.split(","):
            command = background_load(condition, args.neighbour_cpus)
            neighbour = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True) if command else None
            try:
                time.sleep(1.0 if neighbour else 0.0)
                for round_ in range(args.rounds):
                    for arm in rng.sample(arms, len(arms)):
                        seconds.setdefault((condition, arm.name), []).append(arm.measure())
                    log(f"{condition}: round {round_ + 1}/{args.rounds}")
                loads[condition] = os.getloadavg()[0]
            finally:
                if neighbour is not None:
                    os.killpg(neighbour.pid, signal.SIGTERM)  # stress and its workers: a process session of its own
                    neighbour.wait()
    finally:
        for arm in arms:
            arm.close()
    rows = []
    for condition in args.conditions.split(","):
        base = median(seconds[(condition, names[0])])
        for name in names:
            s = median(seconds[(condition, name)])
            quiet = seconds.get(("quiet", name))
            rows.append([f"{condition} (load {loads[condition]:.1f})", name, f"{s:.3f}", f"{args.items / s:.0f}",
                         f"{base / s:.2f}×", f"{median(quiet) / s:.2f}×" if quiet else ""])
    print(machine_note())
    neighbours = " ".join(background_load("neighbours", args.neighbour_cpus) or [])
    print(f"all-MiniLM-L6-v2 embeddings, float32, 1 query × {args.items} {args.mix} documents, median of "
          f"{args.rounds} interleaved rounds; neighbours: {neighbours}")
    print(markdown_table(["condition", "arm", "s/request", "docs/s", f"speed vs {names[0]}", "speed vs quiet"],
                         rows))


if __name__ == "__main__":
    main()
