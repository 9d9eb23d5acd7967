"""Where one graph bucket's forward spends its time: GPU time per category, kernel count, FlexAttention tiles.

    python bench/gpu/gpu_profile.py --model DIR --dtype bfloat16 --bucket 8192 --arms plain,compiled --out profile.json
    python bench/gpu/gpu_profile.py --cpu-dry-run          # tiny Qwen3 on CPU: exercises every step of the script

The batch is SGLang's scoring benchmark shape (bench_load's sglang-mis preset: a 120-token query, 10 items of 180
tokens, delimiters) repeated as often as it fits the bucket, run the worker's own way (`GraphRunner`, `build_inputs`,
`pooled_rows` through `scorekeeper_worker.library`). Per arm (`plain`: today's layers; `compiled`: `--compile`'s
regional compilation) it captures the bucket, times the replay (median), profiles a few replays and prints:

- GPU time per category: GEMM, attention, norms, rotary, activation/adds/copies (anything else); kernels per pass;
- tiles of the flex block mask: visited (listed) tiles, full and partial ones, and the share of computed pairs
  that the mask allows (`allowed pairs / (visited tiles × 128²)`);
- the attention work per pass of flex and of the Triton kernel (`--layout triton`, model/kernels/mis_attention.py):
  query-key pairs computed per head and the FLOP of the two products (pairs × 4 × head dim × heads × layers), beside
  the pairs the mask allows. `--cpu-dry-run` prints them for the real bucket's shape too (`--count-bucket`).

Categories: an annotated eager pass of the same buffers (forward hooks: norm modules, linear layers; the model's
`apply_rotary_pos_emb`; the attention function) labels each kernel by its innermost scope; when the replay runs the
same kernels in the same order the labels carry over, else kernels are classified by name (compiled kernels name
their fused ops: `triton_red_fused_..._rsqrt` is a norm). The report says which. On CPU (`--cpu-dry-run`) the
"kernels" are the leaf aten ops of the annotated pass and times are CPU times: a test of the script, not a profile.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "worker"), str(REPO / "tests" / "support")]

import torch  # noqa: E402
from scorekeeper_worker.engine.runner import token_packing  # noqa: E402
from scorekeeper_worker.engine.runner.packing import GraphShape  # noqa: E402
from scorekeeper_worker.library import (  # noqa: E402
    CompiledTrunk,
    DType,
    GraphRunner,
    LayoutKind,
    ScoringModel,
    block_tables,
    compile_mode,
    load_model,
    pooled_rows,
    token_allowed,
)
from scorekeeper_worker.model.kernels import mis_attention  # noqa: E402

from bench.gpu.gpu_check import median_ms, sync  # noqa: E402
from bench.gpu.gpu_mis import mis_batch  # noqa: E402

CATEGORIES = ("gemm", "attention", "norms", "rotary", "other")  # other: activation, adds, copies
BY_NAME = [  # first match wins; compiled kernels are named after the ops they fuse
    ("attention", re.compile(r"flex|attention|attn|fmha|flash|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|_mm_|fused_mm|addmm|\bmm\b|aten::mm|aten::addmm"
                        r"|aten::linear|onednn", re.I)),
    ("rotary", re.compile(r"rotary|rope|neg.*cat|cat.*neg", re.I)),
    ("norms", re.compile(r"rsqrt|norm|mean.*pow|pow.*mean", re.I)),
]
DELIMITER = 3


def by_name(kernel: str) -> str:
    return next((category for category, pattern in BY_NAME if pattern.search(kernel)), "other")


@contextmanager
def scopes(model: ScoringModel) -> Iterator[None]:
    """record_function ranges named `sk.<category>` around norm modules, linear layers, the rotary embedding and the
    attention function, for one annotated pass."""
    from transformers import AttentionInterface

    stack: list[Any] = []
    handles = []

    def enter(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            stack.append(torch.autograd.profiler.record_function(name).__enter__())
        return hook

    def leave(*_: Any) -> None:
        stack.pop().__exit__(None, None, None)

    for module in model.trunk.modules():
        kind = type(module).__name__
        category = "norms" if "Norm" in kind else "gemm" if isinstance(module, torch.nn.Linear) or "Linear" in kind \
            else None
        if category is not None:
            handles += [module.register_forward_pre_hook(enter(f"sk.{category}")), module.register_forward_hook(leave)]

    def wrapped(category: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with torch.autograd.profiler.record_function(f"sk.{category}"):
                return fn(*args, **kwargs)
        return call

    layers = [m for m in model.trunk.modules() if isinstance(m, torch.nn.ModuleList)]
    namespace = sys.modules[type(layers[0][0]).__module__] if layers and len(layers[0]) else None
    rotary = getattr(namespace, "apply_rotary_pos_emb", None)
    from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME

    attention = AttentionInterface._global_mapping[ATTENTION_NAME]
    if rotary is not None:
        namespace.apply_rotary_pos_emb = wrapped("rotary", rotary)  # type: ignore[union-attr]
    AttentionInterface.register(ATTENTION_NAME, wrapped("attention", attention))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if rotary is not None:
            namespace.apply_rotary_pos_emb = rotary  # type: ignore[union-attr]
        AttentionInterface.register(ATTENTION_NAME, attention)


def _innermost_scope(event: Any) -> str:
    parent = event
    while parent is not None:
        if parent.name.startswith("sk."):
            return parent.name.removeprefix("sk.")
        parent = parent.cpu_parent
    return "other"


def profile(fn: Callable[[], object], device: torch.device, passes: int) -> Any:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    fn()
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(passes):
            fn()
        sync(device)
    return prof


def annotated_kernels(model: ScoringModel, runner: GraphRunner, mode: str | None,
                      device: torch.device) -> list[tuple[str, str, float]]:
    """(kernel, category, microseconds) of one eager pass on the bucket's buffers, in launch order. On CPU the leaf
    aten ops and their CPU time."""
    bucket = runner.buckets[0]
    with scopes(model), compile_mode(mode):
        prof = profile(lambda: pooled_rows(model, bucket.static), device, 1)
    rows: list[tuple[float, str, str, float]] = []
    for event in prof.events():
        if device.type == "cuda":
            for kernel in event.kernels:
                rows.append((event.time_range.start, kernel.name, _innermost_scope(event), kernel.duration))
        elif event.name.startswith("aten::") and not event.cpu_children:
            rows.append((event.time_range.start, event.name, _innermost_scope(event), event.self_cpu_time_total))
    return [(name, category, us) for _, name, category, us in sorted(rows, key=lambda r: r[0])]


def replay_kernels(runner: GraphRunner, device: torch.device, passes: int) -> list[tuple[str, float]]:
    bucket = runner.buckets[0]
    prof = profile(lambda: runner.forward(bucket), device, passes)
    kernels = [e for e in prof.events() if str(e.device_type).endswith("CUDA")]
    kernels.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in kernels]


def categories(model: ScoringModel, runner: GraphRunner, mode: str | None, device: torch.device,
               passes: int) -> dict[str, Any]:
    if device.type == "cuda" and mode is not None:
        # Compiled layers: hooks added now would change what dynamo guards on (a recompile inside the profile), and
        # their kernels fuse several categories anyway, so they are classified by name.
        kernels = replay_kernels(runner, device, passes)
        labels, join = [by_name(n) for n, _ in kernels], "by kernel name (compiled)"
        annotated = []
    else:
        annotated = annotated_kernels(model, runner, mode, device)
    if annotated and device.type != "cuda":
        kernels, labels, join = [(n, us) for n, _, us in annotated], [c for _, c, _ in annotated], "annotated (CPU)"
        passes = 1
    elif annotated:
        kernels = replay_kernels(runner, device, passes)
        names = [n for n, _ in kernels]
        if names == [n for n, _, _ in annotated] * passes:
            labels, join = [c for _, c, _ in annotated] * passes, "positional (replay = annotated pass)"
        else:
            labels, join = [by_name(n) for n in names], "by kernel name"
    per = {category: 0.0 for category in CATEGORIES}
    for (_, us), category in zip(kernels, labels, strict=True):
        per[category] += us / 1000 / passes
    return {"ms_per_category": {k: round(v, 3) for k, v in per.items()}, "kernels_per_pass": len(kernels) // passes,
            "classified": join}


def tile_statistics(model: ScoringModel, runner: GraphRunner) -> dict[str, Any]:
    tokens = runner.buckets[0].static.layout.tokens
    assert tokens is not None
    causal = model.is_decoder
    _, partial, full = block_tables(tokens, causal, None)
    length = tokens.segment.shape[0]
    index = torch.arange(length, device=tokens.segment.device)
    allowed = sum(int(token_allowed(tokens, index[q:q + 512, None], index[None, :], causal, None).sum())
                  for q in range(0, length, 512))
    visited = int((partial | full).sum())
    return {"visited": visited, "full": int(full.sum()), "partial": int(partial.sum()),
            "tiles_in_bucket": partial.shape[0] * (partial.shape[0] + 1) // 2 if causal else partial.numel(),
            "allowed_pairs": allowed, "allowed_share": round(allowed / max(1, visited * 128 * 128), 4)}


def attention_work(units: list[Any], bucket: int, causal: bool, head_dim: int, heads: int, layers: int,
                   tiles: dict[str, Any]) -> dict[str, Any]:
    """Pairs computed per head and FLOP per pass: flex (visited 128×128 tiles) and the Triton kernel (its work list's
    whole tiles), beside the pairs the mask allows."""
    arrays = token_packing.pack(units, GraphShape(bucket, sum(len(u.pools) for u in units),
                                                  work_block=mis_attention.BLOCK_M))
    assert arrays.work is not None
    kernel = mis_attention.computed_pairs(arrays.work[:arrays.work_live], causal)
    flex = tiles["visited"] * 128 * 128

    def tflop(pairs: int) -> float:
        return round(pairs * 4 * head_dim * heads * layers / 1e12, 3)

    return {"flex_pairs_per_head": flex, "kernel_pairs_per_head": kernel, "allowed_pairs_per_head":
            tiles["allowed_pairs"], "flex_tflop": tflop(flex), "kernel_tflop": tflop(kernel),
            "exact_tflop": tflop(tiles["allowed_pairs"]), "geometry": [head_dim, heads, layers]}


def run_arm(model: ScoringModel, arm: str, kind: LayoutKind, bucket: int, shape: tuple[int, int, int],
            reps: int) -> dict[str, Any]:
    query, items, item_len = shape
    unit = mis_batch(model, query, items, item_len, DELIMITER)[0]
    requests = max(1, bucket // unit.num_tokens)
    units = [mis_batch(model, query, items, item_len, DELIMITER)[0] for _ in range(requests)]
    compiler = CompiledTrunk(model.trunk) if arm == "compiled" else None
    runner = GraphRunner(model, kind, [bucket], bucket, requests * items, compiler=compiler)
    started = time.perf_counter()
    runner.capture()
    capture_s = time.perf_counter() - started
    target = runner.buckets[0]
    if target.disabled:
        return {"arm": arm, "error": "capture failed (see the log)"}
    runner.load(target, units)
    if runner.compiler is not None and runner.compiler.mode_for(f"the {bucket}-token bucket", True) is None:
        return {"arm": arm, "error": f"compile failed: {runner.compiler.disabled}"}
    device = model.device
    result: dict[str, Any] = {
        "arm": arm, "requests": requests, "live_tokens": requests * unit.num_tokens, "bucket": bucket,
        "capture_s": round(capture_s, 2), "compile_s": dict(compiler.compiled) if compiler else {},
        "graph": target.graph is not None,
        "ms_per_pass": round(median_ms(lambda: runner.forward(target), device, reps), 3),
    }
    mode = None if compiler is None else "static"
    result |= categories(model, runner, mode, device, passes=3 if device.type == "cuda" else 1)
    return result


def work_lines(work: dict[str, Any], bucket: int) -> list[str]:
    head_dim, heads, layers = work["geometry"]
    return [f"\nattention work per pass, {bucket}-token bucket ({heads} heads of {head_dim}, {layers} layers):",
            "| | pairs per head | TFLOP per pass |", "| --- | --- | --- |",
            f"| flex, 128×128 tiles | {work['flex_pairs_per_head']:,} | {work['flex_tflop']} |",
            f"| Triton kernel, {mis_attention.BLOCK_M}-query blocks, {mis_attention.BLOCK_N}-key tiles | "
            f"{work['kernel_pairs_per_head']:,} | {work['kernel_tflop']} |",
            f"| allowed by the mask | {work['allowed_pairs_per_head']:,} | {work['exact_tflop']} |"]


def table(arms: list[dict[str, Any]], tiles: dict[str, Any]) -> str:
    ok = [a for a in arms if "error" not in a]
    lines = ["| | " + " | ".join(a["arm"] for a in ok) + " |", "| --- |" + " --- |" * len(ok),
             "| whole pass (ms, median) | " + " | ".join(str(a["ms_per_pass"]) for a in ok) + " |",
             "| kernels per pass | " + " | ".join(str(a["kernels_per_pass"]) for a in ok) + " |"]
    for category in CATEGORIES:
        label = "activation, adds, copies" if category == "other" else category
        lines.append(f"| {label} | " + " | ".join(str(a["ms_per_category"][category]) for a in ok) + " |")
    lines.append(f"\ntiles: {tiles['visited']} visited ({tiles['full']} full, {tiles['partial']} partial) of "
                 f"{tiles['tiles_in_bucket']}; the mask allows {tiles['allowed_share']:.1%} of the pairs they compute")
    return "\n".join(lines + [f"{a['arm']}: {a['error']}" for a in arms if "error" in a])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny Qwen3)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--bucket", type=int, default=8192)
    parser.add_argument("--shape", default="120x10x180", help="query tokens x items x item tokens")
    parser.add_argument("--layout", choices=["flex", "dense", "triton"], default="flex")
    parser.add_argument("--count-bucket", type=int, default=8192, help="--cpu-dry-run: also count the attention work "
                        "of this bucket with the real shape and the Qwen3-0.6B geometry (no forward)")
    parser.add_argument("--arms", default="plain,compiled", help="plain, compiled (comma-separated)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="CPU, tiny model, float32, a 512-token bucket of 24x3x30, plain arm: tests the script")
    parser.add_argument("--out", type=Path, default=Path("gpu_profile.json"))
    args = parser.parse_args(argv)
    if args.cpu_dry_run:
        args.dtype, args.bucket, args.shape, args.reps = "float32", 512, "24x3x30", 2
        args.arms = args.arms if "--arms" in (argv or sys.argv) else "plain"
    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-dry-run to exercise the script on CPU)", file=sys.stderr)
        return 2
    path = args.model
    if path is None:
        import tiny_models

        path = tiny_models.build("qwen3-cls3", Path(tempfile.mkdtemp(prefix="gpu-profile-")))
    query, items, item_len = (int(x) for x in args.shape.split("x"))
    model = load_model(path, DType(args.dtype), device.type, path.name)
    kind = LayoutKind(args.layout)
    with torch.inference_mode():
        arms = [run_arm(model, arm, kind, args.bucket, (query, items, item_len), args.reps)
                for arm in args.arms.split(",") if arm]
        runner = GraphRunner(model, kind, [args.bucket], args.bucket, max(1, args.bucket // 8))
        units = [mis_batch(model, query, items, item_len, DELIMITER)[0]
                 for _ in range(max(1, args.bucket // (query + 1 + items * (item_len + 1))))]
        runner.load(runner.buckets[0], units)
        tiles = tile_statistics(model, runner)
        config = model.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        work = {str(args.bucket): attention_work(units, args.bucket, model.is_decoder, head_dim,
                                                 config.num_attention_heads, config.num_hidden_layers, tiles)}
        if args.cpu_dry_run and args.count_bucket:  # the real shape, Qwen3-0.6B's geometry: counts only
            flex = GraphRunner(model, LayoutKind.FLEX, [args.count_bucket], args.count_bucket, args.count_bucket // 8)
            real = [mis_batch(model, 120, 10, 180, DELIMITER)[0] for _ in range(4)]
            flex.load(flex.buckets[0], real)
            work[str(args.count_bucket)] = attention_work(real, args.count_bucket, True, 128, 16, 28,
                                                          tile_statistics(model, flex))
    report = {"model": str(path), "dtype": args.dtype, "device": str(device), "layout": args.layout,
              "shape": args.shape, "arms": arms, "tiles": tiles, "attention_work": work}
    args.out.write_text(json.dumps(report, indent=2))
    print(table(arms, tiles))
    for bucket, counted in work.items():
        print("\n".join(work_lines(counted, int(bucket))))
    return 1 if any("error" in a for a in arms) else 0


if __name__ == "__main__":
    sys.exit(main())
