"""Profile the worker's scoring path in-process (no HTTP): where the time of one request goes.

    .venv/bin/python bench/profile_worker.py minilm --mix long            # torch.profiler op table
    .venv/bin/python bench/profile_worker.py smollm2 --q 512 --n 100 --mis
    .venv/bin/python bench/profile_worker.py minilm --mix long --stages   # wall time per stage, no profiler

It drives the same objects as the server (planning → Executor.run, the model thread's work) on the workloads of
bench_minilm.py / bench_mis.py, after a warm-up, and prints the top operators by self CPU time (torch.profiler) and
the executor's own stage split (inputs / forward / scoring).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import median, token_batches


def load(kind: str, dtype: str, cache: Path) -> Any:
    from scorekeeper_worker.base.config import DType
    from scorekeeper_worker.model.files import minilm_path, prepare_smollm2
    from scorekeeper_worker.model.loader import load_model

    path = minilm_path() if kind == "minilm" else Path(prepare_smollm2(cache))
    return load_model(path, DType(dtype), "cpu", kind)


def request_for(kind: str, model: Any, args: argparse.Namespace) -> Any:
    from scorekeeper_worker.api.wire.score import ScoreRequest

    if kind == "minilm":
        from bench_minilm import make_workload

        w = make_workload(Path(model.tokenizer.name_or_path), args.mix, args.items, 0)
        return ScoreRequest(query=w["query"], items=w["items"])
    from bench_mis import label_ids
    from bench_mis import make_workload as mis_workload

    labels = label_ids(Path(model.tokenizer.name_or_path))
    w = mis_workload(args.q, args.n, model.model.config.vocab_size, labels, 0)
    return ScoreRequest(query=w["query"], items=w["items"], label_token_ids=labels, apply_softmax=True,
                        multi_item_scoring=args.mis)


def score_once(model: Any, request: Any, mis: bool, max_batch_tokens: int) -> dict[str, float]:
    """tokenize → plan → batches of ≤ max_batch_tokens (as the scheduler forms them) → Executor.run."""
    from scorekeeper_worker.engine.queue.jobs import ScoreJob
    from scorekeeper_worker.engine.runner.executor import Executor
    from scorekeeper_worker.planning.planner import plan, tokenize
    from scorekeeper_worker.serving.service import label_lists

    loop = asyncio.new_event_loop()
    stages = {"tokenize+plan": 0.0, "inputs": 0.0, "forward": 0.0, "scoring": 0.0}
    started = time.perf_counter()
    tokens = tokenize(model, request)
    items = request.item_list
    job = ScoreJob(num_items=len(items), apply_softmax=request.apply_softmax, temperature=1.0,
                   labels=label_lists(model, request, len(items)), want_pooled=False, prompt_tokens=0,
                   multi_item=False, future=loop.create_future(), loop=loop)
    p = plan(model, request, tokens, job, mis and model.is_decoder, max_batch_tokens, None)
    job.remaining = sum(len(u.pools) for u in p.units)
    stages["tokenize+plan"] = time.perf_counter() - started
    executor = Executor(model)
    batches = token_batches(p.units, max_batch_tokens)
    for b in batches:
        _, stats = executor.run(b)
        stages["inputs"] += stats.inputs_seconds
        stages["forward"] += stats.forward_seconds
        stages["scoring"] += stats.scoring_seconds
    assert job.remaining == 0
    stages["batches"] = len(batches)
    stages["tokens"] = sum(u.num_tokens for u in p.units)
    loop.close()
    stages["scores"] = job.scores  # type: ignore[assignment]
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
    parser.add_argument("--cache", type=Path, default=Path(__file__).resolve().parent.parent / ".cache" / "models")
    args = parser.parse_args()
    model = load(args.model, args.dtype, args.cache)
    request = request_for(args.model, model, args)
    score_once(model, request, args.mis, args.max_batch_tokens)  # warm-up
    runs = [score_once(model, request, args.mis, args.max_batch_tokens) for _ in range(args.reps)]
    for key in runs[0]:
        if key != "scores":
            print(f"{key:>14}: {median([r[key] for r in runs]):.4g}")
    if args.stages:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        score_once(model, request, args.mis, args.max_batch_tokens)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                                             max_name_column_width=40))


if __name__ == "__main__":
    main()
