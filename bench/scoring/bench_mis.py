"""Multi-item scoring (MIS) with SmolLM2-135M-Instruct: items/s of MIS vs single-item mode vs plain transformers.

Inputs are token ids (seeded): a query of Q random ids and N items of I=16 random ids; label_token_ids are the ids of
" yes" and " no"; apply_softmax=true. Per (dtype, Q, N):
- mis:    one POST /v1/score with "multi_item_scoring": true (query once, items attend to it; the worker chunks
          requests above --max-batch-tokens, repeating the query per chunk);
- single: the same request with "multi_item_scoring": false (every item is scored as its own query+item sequence);
- hf:     plain transformers `LlamaForCausalLM` on rows query+item in batches of 32 (equal lengths, so no padding
          waste), logits of the two labels at the last token (`logits_to_keep=1`), softmax.
Both worker modes run on the same server (started here, one per dtype); the peer runs in its own process.

Single-item and transformers cost exactly N·(Q+I) tokens in N independent sequences, so their items/s do not depend
on N: above --sample-items items they are timed on the first --sample-items items (marked "(of 32)" in the table).
A system whose estimated repetition exceeds --budget seconds is "skipped (budget)". The token ratio
N·(Q+I)/(Q+N·I) is the speed-up MIS would get if time were proportional to tokens.

    .venv/bin/python bench/scoring/bench_mis.py --quick      # float32+bfloat16, Q=512, N ∈ {10, 100}
    .venv/bin/python bench/scoring/bench_mis.py              # full: Q ∈ {128, 512}, N ∈ {10, 100, 500}
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import (
    Peer,
    Worker,
    log,
    machine_note,
    markdown_table,
    max_abs_diff,
    median,
    parse_worker_args,
)

ITEM_LEN = 16
DEFAULT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"


def smollm2_dir(cache: Path) -> Path:
    from scorekeeper_worker.library import prepare_smollm2

    return Path(prepare_smollm2(cache))


def label_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(" yes", add_special_tokens=False)["input_ids"], tok(" no", add_special_tokens=False)["input_ids"]]
    if any(len(i) != 1 for i in ids):
        raise AssertionError(f"label words are not single tokens: {ids}")
    return [ids[0][0], ids[1][0]]


def make_workload(q: int, n: int, vocab: int, labels: list[int], seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{q}-{n}")
    def ids(k: int) -> list[int]:
        return [rng.randrange(32, vocab) for _ in range(k)]  # above the special tokens
    return {"query": ids(q), "items": [ids(ITEM_LEN) for _ in range(n)], "labels": labels}


def token_ratio(q: int, n: int) -> float:
    return n * (q + ITEM_LEN) / (q + n * ITEM_LEN)


class Systems:
    """One dtype: the worker (both modes) and the transformers peer."""

    def __init__(self, model_dir: Path, dtype: str, names: list[str], worker_args: list[str],
                 first: dict[str, Any]) -> None:
        self.names = names
        self.worker = Worker(model_dir, dtype, worker_args) if {"mis", "single"} & set(names) else None
        self.peer = None
        try:
            if "hf" in names:
                self.peer = Peer("hf-causal", model_dir, dtype, first)
                log(f"hf-causal: {self.peer.info}")
        except Exception:
            self.close()
            raise

    def run(self, system: str, workload: dict[str, Any], count: int) -> tuple[float, list[list[float]]]:
        items = workload["items"][:count]
        if system in ("mis", "single"):
            assert self.worker is not None
            seconds, body = self.worker.score({
                "query": workload["query"], "items": items, "label_token_ids": workload["labels"],
                "apply_softmax": True, "multi_item_scoring": system == "mis"})
            return seconds, body["scores"]
        assert self.peer is not None
        seconds, result = self.peer.run(workload=workload, limit=count)
        return seconds, result["scores"]

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.peer is not None:
            self.peer.close()


def bench_config(systems: Systems, workload: dict[str, Any], q: int, n: int, args: argparse.Namespace,
                 dtype: str) -> dict[str, Any]:
    counts = {s: n if s == "mis" else min(n, args.sample_items) for s in systems.names}
    plan: dict[str, int] = {}
    times: dict[str, list[float]] = {s: [] for s in systems.names}
    scores: dict[str, list[list[float]]] = {}
    skipped: dict[str, str] = {}
    # Warm-up on up to 32 items (the same batch shapes as the timed runs), then extrapolate one repetition.
    for system in systems.names:
        k = min(counts[system], 32)
        seconds, _ = systems.run(system, workload, k)
        estimate = seconds * counts[system] / k
        if estimate > args.budget:
            skipped[system] = f"skipped (budget: ~{estimate:.0f} s > {args.budget:.0f} s)"
            log(f"{dtype} Q={q} N={n} {system}: {skipped[system]}")
            continue
        max_reps = args.reps if system == "mis" else args.reps_slow
        plan[system] = max(1, min(max_reps, int(args.config_budget / max(estimate, 1e-3))))
        if k < counts[system] and args.warmup:
            systems.run(system, workload, counts[system])  # a full-size warm-up when the first one was partial
    for rep in range(max(plan.values(), default=0)):
        order = [s for s in systems.names if s in plan and rep < plan[s]]
        for system in order if rep % 2 == 0 else reversed(order):
            seconds, scores[system] = systems.run(system, workload, counts[system])
            times[system].append(seconds)
        log(f"{dtype} Q={q} N={n} rep {rep + 1}: "
            + ", ".join(f"{s} {times[s][-1]:.3f}s" for s in order))
    result: dict[str, Any] = {"dtype": dtype, "q": q, "n": n, "counts": counts, "skipped": skipped, "times": times}
    result["items_per_s"] = {s: counts[s] / median(times[s]) for s in plan}
    common = min(counts.values())
    ref = scores.get("single")
    result["diff"] = {}
    for s in scores:
        if ref is not None and s != "single":
            a = [x for row in scores[s][:common] for x in row]
            b = [x for row in ref[:common] for x in row]
            result["diff"][s] = max_abs_diff(a, b)
    return result


def report(results: list[dict[str, Any]], names: list[str]) -> str:
    label = {"mis": "MIS items/s", "single": "single-item items/s", "hf": "transformers batch-32 items/s"}
    rows = []
    summary = []
    for r in results:
        ips = r["items_per_s"]
        cells = [r["dtype"], str(r["q"]), str(r["n"])]
        for s in names:
            if s in r["skipped"]:
                cells.append("skipped (budget)")
            elif s in ips:
                of = f" (of {r['counts'][s]})" if r["counts"][s] < r["n"] else ""
                cells.append(f"{ips[s]:.3g}{of}")
            else:
                cells.append("—")
        tr = token_ratio(r["q"], r["n"])
        mis_single = ips["mis"] / ips["single"] if "mis" in ips and "single" in ips else None
        mis_hf = ips["mis"] / ips["hf"] if "mis" in ips and "hf" in ips else None
        cells += [f"{mis_single:.1f}×" if mis_single else "—", f"{mis_hf:.1f}×" if mis_hf else "—", f"{tr:.1f}×",
                  f"{100 * mis_single / tr:.0f} %" if mis_single else "—",
                  " ".join(f"{s} {d:.0e}" for s, d in r["diff"].items()) or "—"]
        rows.append(cells)
        if r["q"] == 512 and r["n"] == 100 and mis_single:
            summary.append(f"{r['dtype']} Q=512 N=100: MIS / single-item = {mis_single:.1f}× = "
                           f"{100 * mis_single / tr:.0f} % of the token ratio {tr:.1f}× (target ≥ 70 %, ≥ 17×): "
                           f"{'met' if mis_single / tr >= 0.7 else 'NOT met'}")
    header = ["dtype", "Q", "N", *(label[s] for s in names), "MIS / single", "MIS / transformers",
              "token ratio", "MIS/single ÷ token ratio", "max |Δp| vs single"]
    return markdown_table(header, rows) + ("\n\n" + "\n".join(summary) if summary else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--q", default="128,512", help="query lengths")
    parser.add_argument("--n", default="10,100,500", help="items per request")
    parser.add_argument("--systems", default="mis,single,hf")
    parser.add_argument("--reps", type=int, default=5, help="most repetitions for MIS")
    parser.add_argument("--reps-slow", type=int, default=3, help="most repetitions for single-item and transformers")
    parser.add_argument("--warmup", type=int, default=1, help="0 skips the full-size warm-up of slow systems")
    parser.add_argument("--sample-items", type=int, default=32,
                        help="single-item and transformers are timed on at most this many items")
    parser.add_argument("--budget", type=float, default=240.0, help="skip a system whose repetition exceeds this")
    parser.add_argument("--config-budget", type=float, default=90.0,
                        help="fewer repetitions when a system's repetitions would exceed this many seconds")
    parser.add_argument("--quick", action="store_true",
                        help="Q=512, N ∈ {10, 100}, 3/2 repetitions, tighter budgets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the converted SmolLM2 dir lives")
    args = parse_worker_args(parser, json_help="write the raw results here")
    if args.quick:
        args.q, args.n, args.reps, args.reps_slow = "512", "10,100", 3, 2
        args.budget, args.config_budget = min(args.budget, 120.0), min(args.config_budget, 45.0)
    names = args.systems.split(",")
    qs = [int(v) for v in args.q.split(",")]
    ns = [int(v) for v in args.n.split(",")]
    model_dir = smollm2_dir(args.cache)
    labels = label_ids(model_dir)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    log(f"model {model_dir}, labels {labels}")
    configs = sorted(((q, n) for q in qs for n in ns), key=lambda c: c[0] * c[1])
    workloads = {c: make_workload(c[0], c[1], vocab, labels, args.seed) for c in configs}
    results = []
    for dtype in args.dtype.split(","):
        systems = Systems(model_dir, dtype, names, args.worker_arg, workloads[configs[0]])
        try:
            for q, n in configs:
                results.append(bench_config(systems, workloads[(q, n)], q, n, args, dtype))
        finally:
            systems.close()
    print(f"\nSmolLM2-135M-Instruct, token-id inputs, item length {ITEM_LEN}, labels {labels}, apply_softmax; "
          f"single-item and transformers timed on ≤ {args.sample_items} items")
    print(f"{machine_note()}; medians of ≤ {args.reps} (MIS) / ≤ {args.reps_slow} (others) repetitions "
          "after a warm-up\n")
    print(report(results, names))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
