"""The floor under any all-MiniLM-L6-v2 server on this machine: the time of its linear layers alone.

Every system in bench_minilm.py must run each token through the same dense layers (Q, K, V, attention output and
the two MLP matrices of all layers), whatever it does about padding and attention. This script times exactly
those matrix products with the model's real weights on packed token blocks (no padding, no attention, no
activations), at the thread count the benchmark uses, and prints that floor per mix. Given the JSON records of a
bench_minilm.py run, it also prints the most any server could gain on the best peer in that run while keeping the
same GEMM kernel: best peer seconds / floor.

    .venv/bin/python bench/gemm_floor.py
    .venv/bin/python bench/gemm_floor.py --results minilm.json     # with the ceiling against a benchmark run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_minilm import MIXES, make_workload
from common import median


def linear_layers(model_dir: Path, dtype: torch.dtype) -> list[torch.nn.Linear]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=dtype)
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "pooler" not in name]


@torch.inference_mode()
def floor_seconds(layers: list[torch.nn.Linear], tokens: int, block: int, reps: int) -> float:
    """Median time of all linear layers over `tokens` tokens, in blocks of at most `block` tokens."""
    sizes = [block] * (tokens // block) + ([tokens % block] if tokens % block else [])
    inputs = {(n, layer.in_features): torch.randn(n, layer.in_features, dtype=layer.weight.dtype)
              for n in set(sizes) for layer in layers}

    def once() -> float:
        started = time.perf_counter()
        for n in sizes:
            for layer in layers:
                layer(inputs[(n, layer.in_features)])
        return time.perf_counter() - started

    once()
    return median([once() for _ in range(reps)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--blocks", default="1024,4096,8192", help="token block sizes to try; the fastest counts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", type=Path, help="JSON records written by bench_minilm.py --json")
    args = parser.parse_args()
    from scorekeeper_worker.library import minilm_path

    model_dir = minilm_path()
    layers = linear_layers(model_dir, getattr(torch, args.dtype))
    macs_per_token = sum(layer.in_features * layer.out_features for layer in layers)
    records: list[dict[str, Any]] = json.loads(args.results.read_text()) if args.results else []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"{len(layers)} linear layers, {2 * macs_per_token / 1e6:.1f} MFLOP per token\n")
    print("| mix | tokens | GFLOP | floor s (best block) | GFLOP/s | best peer s | ceiling: best peer / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mix in MIXES:
        tokens = make_workload(model_dir, mix, 200, 0)["tokens"]
        seconds = min(floor_seconds(layers, tokens, int(b), args.reps) for b in args.blocks.split(","))
        flops = 2 * macs_per_token * tokens
        peers = [median(r["times"]) for r in records
                 if r["mix"] == mix and r["dtype"] == args.dtype and r["system"] != "scorekeeper" and r.get("times")]
        best = f"{min(peers):.3f} | {min(peers) / seconds:.2f}×" if peers else "– | –"
        print(f"| {mix} | {tokens} | {flops / 1e9:.1f} | {seconds:.3f} | {flops / seconds / 1e9:.0f} | {best} |")


if __name__ == "__main__":
    main()
