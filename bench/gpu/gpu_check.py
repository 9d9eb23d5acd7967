"""Every GPU check and timing of docs/gpu.md in one command, for the first machine that has an NVIDIA GPU.

    .venv/bin/python bench/gpu/gpu_check.py                                   # tiny test models, float32 and bfloat16
    .venv/bin/python bench/gpu/gpu_check.py --model /models/reranker --dtype bfloat16 --buckets 256,512,1024,2048
    .venv/bin/python bench/gpu/gpu_check.py --model .cache/models/qwen3-0.6b-geometry --dtype bfloat16 \
        --buckets 256,512,1024,2048,4096 --max-seqs 256 --mis-shapes 512x100,128x100,512x10
    .venv/bin/python bench/gpu/gpu_check.py --cpu-dry-run --quick             # the script itself, on CPU, capture off
    .venv/bin/python -m pytest -m cuda tests/worker/engine/runner/test_cuda.py   # the same checks as tests

For each model, dtype and graph layout (dense: `--attention-backend sdpa`; flex: FlexAttention through Triton;
triton: the multi-item kernel of model/kernels/mis_attention.py, where Triton is installed):
1. capture: every bucket, largest first, one memory pool; seconds and memory per bucket, failures;
2. replay equals eager for every bucket and batch kind (single-item, multi-item with delimiters, mixed; pooled
   hidden states = the rows compared), both against eager on the same static buffers and the unpadded row-block
   reference;
3. compiled FlexAttention and the Triton kernel equal the row-block reference (eager);
4. latency at small batches: graph (pack, copy into buffers, replay) against eager (pack, forward), medians;
5. copy overhead of pooled hidden states: pinned + non-blocking + CUDA events (`heads.copy_vectors`) against
   a plain `.cpu().tolist()`;
6. decoders: multi-item scoring throughput (bench/gpu/gpu_mis.py): items/s of MIS (eager, and replayed through each
   layout's graphs where a bucket fits) against single-item packing, and MIS rows equal to single-item rows.
Prints a summary, writes JSON (--out), exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "worker"), str(REPO / "tests" / "support"),
                 str(REPO / "tests" / "worker" / "engine" / "runner")]  # test_graph_shaped.batches_for

import torch  # noqa: E402
from scorekeeper_worker.library import (  # noqa: E402
    CopyStats,
    DType,
    GraphRunner,
    LayoutKind,
    PackUnit,
    Pool,
    ScoringModel,
    build_inputs,
    copy_vectors,
    load_model,
    pooled_rows,
)
from scorekeeper_worker.model.kernels import mis_attention  # noqa: E402

from bench.gpu.gpu_mis import mis_batch, mis_throughput, parse_shapes  # noqa: E402

TINY = ["qwen3-cls3", "gemma2-reward", "bert-embed"]  # GQA decoder; softcap + sliding layers; encoder, mean pooling
DELIMITER = 3
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}  # replay vs the row-block reference


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def environment(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    for package in ("triton", "flashinfer", "transformers"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # absent or broken: say so
            info[package] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    return info


def latency_batches(model: ScoringModel) -> dict[str, list[PackUnit]]:
    """Small batches, where launches dominate: the regime graphs are for."""

    def seqs(count: int, length: int) -> list[PackUnit]:
        return [PackUnit([11 + (i + j) % 100 for j in range(length)], position_start=model.position_start,
                         pools=[Pool(range(length - 1, length), i)]) for i in range(count)]

    batches = {"1x32": seqs(1, 32), "4x48": seqs(4, 48), "16x24": seqs(16, 24)}
    if model.is_decoder:
        batches["mis-48+8x16"] = [mis_batch(model, 48, 8, 15, DELIMITER)[0]]  # items of 15 tokens + delimiter
    return batches


def check_layout(model: ScoringModel, kind: LayoutKind, buckets: tuple[int, ...], max_seqs: int, reps: int,
                 capture: bool) -> tuple[dict[str, Any], GraphRunner]:
    from test_graph_shaped import batches_for

    device = model.device
    out: dict[str, Any] = {"layout": kind.value, "buckets": {}, "failures": []}
    failures: list[int] = []
    before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    started = time.perf_counter()
    runner = GraphRunner(model, kind, buckets, max_tokens=buckets[-1], max_seqs=max_seqs, capture=capture,
                         on_capture_failure=lambda: failures.append(1))
    runner.capture()
    out["capture_seconds"] = round(time.perf_counter() - started, 2)
    if device.type == "cuda":
        out["graph_memory_mib"] = round((torch.cuda.memory_allocated() - before) / 2**20, 1)
        out["max_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    out["capture_failures"] = len(failures)
    rtol, atol = TOLERANCE.get(model.dtype, (3e-2, 3e-2))
    with torch.inference_mode():
        for bucket in runner.buckets:
            entry: dict[str, Any] = {"captured": bucket.graph is not None, "disabled": bucket.disabled}
            out["buckets"][str(bucket.tokens)] = entry
            if bucket.disabled:
                out["failures"].append(f"bucket {bucket.tokens}: capture failed (see the log)")
                continue
            for name, units in batches_for(model, bucket.tokens, DELIMITER if model.is_decoder else None,
                                           buckets, max_seqs).items():
                batch = runner.load(bucket, units)
                live = len(batch.readouts)
                replayed = runner.forward(bucket)[:live].clone()
                same = pooled_rows(model, bucket.static)[:live]
                reference = pooled_rows(model, build_inputs(units, device))
                vs_same = (replayed - same).abs().max().item()
                vs_reference = (replayed - reference).abs().max().item()
                scale = max(1.0, reference.abs().max().item())
                ok = vs_same <= 1e-5 * scale and vs_reference <= atol + rtol * scale
                entry[name] = {"tokens": batch.num_tokens, "padding": batch.padding_tokens, "vs_same_buffers":
                               vs_same, "vs_reference": vs_reference, "ok": ok}
                if not ok:
                    out["failures"].append(f"bucket {bucket.tokens} {name}: replay differs ({vs_same:.3g} from "
                                           f"eager on the same buffers, {vs_reference:.3g} from the reference)")
        out["latency_ms"] = {}
        for name, units in latency_batches(model).items():
            bucket = runner.select(units)
            if bucket is None:
                continue

            def graph(units: list[PackUnit] = units, bucket: Any = bucket) -> torch.Tensor:
                runner.load(bucket, units)
                return runner.forward(bucket)

            def eager(units: list[PackUnit] = units) -> torch.Tensor:
                return pooled_rows(model, build_inputs(units, device, runner.eager_kind))

            graph_ms, eager_ms = median_ms(graph, device, reps), median_ms(eager, device, reps)
            out["latency_ms"][name] = {"bucket": bucket.tokens, "graph": round(graph_ms, 3),
                                       "eager": round(eager_ms, 3), "speedup": round(eager_ms / graph_ms, 2)}
    return out, runner


def check_kernel(model: ScoringModel, kind: LayoutKind) -> dict[str, Any]:
    """An eager batch through a token layout's kernel (flex, or the Triton kernel) against the row blocks."""
    from test_graph_shaped import batches_for

    units = batches_for(model, 512, DELIMITER if model.is_decoder else None, (256, 512))
    units = units["mixed" if model.is_decoder else "single"]
    with torch.inference_mode():
        flex = pooled_rows(model, build_inputs(units, model.device, kind))
        reference = pooled_rows(model, build_inputs(units, model.device))
    rtol, atol = TOLERANCE.get(model.dtype, (3e-2, 3e-2))
    error = (flex - reference).abs().max().item()
    return {"max_abs_diff": error, "ok": error <= atol + rtol * max(1.0, reference.abs().max().item())}


