"""The floor under any all-MiniLM-L6-v2 server on this machine: the time of the matrix products it cannot skip.

Every server must run each token through the same dense layers (Q, K, V, attention output and the two MLP matrices
of every layer), whatever it does about padding and attention: an embedding (mean pooling) needs every token to the
end; a cross-encoder reads one token per sequence, so after the last layer's keys and values only those rows need
the rest of the last layer (the worker does that much; it is the least any server can do). This script times exactly
those products with the model's real weights on packed token blocks (no padding, no attention, no activations), with
the faster of torch's `nn.Linear` (MKL) and the worker's prepacked oneDNN linear, at the benchmark's thread count. It
adds the attention products (scores and values, each sequence alone) as if they ran at the linear layers' rate,
which no kernel for 32-wide heads does, and the norms and softmax every forward also runs, with torch's kernels
(`rest_seconds`). Given the JSON records of a bench_cpu.py or bench_minilm.py run, it prints the most any server
using these kernels could gain on the best peer of that run (best peer seconds / floor), and what a ratio of 1.15×
would leave for everything else (tokenization, copies, HTTP, the kernels' own losses). The machine's speed moves
between minutes on a shared VM: `bench_cpu.py --systems …,floor` times the same floor in the benchmark's own rounds.

    .venv/bin/python bench/cpu/gemm_floor.py
    .venv/bin/python bench/cpu/gemm_floor.py --results run.json     # with the ceiling against a benchmark run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

import torch

from bench.cpu.bench_minilm import MIXES, make_workload
from bench.harness.common import markdown_table, median


def linear_layers(model_dir: Path, dtype: torch.dtype) -> list[torch.nn.Linear]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=dtype)
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "pooler" not in name]


@torch.inference_mode()
def floor_seconds(layers: list[torch.nn.Module], tokens: int, block: int, reps: int) -> float:
    """Median time of all linear layers over `tokens` tokens, in blocks of at most `block` tokens."""
    sizes = [block] * (tokens // block) + ([tokens % block] if tokens % block else [])
    inputs = {(n, layer.in_features): torch.randn(n, layer.in_features, dtype=layer.bias.dtype)
              for n in set(sizes) for layer in layers}

    def once() -> float:
        started = time.perf_counter()
        for n in sizes:
            for layer in layers:
                layer(inputs[(n, layer.in_features)])
        return time.perf_counter() - started

    once()
    return median([once() for _ in range(reps)])


TARGET = 1.15  # issue 37: float32 at least 1.15× the best peer
FLOOR = "floor"  # bench_cpu.py's system name for the floor (peers.FloorPeer): never a peer
LAYER_MATRICES = 6  # query, key, value, attention output, MLP in, MLP out


@dataclass(frozen=True)
class Work:
    """What one request of a task needs at least: sequence lengths, and whether only the first token is read."""

    lengths: list[int]
    first_token_only: bool

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


def work_of(task: str, workload: dict[str, Any]) -> Work:
    """embed: the query and each document alone; rerank: `[CLS] query [SEP] document [SEP]` per document."""
    query, items = workload["lengths"][0], workload["lengths"][1:]
    if task == "rerank":
        return Work([query + n - 1 for n in items], first_token_only=True)
    return Work(workload["lengths"], first_token_only=False)


def split_tail(layers: list[torch.nn.Module], work: Work) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """(layers over every token, layers over one row per sequence): where only the first token is read, the last
    layer's query, output and MLP matrices need those rows only."""
    if not work.first_token_only:
        return layers, []
    cut = len(layers) - LAYER_MATRICES
    tail = {cut, cut + 3, cut + 4, cut + 5}
    return [m for i, m in enumerate(layers) if i not in tail], [m for i, m in enumerate(layers) if i in tail]


def linear_seconds(kernels: list[list[torch.nn.Module]], work: Work, blocks: list[int], reps: int) -> float:
    """The linear layers' floor (`split_tail`); the fastest kernel and block size count."""
    best = float("inf")
    for layers in kernels:
        whole, tail = split_tail(layers, work)
        for block in blocks:
            seconds = floor_seconds(whole, work.tokens, block, reps)
            if tail:
                seconds += floor_seconds(tail, len(work.lengths), block, reps)
            best = min(best, seconds)
    return best


def attention_flop(work: Work, hidden: int, layers: int) -> int:
    """Score and value products of every sequence alone (2 × 2·n²·hidden per layer; the last layer's queries are
    the first tokens only where only they are read)."""
    full = sum(4 * n * n * hidden for n in work.lengths)
    last = sum(4 * n * hidden for n in work.lengths) if work.first_token_only else full
    return (layers - 1) * full + last


