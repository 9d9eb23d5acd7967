"""Full garbage collections in a process that holds a loaded worker: their pause before and after `gc.freeze()`.

    .venv/bin/python bench/http/bench_gc.py                     # SmolLM2-135M (real weights), 5 collections each way
    .venv/bin/python bench/http/bench_gc.py --model DIR --repeat 9

The worker's own start-up path in this process (the FastAPI app, `load`: model, executor, the start-up
self-check's leftovers, the scheduler thread) with `--no-gc-freeze`; then `gc.collect()` timed `--repeat`
times, `freeze_after_load()` as `--gc-freeze` calls it, and `gc.collect()` timed again. A full collection holds the
GIL: for its whole pause no request in the process progresses.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import REPO, log, machine_note, markdown_table, set_threads


def full_collections(repeat: int) -> list[float]:
    pauses = []
    for _ in range(repeat):
        started = time.perf_counter()
        gc.collect()
        pauses.append(time.perf_counter() - started)
    return pauses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: SmolLM2-135M, converted offline)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    set_threads(args.threads)

    from scorekeeper_worker.library import (
        WorkerConfig,
        WorkerMetrics,
        create_app,
        freeze_after_load,
        load,
        prepare_smollm2,
    )

    model = args.model or prepare_smollm2(REPO / ".cache" / "models")
    config = WorkerConfig(model=model, gc_freeze=False)
    create_app(config)  # FastAPI and its routes, as in a worker
    served = load(config, WorkerMetrics())
    log(f"loaded {model}")
    tracked = len(gc.get_objects())
    before = full_collections(args.repeat)
    frozen = freeze_after_load()
    after = full_collections(args.repeat)
    served.scheduler.stop(config.drain_timeout_seconds)
    rows = [[label, f"{objects:,}", f"{1000 * statistics.median(p):.3f}", f"{1000 * max(p):.3f}"]
            for label, objects, p in (("--no-gc-freeze", tracked, before),
                                      ("--gc-freeze", len(gc.get_objects()), after))]
    print(f"\n{model.name}; {machine_note()}; {frozen:,} objects frozen\n")
    print(markdown_table(["worker", "objects a full collection walks", "median pause ms", "max pause ms"], rows))


if __name__ == "__main__":
    main()