def _copied(rows: torch.Tensor) -> tuple[list[list[float]], float]:
    """Pooled vectors to Python floats the way a batch's heads send them back: (values, seconds counted)."""
    copy, copies = copy_vectors(rows), CopyStats()
    sync(rows.device)
    return copy.values(copies), copies.seconds


def check_copies(model: ScoringModel, reps: int) -> dict[str, Any]:
    device = model.device
    out: dict[str, Any] = {}
    for count in (1, 16, 256):
        # Not torch.randn: after a failed capture the CUDA generator can refuse every later draw.
        rows = (torch.arange(count * model.hidden_size, device=device, dtype=torch.float32) / 997).sin()
        rows = rows.view(count, model.hidden_size).to(model.dtype)
        measured = statistics.median(_copied(rows)[1] * 1000 for _ in range(reps))
        plain = median_ms(lambda rows=rows: rows.cpu().float().tolist(), device, reps)
        values_ok = _copied(rows)[0] == rows.float().cpu().tolist()
        out[str(count)] = {"helper_ms": round(measured, 4), "plain_cpu_tolist_ms": round(plain, 4),
                           "values_ok": values_ok}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", type=Path,
                        help="model directory (repeatable; default: tiny models)")
    parser.add_argument("--tiny", action="append", choices=TINY, help="repeatable; default: all three tiny models")
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16"],
                        help="repeatable; default float32 and bfloat16")
    parser.add_argument("--buckets", default="64,128,256,512,1024", help="comma-separated token buckets")
    parser.add_argument("--max-seqs", type=int, default=64)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--mis-shapes", default="512x100,128x100,512x10",
                        help="decoders: multi-item throughput shapes, query tokens x items (items of --item-len)")
    parser.add_argument("--item-len", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=8192, help="single-item forwards' token budget")
    parser.add_argument("--quick", action="store_true", help="few repetitions, float32 only, one tiny model")
    parser.add_argument("--cpu-dry-run", action="store_true", help="run on CPU with capture off (tests the script)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    args = parser.parse_args()

    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: nothing to check here (use --cpu-dry-run to exercise the script on CPU)")
        return 2
    buckets = tuple(int(b) for b in args.buckets.split(","))
    reps = 3 if args.quick else args.reps
    mis_shapes = parse_shapes("64x10" if args.quick else args.mis_shapes)
    dtypes = args.dtype or (["float32"] if args.quick or args.cpu_dry_run else ["float32", "bfloat16"])
    if args.model:
        models = [(str(path), path) for path in args.model]
    else:
        import tiny_models

        tiny_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        names = args.tiny or (TINY[:1] if args.quick else TINY)
        models = [(name, tiny_models.build(name, tiny_dir)) for name in names]

    report: dict[str, Any] = {"environment": environment(device), "buckets": buckets, "runs": []}
    kinds = [LayoutKind.DENSE, LayoutKind.FLEX]
    if mis_attention.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        kinds.append(LayoutKind.TRITON)
    failures: list[str] = []
    for name, path in models:
        for dtype in dtypes:
            label = f"{name} {dtype}"
            log(f"{label}: loading")
            run: dict[str, Any] = {"model": name, "dtype": dtype}
            report["runs"].append(run)
            model = None
            runners: dict[str, GraphRunner] = {}
            try:
                model = load_model(path, DType(dtype), device.type, name)
                for kind in kinds[1:]:
                    checked = run[f"{kind.value}_vs_sdpa"] = check_kernel(model, kind)
                    if not checked["ok"]:
                        failures.append(f"{label}: {kind.value} differs from sdpa ({checked['max_abs_diff']:.3g})")
                for kind in kinds:
                    log(f"{label}: {kind.value} graphs")
                    result, runners[kind.value] = check_layout(model, kind, buckets, args.max_seqs, reps,
                                                               capture=device.type == "cuda")
                    run[kind.value] = result
                    failures += [f"{label} {kind.value}: {f}" for f in result["failures"]]
                run["copies"] = check_copies(model, reps)
                failures += [f"{label}: pinned copy returned wrong values ({n} rows)"
                             for n, c in run["copies"].items() if not c["values_ok"]]
                if model.is_decoder:
                    log(f"{label}: multi-item throughput")
                    run["mis"] = mis_throughput(model, mis_shapes, args.item_len, DELIMITER, args.max_batch_tokens,
                                                runners, lambda fn: median_ms(fn, device, reps),
                                                TOLERANCE.get(model.dtype, (3e-2, 3e-2)))
                    failures += [f"{label}: multi-item rows differ from single-item rows at {shape} "
                                 f"({m['max_abs_diff']:.3g})" for shape, m in run["mis"].items() if not m["ok"]]
            except Exception as error:
                run["error"] = traceback.format_exc()
                failures.append(f"{label}: {type(error).__name__}: {error}")
            del model, runners  # the graphs' memory, before the next model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            report["failures"] = failures
            args.out.write_text(json.dumps(report, indent=2))  # after every run: a later crash keeps this one

    print(f"\n{json.dumps(report['environment'])}")
    for run in report["runs"]:
        for kind in ("dense", "flex", "triton"):
            result = run.get(kind)
            if not result:
                continue
            captured = sum(b["captured"] for b in result["buckets"].values())
            print(f"{run['model']} {run['dtype']} {kind}: {captured}/{len(result['buckets'])} buckets captured in "
                  f"{result['capture_seconds']} s, failures {result['capture_failures']}")
            for batch, t in result.get("latency_ms", {}).items():
                print(f"    {batch:>14} bucket {t['bucket']:>5}: graph {t['graph']:8.3f} ms  eager {t['eager']:8.3f} ms"
                      f"  ×{t['speedup']}")
        for count, c in run.get("copies", {}).items():
            print(f"    copy {count:>4} vectors: helper {c['helper_ms']} ms, plain {c['plain_cpu_tolist_ms']} ms")
        for shape, m in run.get("mis", {}).items():
            arms = "  ".join(f"{arm} {rate:,.0f}" for arm, rate in m["items_per_s"].items())
            print(f"    MIS {shape:>8} items/s: {arms}  (MIS/single ×{m['mis_over_single']}, "
                  f"|Δ| {m['max_abs_diff']:.2g})")
    print("\nFAILURES:\n  " + "\n  ".join(failures) if failures else "\nall checks passed")
    print(f"report: {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
