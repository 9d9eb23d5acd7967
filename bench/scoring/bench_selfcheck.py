"""Start-up self-check cost: what the check adds to a worker's start, measured where start-up pays it.

Each repetition is a fresh Python process (the first forward of a process pays lazy initialisation, as a starting
worker does) that loads the model, builds the executor and runs `selfcheck.run` once, timing the engine pass
(which doubles as the warm-up, so it is paid even with --no-self-check) and the reference pass (what the check
adds), then for a causal LM the decision probe (`decision_selfcheck.run`, engine and reference, as a worker with
--multi-item-scoring runs it), in wall time and in CPU time of the process (all of it). On a shared machine wall time
grows with other load; CPU time does not (much), so both are reported, as medians over the repetitions.

    .venv/bin/python bench/scoring/bench_selfcheck.py   # MiniLM (the default model), float32, 5 repetitions
    .venv/bin/python bench/scoring/bench_selfcheck.py --model PATH --dtype bfloat16 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import child_env, log, machine_note, markdown_table, median, set_threads

CHILD = """
import json, sys, time
from pathlib import Path
from scorekeeper_worker.library import DType, Executor, load_model, selfcheck
model = load_model(Path(sys.argv[1]), DType(sys.argv[2]), "cpu", "bench")
executor = Executor(model)
wall, cpu = time.perf_counter(), time.process_time()
result = selfcheck.run(model, executor, check=True, max_batch_tokens=8192, max_items=4096, multi_item=False,
                       delimiter=None)
decision = 0.0
if model.kind.value == "causal_lm":  # the decision probe, as a worker with --multi-item-scoring runs it
    from scorekeeper_worker.library import decision_selfcheck, resolve_decision_template
    started = time.perf_counter()
    decision_selfcheck.run(model, executor, resolve_decision_template(model.tokenizer, None), True)
    decision = time.perf_counter() - started
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "engine": result.engine_seconds, "reference": result.reference_seconds, "decision": decision,
                  "deviation": result.deviation, "tolerance": result.tolerance, "sequences": result.sequences,
                  "tokens": result.tokens}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="OMP/MKL threads per process")
    args = parser.parse_args()
    set_threads(args.threads)
    if args.model is None:
        from scorekeeper_worker.library import minilm_path

        args.model = minilm_path()
    runs = []
    for number in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.model), args.dtype], env=child_env(),
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        log(f"run {number + 1}/{args.repeat}: {runs[-1]}")
    first = runs[0]
    rows = [["/".join(args.model.parts[-2:]), args.dtype, str(first["sequences"]), str(first["tokens"]),
             f"{median([r['engine'] for r in runs]):.3f}", f"{median([r['reference'] for r in runs]):.3f}",
             f"{median([r['decision'] for r in runs]):.3f}",
             f"{median([r['wall'] for r in runs]):.3f}", f"{max(r['wall'] for r in runs):.3f}",
             f"{median([r['cpu'] for r in runs]):.3f}", f"{max(r['deviation'] for r in runs):.2g}",
             f"{first['tolerance']:g}"]]
    print(markdown_table(["model", "dtype", "sequences", "tokens", "engine s", "reference s", "decision s",
                          "total wall s", "max wall s", "CPU s", "deviation", "tolerance"], rows))
    print(f"\n{args.repeat} fresh processes; medians. {machine_note()}")


if __name__ == "__main__":
    main()
