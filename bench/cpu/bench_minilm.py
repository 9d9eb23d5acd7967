"""all-MiniLM-L6-v2, 1 query × 200 items: items/s of the Scorekeeper worker (HTTP) against its peers.

The work is the same for every system: embed the query and the 200 items (mean pooling), then the 200 cosines.
Two item-length mixes, drawn with a fixed seed: "short" (8–64 tokens per item) and "long" (32–224 tokens), token
counts including [CLS] and [SEP]; the query has 16 tokens.

Systems (each in its own process, repetitions taken round-robin after a warm-up):
- scorekeeper: `scorekeeper-worker serve` started here on a loopback port; one POST /v1/score per repetition,
  timed on the client (JSON, HTTP, tokenization, packing, forward, cosines);
- sentence-transformers: `SentenceTransformer.encode` with its default batching (32, length-sorted);
- transformers: plain `AutoModel`, padded batches of 32 in request order, mean pooling;
- infinity: `infinity-emb` AsyncEmbeddingEngine (torch engine, CPU), from the separate venv .venv-bench.

    .venv/bin/python bench/cpu/bench_minilm.py                 # float32 and bfloat16, both mixes
    .venv/bin/python bench/cpu/bench_minilm.py --quick         # fewer repetitions
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
    BENCH_VENV_PYTHON,
    Peer,
    Worker,
    log,
    machine_note,
    markdown_table,
    max_abs_diff,
    median,
    parse_worker_args,
)
from bench.harness.idle import settle

MIXES = {"short": (8, 64), "long": (32, 224)}
QUERY_TOKENS = 16
PEER_LABELS = {"st": "sentence-transformers", "hf": "transformers padded (batch 32)", "infinity": "infinity-emb"}


def minilm_dir() -> Path:
    from scorekeeper_worker.library import minilm_path

    return minilm_path()


def word_list(model_dir: Path) -> list[str]:
    """Lower-case whole words that WordPiece keeps as one token each."""
    vocab = (model_dir / "vocab.txt").read_text().split("\n")
    return [w for w in vocab if w.isascii() and w.isalpha() and w.islower() and 3 <= len(w) <= 10]


def make_text(rng: random.Random, words: list[str], tokens: int) -> str:
    return " ".join(rng.choice(words) for _ in range(tokens - 2))  # + [CLS] and [SEP]


def make_workload(model_dir: Path, mix: str, items: int, seed: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    rng = random.Random(f"{seed}-{mix}")
    words = word_list(model_dir)
    low, high = MIXES[mix]
    lengths = [rng.randint(low, high) for _ in range(items)]
    workload = {"query": make_text(rng, words, QUERY_TOKENS), "items": [make_text(rng, words, n) for n in lengths]}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    got = [len(ids) for ids in tokenizer([workload["query"], *workload["items"]])["input_ids"]]
    if got != [QUERY_TOKENS, *lengths]:
        raise AssertionError("generated texts do not have the intended token counts")
    workload["tokens"], workload["lengths"] = sum(got), got
    return workload


def run_dtype(dtype: str, mixes: list[str], systems: list[str], args: argparse.Namespace,
              model_dir: Path, workloads: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """All systems of one dtype; returns one record per (mix, system)."""
    runners: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    records: list[dict[str, Any]] = []
    first = workloads[mixes[0]]
    try:
        if "scorekeeper" in systems:
            runners["scorekeeper"] = Worker(model_dir, dtype, args.worker_arg)
        for system in systems:
            if system == "scorekeeper":
                continue
            python = BENCH_VENV_PYTHON if system == "infinity" else None
            if python is not None and not Path(python).exists():
                unavailable[system] = f"{python} not found (see docs/benchmarks.md to create it)"
                continue
            try:
                runners[system] = Peer(system, model_dir, dtype, first, python=python)
                log(f"{system}: {runners[system].info}")
            except RuntimeError as error:
                unavailable[system] = str(error).splitlines()[0][:300]
                log(f"{system} unavailable: {error}")

        def once(system: str, workload: dict[str, Any]) -> tuple[float, list[float]]:
            """One timed request, then a wait until the system is idle again (idle.py), so the next is timed alone."""
            runner = runners[system]
            if system == "scorekeeper":
                seconds, body = runner.score({"query": workload["query"], "items": workload["items"]})
                scores = [row[0] for row in body["scores"]]
            else:
                seconds, result = runner.run(workload=workload)
                scores = result["scores"]
            settle({runner.proc.pid})  # each runner leads a session of its own
            return seconds, scores

        for mix in mixes:
            workload = workloads[mix]
            times: dict[str, list[float]] = {s: [] for s in runners}
            scores: dict[str, list[float]] = {}
            for _ in range(args.warmup):
                for system in runners:
                    _, scores[system] = once(system, workload)
            for rep in range(args.reps):
                order = list(runners) if rep % 2 == 0 else list(reversed(runners))
                for system in order:
                    seconds, _ = once(system, workload)
                    times[system].append(seconds)
                log(f"{dtype} {mix} rep {rep + 1}/{args.reps}: "
                    + ", ".join(f"{s} {times[s][-1]:.3f}s" for s in runners))
            for system in runners:
                records.append({"dtype": dtype, "mix": mix, "system": system, "times": times[system],
                                "items_per_s": len(workload["items"]) / median(times[system]),
                                "scores": scores[system]})
            for system, why in unavailable.items():
                records.append({"dtype": dtype, "mix": mix, "system": system, "unavailable": why})
    finally:
        for runner in runners.values():
            runner.close()
    return records


def report(records: list[dict[str, Any]], reference: dict[str, list[float]]) -> str:
    rows = []
    summary = []
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        for mix in dict.fromkeys(r["mix"] for r in records if r["dtype"] == dtype):
            group = [r for r in records if r["dtype"] == dtype and r["mix"] == mix]
            peers = [r for r in group if r["system"] != "scorekeeper" and "unavailable" not in r]
            best = max(peers, key=lambda r: r["items_per_s"]) if peers else None
            for r in group:
                name = "scorekeeper (HTTP)" if r["system"] == "scorekeeper" else PEER_LABELS[r["system"]]
                if "unavailable" in r:
                    rows.append([mix, name, dtype, "unavailable", "", "", r["unavailable"][:80]])
                    continue
                ratio = f"{r['items_per_s'] / best['items_per_s']:.2f}×" if best else "n/a"
                diff = max_abs_diff(r["scores"], reference[mix]) if mix in reference else float("nan")
                rows.append([mix, name, dtype, f"{r['items_per_s']:.0f}", f"{1000 * median(r['times']):.0f}",
                             ratio, f"{diff:.1e}"])
            sk = next((r for r in group if r["system"] == "scorekeeper" and "unavailable" not in r), None)
            if sk and best:
                # Per-round ratio against the best peer: same repetition index, same machine conditions.
                per_round = [b / s for s, b in zip(sk["times"], best["times"], strict=False)]
                ratio = sk["items_per_s"] / best["items_per_s"]
                summary.append(f"{dtype} {mix}: scorekeeper / best peer ({PEER_LABELS[best['system']]}) = "
                               f"{ratio:.2f}× (per-round ratios {min(per_round):.2f}–{max(per_round):.2f}×); "
                               f"target ≥ 1.5×: {'met' if ratio >= 1.5 else 'NOT met'}")
    table = markdown_table(["mix", "system", "dtype", "items/s", "ms/request", "ratio vs best peer",
                            "max |Δcos| vs fp32 transformers"], rows)
    return table + "\n\n" + "\n".join(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma-separated: float32,bfloat16")
    parser.add_argument("--mix", default="short,long", help="comma-separated: short (8–64), long (32–224)")
    parser.add_argument("--systems", default="scorekeeper,st,hf,infinity")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 repetitions, 1 warm-up")
    args = parse_worker_args(parser, worker_arg_help=", e.g. --worker-arg=--max-batch-tokens=4096")
    if args.quick:
        args.reps, args.warmup = 3, 1
    dtypes = args.dtype.split(",")
    mixes = args.mix.split(",")
    systems = args.systems.split(",")
    model_dir = minilm_dir()
    workloads = {mix: make_workload(model_dir, mix, args.items, args.seed) for mix in mixes}
    for mix, w in workloads.items():
        log(f"mix {mix}: 1 query + {len(w['items'])} items, {w['tokens']} tokens")
    records: list[dict[str, Any]] = []
    for dtype in dtypes:
        records += run_dtype(dtype, mixes, systems, args, model_dir, workloads)
    reference = {r["mix"]: r["scores"] for r in records
                 if r["system"] == "hf" and r["dtype"] == "float32" and "unavailable" not in r}
    print(f"\nall-MiniLM-L6-v2, 1 query ({QUERY_TOKENS} tokens) × {args.items} items; "
          + "; ".join(f"{m}: items {MIXES[m][0]}–{MIXES[m][1]} tokens, {workloads[m]['tokens']} tokens in all"
                      for m in mixes))
    print(f"{machine_note()}; {args.reps} repetitions after {args.warmup} warm-up, medians\n")
    print(report(records, reference))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
