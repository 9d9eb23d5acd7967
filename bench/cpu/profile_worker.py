"""Profile the worker's scoring path in-process (no HTTP): where the time of one request goes.

    .venv/bin/python bench/cpu/profile_worker.py minilm --mix long            # torch.profiler op table
    .venv/bin/python bench/cpu/profile_worker.py smollm2 --q 512 --n 100 --mis
    .venv/bin/python bench/cpu/profile_worker.py minilm --mix long --stages   # wall time per stage, no profiler
    .venv/bin/python bench/cpu/profile_worker.py smollm2 --q 120 --n 10 --graph-buckets 2048,4096,8192 \
        --simulate-device-ms 21 --stages    # the host's work around a simulated device (docs/gpu.md)

It drives the same objects as the server (`score_now`: the request prepared as the server prepares it, then
Executor.run, the model thread's work) on the workloads of bench_minilm.py / bench_mis.py, after a warm-up, and prints
the top operators by self CPU time (torch.profiler) and the executor's own stage split (inputs / forward / scoring).
`--graph-buckets` packs into CUDA-graph buckets (on CPU: the padded path) and `--simulate-device-ms` replaces the
forward by the simulated device (`--simulate-device-ms` of the worker), so what is left is the host's work.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

import torch
from scorekeeper_worker.engine.runner.device_stream import SimulatedStream
from scorekeeper_worker.library import (
    BatchStats,
    DType,
    Executor,
    GraphRunner,
    LayoutKind,
    Limits,
    ScoreAsk,
    ScoringModel,
    fuse_linears,
    load_model,
    minilm_path,
    prepare_smollm2,
    score_now,
    scored,
)

from bench.harness.common import median


def load(kind: str, dtype: str, cache: Path) -> ScoringModel:
    path = minilm_path() if kind == "minilm" else Path(prepare_smollm2(cache))
    model = load_model(path, DType(dtype), "cpu", kind)
    if model.dtype == torch.float32:  # as the server loads it (--onednn-linear, on by default)
        fuse_linears(model.trunk)
    return model


def ask_for(kind: str, model: ScoringModel, args: argparse.Namespace) -> ScoreAsk:
    if kind == "minilm":
        from bench.cpu.bench_minilm import make_workload

        w = make_workload(Path(model.tokenizer.name_or_path), args.mix, args.items, 0)
        return ScoreAsk(query=w["query"], items=w["items"])
    from bench.scoring.bench_mis import label_ids
    from bench.scoring.bench_mis import make_workload as mis_workload

    labels = label_ids(Path(model.tokenizer.name_or_path))
    w = mis_workload(args.q, args.n, model.model.config.vocab_size, labels, 0)
    return ScoreAsk(query=w["query"], items=w["items"], label_token_ids=labels, apply_softmax=True,
                    multi_item_scoring=args.mis)


def executor_for(model: ScoringModel, buckets: str, simulate_ms: float | None) -> Executor:
    """The worker's executor, with graph buckets (the padded path on CPU) and a simulated device when asked."""
    graphs = None
    if buckets:
        sizes = [int(b) for b in buckets.split(",")]
        graphs = GraphRunner(model, LayoutKind.DENSE, sizes, max(sizes), 256)
    stream = None if simulate_ms is None else SimulatedStream(simulate_ms, model.hidden_size)
    return Executor(model, graphs=graphs, stream=stream)


def score_once(model: ScoringModel, ask: ScoreAsk, max_batch_tokens: int,
               executor: Executor | None = None) -> dict[str, Any]:
    """The request prepared as the server prepares it (tokenize → plan), then run in batches of ≤ max_batch_tokens
    (as the scheduler forms them for a request alone) through Executor.run: `score_now`."""
    stages: dict[str, Any] = {"tokenize+plan": 0.0, "inputs": 0.0, "forward": 0.0, "scoring": 0.0}
    batches: list[BatchStats] = []
    executor = executor or Executor(model)
    started = time.perf_counter()
    (job,) = scored(score_now(executor, [ask], Limits(max_batch_tokens=max_batch_tokens), max_batch_tokens,
                              batches.append))
    seconds = time.perf_counter() - started
    stages["inputs"] = sum(b.pack_seconds + b.copy_in_seconds for b in batches)
    stages["forward"] = sum(b.device_seconds for b in batches)
    stages["scoring"] = sum(b.heads_seconds + b.copy_out_seconds for b in batches)
    stages["tokenize+plan"] = seconds - stages["inputs"] - stages["forward"] - stages["scoring"]
    assert job.remaining == 0
    stages["batches"] = len(batches)
    stages["tokens"] = sum(b.tokens for b in batches)
    stages["scores"] = job.scores
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["minilm", "smollm2"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--mix", default="long")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--q", type=int, default=512)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--mis", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stages", action="store_true", help="only the stage timings, no profiler")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--graph-buckets", default="", help="comma-separated CUDA-graph buckets (the padded path)")
    parser.add_argument("--simulate-device-ms", type=float, help="a simulated device: ms per 8,192 tokens")
    parser.add_argument("--cache", type=Path, default=Path(__file__).resolve().parents[2] / ".cache" / "models")
    args = parser.parse_args()
    model = load(args.model, args.dtype, args.cache)
    ask = ask_for(args.model, model, args)
    if args.simulate_device_ms is not None:  # as a simulated worker runs its host: one thread for the CPU ops left
        torch.set_num_threads(1)
    executor = executor_for(model, args.graph_buckets, args.simulate_device_ms)
    score_once(model, ask, args.max_batch_tokens, executor)  # warm-up
    runs = [score_once(model, ask, args.max_batch_tokens, executor) for _ in range(args.reps)]
    for key in runs[0]:
        if key != "scores":
            print(f"{key:>14}: {median([r[key] for r in runs]):.4g}")
    if args.stages:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        score_once(model, ask, args.max_batch_tokens, executor)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                                             max_name_column_width=40))


if __name__ == "__main__":
    main()