@torch.inference_mode()
def rest_seconds(work: Work, hidden: int, heads: int, layers: int, reps: int) -> float:
    """What a forward also runs besides the matrix products, with torch's own kernels (every peer uses them or its
    own of the same kind): the embeddings' sum and layer norm, each layer's two residual adds and layer norms over
    every token, and the softmax of every sequence's scores per head, exponentials included. Where only the first
    token is read, the last layer's scores are that token's row and its norms the pooled rows'. Median of `reps`."""
    rows, sequences = work.tokens, len(work.lengths)
    x, residual = torch.randn(rows, hidden), torch.randn(rows, hidden)
    weight, bias = torch.ones(hidden), torch.zeros(hidden)
    full = layers - 1 if work.first_token_only else layers
    scores = {n: torch.randn(heads, n, n) for n in set(work.lengths)}
    last = {n: torch.randn(heads, 1 if work.first_token_only else n, n) for n in set(work.lengths)}

    def norm(tokens: int) -> None:
        torch.nn.functional.layer_norm(x[:tokens] + residual[:tokens], (hidden,), weight, bias)

    def once() -> float:
        started = time.perf_counter()
        norm(rows)
        for layer in range(layers):
            for n in work.lengths:
                torch.softmax(scores[n] if layer < full else last[n], dim=-1)
            for _ in range(2):
                norm(rows if layer < full else sequences)
        return time.perf_counter() - started

    once()
    return median([once() for _ in range(reps)])


def linear_flop(layers: list[torch.nn.Module], work: Work) -> int:
    whole, tail = split_tail(layers, work)
    return 2 * sum(m.in_features * m.out_features * rows
                   for part, rows in ((whole, work.tokens), (tail, len(work.lengths))) for m in part)


@dataclass(frozen=True)
class Floor:
    """The floor of one request: the linear layers as timed (at `rate` FLOP/s), the attention products counted at
    that rate, and the norms and softmax (`rest_seconds`)."""

    linear: float
    rate: float
    attention: float
    rest: float

    @property
    def seconds(self) -> float:
        return self.linear + self.attention + self.rest


def floor_of(kernels: list[list[torch.nn.Module]], heads: int, work: Work, blocks: list[int], reps: int) -> Floor:
    """The floor of `work` with the fastest of `kernels` (each the same model's linear layers) and `blocks`."""
    layers = kernels[0]
    seconds = linear_seconds(kernels, work, blocks, reps)
    rate = linear_flop(layers, work) / seconds
    hidden, depth = layers[0].in_features, len(layers) // LAYER_MATRICES
    return Floor(seconds, rate, attention_flop(work, hidden, depth) / rate,
                 rest_seconds(work, hidden, heads, depth, reps))


def best_peer(records: list[dict[str, Any]], task: str, mix: str, dtype: str) -> tuple[str, float, float] | None:
    """(best peer, its median seconds, the worker's) in a bench_cpu.py (per task) or bench_minilm.py (embeddings,
    per dtype) run."""
    group = [r for r in records if r.get("times") and r["mix"] == mix and r.get("task", "embed") == task
             and r.get("dtype", dtype) == dtype]
    peers = [r for r in group if not r["system"].startswith("scorekeeper") and r["system"] != FLOOR]
    ours = [median(r["times"]) for r in group if r["system"] == "scorekeeper"]
    if not peers:
        return None
    best = min(peers, key=lambda r: median(r["times"]))
    return best["system"], median(best["times"]), ours[0] if ours else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tasks", default="embed,rerank")
    parser.add_argument("--blocks", default="1024,4096,8192", help="token block sizes to try; the fastest counts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", type=Path, help="JSON records written by bench_cpu.py or bench_minilm.py --json")
    args = parser.parse_args()
    from scorekeeper_worker.library import FusedLinear, minilm_path
    from transformers import AutoConfig

    model_dir = minilm_path()
    dtype = getattr(torch, args.dtype)
    layers = linear_layers(model_dir, dtype)
    heads = AutoConfig.from_pretrained(model_dir).num_attention_heads
    kernels: list[list[torch.nn.Module]] = [list(layers)]
    if dtype == torch.float32:
        kernels.append([FusedLinear(layer) for layer in layers])
    blocks = [int(b) for b in args.blocks.split(",")]
    records: list[dict[str, Any]] = json.loads(args.results.read_text()) if args.results else []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, {len(layers)} linear layers, "
          f"the faster of {len(kernels)} kernels\n")
    rows = []
    for task in args.tasks.split(","):
        for mix in MIXES:
            work = work_of(task, make_workload(model_dir, mix, 200, 0))
            floor = floor_of(kernels, heads, work, blocks, args.reps)
            row = [task, mix, str(work.tokens), f"{floor.linear * floor.rate / 1e9:.1f}", f"{floor.linear:.3f}",
                   f"{floor.rate / 1e9:.0f}", f"{floor.attention:.3f}", f"{floor.rest:.3f}", f"{floor.seconds:.3f}"]
            peer = best_peer(records, task, mix, args.dtype)
            if peer:
                name, best, ours = peer
                row += [f"{name} {best:.3f}", f"{ours:.3f}", f"{best / floor.seconds:.2f}×",
                        f"{best / TARGET - floor.seconds:.3f}"]
            elif records:
                row += ["–"] * 4  # the run did not measure this task and mix
            rows.append(row)
    header = ["task", "mix", "tokens", "linear GFLOP", "linear floor s", "GFLOP/s", "attention at that rate s",
              "norms and softmax s", "floor s"]
    if records:
        header += ["best peer s", "scorekeeper s", "ceiling: best peer / floor",
                   f"left for the rest at {TARGET}× s"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
