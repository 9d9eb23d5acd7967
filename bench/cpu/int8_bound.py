"""How fast int8 could make the worker at best, on this CPU (issue 23's int8 targets; docs/benchmarks.md "int8: the
bound").

int8 speeds up matrix products only. The float32 engine's time splits into its linear layers, its attention products
(score and value products, softmax) and the rest (norms, residual adds, gathers, copies). Per instruction set this
script measures, on bench_cpu.py's workloads (1 query × 200 documents, MiniLM cross-encoder for rerank,
all-MiniLM-L6-v2 for embed), as the worker runs them (fused oneDNN linears, its allocator thresholds and threads):

- that split, by torch.profiler's self time per operator over one request;
- the int8 rate of the model's own linear layers against their float32 rate, on packed token blocks of the worker's
  batch size: the fastest int8 kernel torch offers (oneDNN's `qlinear_pointwise`, int8 in and int8 out, the bias and
  GELU fused, so no separate quantize or dequantize pass; and FBGEMM's quantized linear) against the worker's fused
  oneDNN float32 linear;

and prints Amdahl's bound: the whole request's speed-up if the linear layers (and, second column, the attention
products as well, at the same rate) ran at that int8 rate with nothing added, and the rest stayed as it is. Any real
int8 (OpenVINO's included: it adds quantize steps and pads its blocks) stays below it. "avx2" runs the same in a
child process with oneDNN and FBGEMM capped to AVX2 (`ONEDNN_MAX_CPU_ISA`, `FBGEMM_ENABLE_INSTRUCTIONS`): the
int8 instructions of CPUs without AVX-512 VNNI or AVX-VNNI (byte products through `vpmaddubsw`).

    .venv/bin/python bench/cpu/int8_bound.py                      # native and avx2, embed and rerank, both mixes
    .venv/bin/python bench/cpu/int8_bound.py --isa native --tasks embed --mixes short
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

import torch
from scorekeeper_worker.library import (
    DType,
    FusedLinear,
    ScoreAsk,
    ScoringModel,
    fuse_linears,
    keep_freed_memory,
    load_model,
    minilm_path,
)
from scorekeeper_worker.model.dtypes import host_cpu_flags

from bench.harness.common import log, markdown_table, median

BATCH_TOKENS = 8192  # the worker's default --max-batch-tokens
ISA_ENV = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
                                  "ATEN_CPU_CAPABILITY": "avx2"}}
LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear")
X_SCALE, OUT_SCALE, ZERO_POINT = 0.02, 0.05, 128  # any values: int8 kernels take the same time whatever the scales
# Without int8 dot-product instructions (VNNI; or capped below them) u8·s8 products are summed in pairs in saturating
# 16 bits (`vpmaddubsw`): 255·127·2 overflows, 127·127·2 does not. There the activations use 7 bits, as FBGEMM's
# `reduce_range` does, so the kernels compute the layer exactly (to rounding) on every CPU; the time is the same.
REDUCED_RANGE = not host_cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}
X_LEVELS, X_ZERO_POINT = (128, 64) if REDUCED_RANGE else (256, 128)
ATTENTION_OPS = ("aten::bmm", "aten::baddbmm", "aten::_softmax", "flash_attention", "scaled_dot_product")


def _timed(call: Callable[[], object], reps: int) -> float:
    call()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return median(times)


def int8_kernels(module: FusedLinear, tokens: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The linear (and GELU) of a FusedLinear as int8 kernels: uint8 activations (scale X_SCALE, zero point
    X_ZERO_POINT, X_LEVELS levels) in, uint8 (OUT_SCALE, ZERO_POINT) out, weights int8 per output channel, the bias
    and GELU fused."""
    weight, bias = module.weight, module.bias
    scale = weight.abs().amax(1) / 127
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    q_weight = torch.round(weight / scale[:, None]).to(torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(q_weight, [tokens, weight.shape[1]])
    post, algorithm = ("gelu", "none") if module.gelu else ("none", "")
    kernels = {"oneDNN": lambda x: torch.ops.onednn.qlinear_pointwise(
        x, X_SCALE, X_ZERO_POINT, packed, scale, zeros, bias, OUT_SCALE, ZERO_POINT, torch.uint8, post, [], algorithm)}
    if not module.gelu:  # FBGEMM's quantized linear has no GELU epilogue
        with warnings.catch_warnings():  # quantized tensors are deprecated; FBGEMM's kernels are still torch's
            warnings.simplefilter("ignore", UserWarning)
            q_weight_tensor = torch.quantize_per_channel(weight, scale, zeros, 0, torch.qint8)
        fb_packed = torch.ops.quantized.linear_prepack(q_weight_tensor, bias)
        kernels["FBGEMM"] = lambda x: torch.ops.quantized.linear(
            torch._make_per_tensor_quantized_tensor(x, X_SCALE, X_ZERO_POINT), fb_packed, OUT_SCALE, ZERO_POINT
        ).int_repr()
    return kernels


def int8_rate_ratio(trunk: torch.nn.Module, tokens: int, reps: int) -> float:
    """Σ float32 time / Σ fastest-int8 time over every linear layer of the (fused) trunk's layers, on `tokens`
    packed rows (not the pooler's: it sees one row per sequence)."""
    float32_seconds = int8_seconds = 0.0
    for name, module in trunk.named_modules():
        if isinstance(module, FusedLinear) and not name.startswith("pooler"):
            x = torch.randn(tokens, module.in_features)
            q_x = torch.randint(0, X_LEVELS, x.shape, dtype=torch.uint8)
            float32_seconds += _timed(lambda m=module, x=x: m(x), reps)
            int8_seconds += min(_timed(lambda k=kernel, q=q_x: k(q), reps)
                                for kernel in int8_kernels(module, tokens).values())
    return float32_seconds / int8_seconds


def time_split(scoring: ScoringModel, workload: dict[str, Any]) -> dict[str, float]:
    """One request's float32 engine time (seconds) and the shares of linear layers and attention products."""
    from bench.cpu.profile_worker import score_once

    ask = ScoreAsk(query=workload["query"], items=workload["items"])
    seconds = _timed(lambda: score_once(scoring, ask, BATCH_TOKENS), 3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        score_once(scoring, ask, BATCH_TOKENS)
    shares = {"linear": 0.0, "attention": 0.0, "total": 0.0}
    for event in profile.key_averages():
        category = ("linear" if event.key in LINEAR_OPS
                    else "attention" if any(op in event.key for op in ATTENTION_OPS) else None)
        if category:
            shares[category] += event.self_cpu_time_total
        shares["total"] += event.self_cpu_time_total
    return {"seconds": seconds, "linear": shares["linear"] / shares["total"],
            "attention": shares["attention"] / shares["total"]}


def child(args: argparse.Namespace) -> None:
    """Measure under this process's instruction set; one JSON record per task × mix on stdout."""
    from bench.cpu.bench_cpu import cross_encoder_dir
    from bench.cpu.bench_minilm import make_workload

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    workloads = {mix: make_workload(minilm_path(), mix, args.items, 0) for mix in args.mixes.split(",")}
    with torch.inference_mode():
        for task in args.tasks.split(","):
            scoring = load_model(cross_encoder_dir() if task == "rerank" else minilm_path(), DType.FLOAT32, "cpu",
                                 task)
            fuse_linears(scoring.trunk)
            ratio = int8_rate_ratio(scoring.trunk, BATCH_TOKENS, args.reps)
            for mix, workload in workloads.items():
                split = time_split(scoring, workload)
                print(json.dumps({"task": task, "mix": mix, "ratio": ratio, **split}), flush=True)


def bound(share: float, ratio: float) -> float:
    """Amdahl: the whole speed-up when a `share` of the time runs `ratio` times faster and the rest unchanged."""
    return 1 / (1 - share + share / ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", default="native,avx2", help="comma-separated: native, avx2")
    parser.add_argument("--tasks", default="embed,rerank")
    parser.add_argument("--mixes", default="short,long")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5, help="timed calls per linear layer and kernel (median)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows = []
    for isa in args.isa.split(","):
        log(f"measuring with {isa} instructions")
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **ISA_ENV[isa]}  # the worker's OpenMP setting
        out = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=env, check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        target = 2.0 if isa == "avx2" else 3.0
        for record in map(json.loads, out.splitlines()):
            rows.append([isa, f"{record['task']} {record['mix']}", f"{record['seconds']:.3f}",
                         f"{record['linear']:.0%}", f"{record['attention']:.0%}", f"{record['ratio']:.2f}×",
                         f"{bound(record['linear'], record['ratio']):.2f}×",
                         f"{bound(record['linear'] + record['attention'], record['ratio']):.2f}×", f"≥ {target:g}×"])
    print(markdown_table(["instructions", "task, mix", "float32 engine s/request", "linear layers",
                          "attention products", "int8 / float32 linear rate", "bound: int8 linear layers",
                          "bound: int8 linear + attention", "issue 23 target"], rows))


if __name__ == "__main__":
    main()
