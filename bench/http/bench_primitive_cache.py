"""oneDNN's primitive cache (keyed by tensor shape) against the worker's memory: RSS over requests of mixed shapes.

Each configuration is a fresh worker (real all-MiniLM-L6-v2, float32, CPU) with ONEDNN_PRIMITIVE_CACHE_CAPACITY set
as given ("default": unset, so the worker's own bound applies; oneDNN's built-in capacity is 1024). After a warm-up,
the same seeded sequence of requests runs against each: 1-16 items of 1-60 words, so nearly every batch has a new
token count. RSS is read from /proc after the warm-up and at the end; speed is requests per second over the run.

    PYTHONPATH=worker python bench/http/bench_primitive_cache.py --requests 3000 --capacities 1024,0,default
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import Worker, log, machine_note, markdown_table

WORDS = ("capital", "city", "river", "mountain", "history", "science", "music", "theatre", "language", "garden",
         "ocean", "forest", "winter", "summer", "bridge", "market", "station", "library", "museum", "harbour")


def _requests(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))

    return [{"query": text(), "items": [text() for _ in range(rng.randint(1, 16))]} for _ in range(count)]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def run(model: str, capacity: str, warmup: list[dict[str, object]], measured: list[dict[str, object]]
        ) -> list[str]:
    env = {} if capacity == "default" else {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": capacity}
    worker = Worker(model, "float32", extra_args=["--max-batch-tokens", "4096"], env=env)
    try:
        for body in warmup:
            worker.score(body)
        before = _rss_mib(worker.proc.pid)
        started = time.perf_counter()
        peak = before
        for i, body in enumerate(measured):
            worker.score(body)
            if i % 100 == 99:
                peak = max(peak, _rss_mib(worker.proc.pid))
                log(f"capacity {capacity}: {i + 1} requests, RSS {_rss_mib(worker.proc.pid):.0f} MiB")
        seconds = time.perf_counter() - started
        after = _rss_mib(worker.proc.pid)
        log(f"capacity {capacity}: RSS {before:.0f} → {after:.0f} MiB (peak {peak:.0f}), {seconds:.1f} s")
        return [capacity, f"{before:.0f}", f"{after:.0f}", f"{after - before:+.0f}", f"{peak:.0f}",
                f"{len(measured) / seconds:.1f}"]
    finally:
        worker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--capacities", default="1024,0,default")
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    if args.model is None:
        from scorekeeper_worker.library import minilm_path

        args.model = str(minilm_path())
    warmup = _requests(args.warmup, args.seed + 1)
    measured = _requests(args.requests, args.seed)
    rows = [run(args.model, capacity, warmup, measured) for capacity in args.capacities.split(",")]
    print(machine_note())
    print(markdown_table(["ONEDNN_PRIMITIVE_CACHE_CAPACITY", "RSS after warm-up (MiB)", "RSS at end (MiB)",
                          "growth (MiB)", "peak (MiB)", "requests/s"], rows))


if __name__ == "__main__":
    main()
