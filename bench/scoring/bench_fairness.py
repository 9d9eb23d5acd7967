"""Fairness: small requests while one large multi-item request runs, on SmolLM2-135M-Instruct (issue 13).

A forward pass cannot be interrupted, so a small request that arrives mid-batch must at least wait for the rest of
that batch: the target is worst small-request latency during the large request ≤ its time alone + 2 batch durations,
with the large request's own time within 10 % of its time alone (strictly first come, first served, the small
request waits for the whole large request instead).

Phases, one worker per system (seeded token ids, label_token_ids " yes"/" no", apply_softmax, --multi-item-scoring,
--max-batch-tokens 2048 as in the issue):
- small alone: --small-reps sequential small requests (query 64 tokens, 4 items of 16);
- batch alone: one request that plans exactly one full batch (query 512 tokens, 24 items of 64: 2048 tokens);
- large alone: one large request (query 512 tokens, --items items of 64: 2048-token chunks);
- large with small traffic: the large request again while one client sends small requests back to back, each as
  soon as the previous one is answered (so each arrives just as the next large batch starts: the worst phase);
  every small request sent while the large one runs counts, also one answered after it.
`--baseline PATH` runs the same phases on another checkout's worker (PATH/worker) in the same run, e.g. the
strictly first-come-first-served scheduler before issue 13:

    git archive 50b34a9 worker | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python bench/scoring/bench_fairness.py --quick --baseline /tmp/before   # 100 items (5 batches)
    .venv/bin/python bench/scoring/bench_fairness.py --baseline /tmp/before   # 400 items (17 batches)
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import Worker, log, machine_note, markdown_table, max_abs_diff, median, set_threads
from bench.scoring.bench_mis import DEFAULT_CACHE, label_ids, smollm2_dir

MAX_BATCH_TOKENS = 2048
QUERY, ITEM = 512, 64
BATCH_ITEMS = (MAX_BATCH_TOKENS - QUERY) // ITEM  # items of one full chunk: 512 + 24 × 64 = 2048 tokens
SMALL_QUERY, SMALL_ITEMS, SMALL_ITEM = 64, 4, 16


def _ids(rng: random.Random, count: int, vocab: int) -> list[int]:
    return [rng.randrange(32, vocab) for _ in range(count)]


def workloads(labels: list[int], items: int, seed: int, vocab: int) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    common = {"label_token_ids": labels, "apply_softmax": True, "multi_item_scoring": True}
    query = _ids(rng, QUERY, vocab)
    return {
        "small": {"query": _ids(rng, SMALL_QUERY, vocab),
                  "items": [_ids(rng, SMALL_ITEM, vocab) for _ in range(SMALL_ITEMS)], **common},
        "batch": {"query": query, "items": [_ids(rng, ITEM, vocab) for _ in range(BATCH_ITEMS)], **common},
        "large": {"query": query, "items": [_ids(rng, ITEM, vocab) for _ in range(items)], **common},
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stats(values: list[float]) -> str:
    if not values:
        return "none"
    return f"{median(values):.2f} / {quantile(values, 0.99):.2f} / {max(values):.2f}"


def run_system(name: str, worker: Worker, loads: dict[str, dict[str, Any]], small_reps: int) -> dict[str, Any]:
    worker.score(loads["small"])  # warm both shapes
    worker.score(loads["batch"])
    small_alone = [worker.score(loads["small"])[0] for _ in range(small_reps)]
    batch_alone = [worker.score(loads["batch"])[0] for _ in range(3)]
    log(f"{name}: small alone {stats(small_alone)} s, batch alone {median(batch_alone):.2f} s")
    large_alone, expected = worker.score(loads["large"])
    log(f"{name}: large alone {large_alone:.1f} s")

    result: dict[str, Any] = {}

    def large() -> None:
        started = time.perf_counter()
        response = httpx.post(worker.url + "/v1/score", json=loads["large"], timeout=3600)
        result["seconds"] = time.perf_counter() - started
        result["status"] = response.status_code
        result["scores"] = response.json().get("scores")

    thread = threading.Thread(target=large)
    thread.start()
    while thread.is_alive() and "scorekeeper_queue_depth 0.0" in httpx.get(worker.url + "/metrics").text:
        time.sleep(0.01)  # until the large request is admitted
    during = []
    while thread.is_alive():  # every small request is sent while the large one runs (it may finish after it)
        during.append(worker.score(loads["small"])[0])
    thread.join()
    if result.get("status") != 200:
        raise RuntimeError(f"{name}: the large request failed under load: {result.get('status')}")
    drift = max(max_abs_diff(a, b) for a, b in zip(result["scores"], expected["scores"], strict=True))
    if drift > 1e-4:
        raise RuntimeError(f"{name}: the large request's scores changed under load by {drift}")
    log(f"{name}: large with traffic {result['seconds']:.1f} s, small during {stats(during)} s (n={len(during)})")
    return {"system": name, "small_alone": small_alone, "batch": median(batch_alone), "large_alone": large_alone,
            "large_loaded": result["seconds"], "during": during}


def report(rows: list[dict[str, Any]]) -> str:
    header = ["system", "small alone p50 / p99 / max (s)", "one full batch alone (s)", "large alone (s)",
              "large with small traffic (s)", "small during large p50 / p99 / max (s)", "n",
              "bound: alone p50 + 2 batches (s)", "worst small ≤ bound", "large within 10 %"]
    lines = []
    for row in rows:
        bound = median(row["small_alone"]) + 2 * row["batch"]
        worst = max(row["during"]) if row["during"] else float("nan")
        slowdown = row["large_loaded"] / row["large_alone"]
        lines.append([row["system"], stats(row["small_alone"]), f"{row['batch']:.2f}", f"{row['large_alone']:.1f}",
                      f"{row['large_loaded']:.1f} (×{slowdown:.2f})", stats(row["during"]), str(len(row["during"])),
                      f"{bound:.2f}", "yes" if worst <= bound else "no", "yes" if slowdown <= 1.10 else "no"])
    return markdown_table(header, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=400, help="items of the large request (64 tokens each)")
    parser.add_argument("--quick", action="store_true", help="--items 100 --small-reps 10")
    parser.add_argument("--small-reps", type=int, default=20)
    parser.add_argument("--baseline", type=Path, help="another checkout whose worker runs the same phases")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the converted SmolLM2 dir lives")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the worker (default: torch's choice)")
    args = parser.parse_args()
    if args.quick:
        args.items, args.small_reps = 100, 10
    set_threads(args.threads)
    model_dir = smollm2_dir(args.cache)
    from transformers import AutoConfig

    loads = workloads(label_ids(model_dir), args.items, args.seed, AutoConfig.from_pretrained(model_dir).vocab_size)
    worker_args = ["--multi-item-scoring", "--max-batch-tokens", str(MAX_BATCH_TOKENS)]
    systems = [("this checkout", None)]
    if args.baseline is not None:
        systems.append((f"baseline {args.baseline}", {"PYTHONPATH": str(args.baseline.resolve() / "worker")}))
    rows = []
    for name, env in systems:
        with Worker(model_dir, args.dtype, worker_args, env=env) as worker:
            rows.append(run_system(name, worker, loads, args.small_reps))
    print(f"\nSmolLM2-135M-Instruct {args.dtype}, --max-batch-tokens {MAX_BATCH_TOKENS}, multi-item scoring; large: "
          f"query {QUERY} + {args.items} items × {ITEM} tokens; small: query {SMALL_QUERY} + {SMALL_ITEMS} × "
          f"{SMALL_ITEM}; {machine_note()}\n")
    print(report(rows))


if __name__ == "__main__":
    main()
