"""Multi-item attention alone, one bucket: the worker's Triton kernel (model/kernels/mis_attention.py) against its
compiled flex and FlashInfer's multi-item batch prefill.

    python bench/gpu/gpu_attention.py --out attention.json       # on a GPU (FlashInfer: flashinfer-python and nvcc)
    python bench/gpu/gpu_attention.py --cpu-dry-run              # CPU: layout, plan, the kernels and the reference

The batch is the sglang-mis shape packed into the 8,192-token bucket (4 × (120-token query, 10 items of 180
tokens, delimiters)), Qwen3-0.6B's heads (16 query, 8 K/V, dim 128), bfloat16. Every kernel gets the same q/k/v and
is compared with SDPA under the worker's dense mask (`token_allowed`); times are per forward (28 layers: one call
× 28, median of CUDA-event timings). FlashInfer runs the paged wrapper with page size 1 and the plan arguments of
`model/kernels/flashinfer_plan.py`; a missing flashinfer is reported, not fatal. On CPU the Triton kernel runs under
Triton's interpreter (TRITON_INTERPRET=1), or is reported missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "worker")]

import torch  # noqa: E402
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs  # noqa: E402
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool  # noqa: E402
from scorekeeper_worker.model.kernels import mis_attention  # noqa: E402
from scorekeeper_worker.model.kernels.attention import LayoutKind, token_allowed  # noqa: E402
from scorekeeper_worker.model.kernels.flashinfer_plan import flashinfer_plan  # noqa: E402
from scorekeeper_worker.model.kernels.flex import flex_block_mask  # noqa: E402

LAYERS = 28


def ms_per_forward(fn: Callable[[], object], device: torch.device, reps: int) -> float | None:
    fn()
    if device.type != "cuda":  # CPU: a check of the script, no timing
        return None
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times) * LAYERS, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", type=int, default=8192)
    parser.add_argument("--shape", default="120x10x180", help="query tokens x items x item tokens")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cpu-dry-run", action="store_true", help="CPU, a 512-token bucket of 24x3x30, float32")
    parser.add_argument("--out", type=Path, default=Path("gpu_attention.json"))
    args = parser.parse_args(argv)
    if args.cpu_dry_run:
        args.bucket, args.shape = 512, "24x3x30"
    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    dtype = torch.float32 if args.cpu_dry_run else torch.bfloat16
    query, items, item_len = (int(x) for x in args.shape.split("x"))
    unit_tokens = query + 1 + items * (item_len + 1)
    units = [PackUnit([5] * (query + 1), items=[[6] * (item_len + 1) for _ in range(items)], visible_prefix=query,
                      pools=[Pool(range(1), r)]) for r in range(max(1, args.bucket // unit_tokens))]
    live = len(units) * unit_tokens
    tokens = build_inputs(units, device, LayoutKind.FLEX, GraphShape(args.bucket, 8 * len(units))).layout.tokens
    assert tokens is not None
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(args.bucket, heads, 128, generator=generator, device=device, dtype=dtype)
               for heads in (16, 8, 8))
    index = torch.arange(args.bucket, device=device)
    mask = token_allowed(tokens, index[:, None], index[None, :], True, None)
    scale = 128 ** -0.5

    def heads_first(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)[None]

    reference = torch.nn.functional.scaled_dot_product_attention(
        heads_first(q).float(), heads_first(k).float(), heads_first(v).float(), attn_mask=mask, scale=scale,
        enable_gqa=True)[0].transpose(0, 1)[:live]
    report: dict[str, Any] = {"device": str(device), "bucket": args.bucket, "shape": args.shape, "live": live}
    block_mask = flex_block_mask(tokens, causal=True, window=None)
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_attention

    def run_flex() -> torch.Tensor:
        return flex(heads_first(q), heads_first(k), heads_first(v), block_mask=block_mask, scale=scale,
                    enable_gqa=True)[0].transpose(0, 1)

    out = run_flex()[:live].float()
    report["flex"] = {"ms_per_forward": ms_per_forward(run_flex, device, args.reps),
                      "max_abs_diff": (out - reference).abs().max().item()}
    if mis_attention.available() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        work_tokens = build_inputs(units, device, LayoutKind.TRITON, GraphShape(args.bucket, 8 * len(units),
                                                                                 work_block=mis_attention.BLOCK_M))
        rules = work_tokens.layout.tokens
        assert rules is not None and rules.work is not None and rules.work_count is not None
        work, count = rules.work, rules.work_count

        def run_kernel() -> torch.Tensor:
            return mis_attention.mis_attention(heads_first(q), heads_first(k), heads_first(v), work, count, True,
                                               scale)[0]

        out = run_kernel()[:live].float()
        report["triton"] = {"ms_per_forward": ms_per_forward(run_kernel, device, args.reps),
                            "max_abs_diff": (out - reference).abs().max().item()}
    else:
        report["triton"] = {"error": "Triton is not installed, or no GPU (and not TRITON_INTERPRET=1)"}
    plan = flashinfer_plan(tokens, live)
    report["plan"] = {"requests": plan.prefix_len_ptr.shape[0], "token_pos_in_items_len": plan.token_pos_in_items_len}
    try:
        import flashinfer

        workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(plan.qo_indptr.to(device), plan.kv_indptr.to(device), plan.kv_indices.to(device),
                     plan.kv_last_page_len.to(device), 16, 8, 128, 1, causal=True, sm_scale=scale,
                     q_data_type=dtype, kv_data_type=dtype, prefix_len_ptr=plan.prefix_len_ptr.to(device),
                     token_pos_in_items_ptr=plan.token_pos_in_items_ptr.to(device),
                     token_pos_in_items_len=plan.token_pos_in_items_len,
                     max_item_len_ptr=plan.max_item_len_ptr.to(device))
        pages = (k[:, None], v[:, None])  # [pages, page_size 1, kv heads, dim]

        def run_flashinfer() -> torch.Tensor:
            return wrapper.run(q, pages)

        out = run_flashinfer()[:live].float()
        report["flashinfer"] = {"version": flashinfer.__version__,
                                "ms_per_forward": ms_per_forward(run_flashinfer, device, args.reps),
                                "max_abs_diff": (out - reference).abs().max().item()}
    except Exception as error:  # absent, no nvcc for its JIT, or an API change: say which
        report["flashinfer"] = {"error": f"{type(error).__name__}: {error}"}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
