"""Attention of whole rows on CPU, float32: the flash kernel (`attend`) against the batched path of `attend_output`
(two batched matrix products and a softmax per tile of rows, `model/kernels/tiled.py`), on blocks of right-padded rows
as packed attention gathers them (transposed views, a key-padding bias), about 4,096 tokens per block. Picks
`BATCHED_MAX_KEYS` (where flash starts to win) and `BATCHED_TILE` (scores per tile). The engine-level A/B on the
bench_cpu.py workloads is in bench_cpu_steps.py.

    .venv/bin/python bench/cpu/bench_attention.py --heads 12 --dim 32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

import torch
from scorekeeper_worker.library import tiled

from bench.harness.common import markdown_table, median


def block(rows: int, length: int, heads: int,
          dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tiled.RowMask]:
    tokens = torch.randn(3, rows * length, heads, dim)
    index = torch.randperm(rows * length)  # rows gathered from a packed batch, as packed attention does
    q, k, v = (t.index_select(0, index).view(rows, length, heads, dim).transpose(1, 2) for t in tokens)
    lengths = torch.randint(length * 3 // 4, length + 1, (rows,))
    positions = torch.arange(length)[None].expand(rows, length)
    valid = positions < lengths[:, None]
    return q, k, v, tiled.RowMask(positions, positions, valid, False, None, contiguous=True)


def compare(length: int, heads: int, dim: int, tiles: list[int], reps: int) -> list[str]:
    """One block of rows `length` keys long: flash time, then flash / batched for each tile size (interleaved)."""
    rows = max(1, 4096 // length)
    q, k, v, mask = block(rows, length, heads, dim)
    scale = dim**-0.5

    def run(tile: int | None) -> float:
        started = time.perf_counter()
        if tile is None:
            tiled.attend(q, k, v, mask, False, scale, None)
        else:
            tiled.BATCHED_TILE = tile
            tiled.attend_output(q, k, v, mask, False, scale, None)
        return time.perf_counter() - started

    arms: list[int | None] = [None, *tiles]
    for arm in arms:  # warm-up
        run(arm)
    times: dict[int | None, list[float]] = {arm: [] for arm in arms}
    for _ in range(reps):
        for arm in arms:
            times[arm].append(run(arm))
    flash = median(times[None])
    return [str(length), str(rows), f"{flash * 1e3:.2f}"] + [f"{flash / median(times[tile]):.2f}×" for tile in tiles]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--lengths", default="16,40,64,128,192,256,384,512")
    parser.add_argument("--tiles", default="262144,1048576,4194304", help="BATCHED_TILE values (scores per tile)")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tiles = [int(tile) for tile in args.tiles.split(",")]
    tiled.BATCHED_MAX_KEYS = 1 << 30  # measure the batched path beyond the threshold too
    rows = [compare(int(length), args.heads, args.dim, tiles, args.reps) for length in args.lengths.split(",")]
    print(f"heads {args.heads}, head dim {args.dim}, {args.threads} threads; flash time, and flash / batched "
          "(> 1: batched is faster)")
    print(markdown_table(["keys per row", "rows", "flash ms"] + [f"batched, tile {tile}" for tile in tiles], rows))


if __name__ == "__main__":
    main()
