"""Multi-item scoring throughput in process, for bench/gpu/gpu_check.py: one query of Q tokens and N items of I tokens.

- `mis`: one packed unit `query [D] item [D] item …` (each item sees the query, not other items);
- `single`: N sequences `query item`, packed into forwards of at most `max_tokens` tokens (the worker's
  `--max-batch-tokens`), as the worker runs single-item requests;
- `mis graph`: the MIS unit replayed through the smallest captured bucket it fits, per graph layout.

Items/s is N over the median time of the forward passes (pooled pre-head rows, no HTTP, no tokenization): what the
engine can do, the ceiling of what the server serves. The MIS rows must equal the single-item rows (the same
sequences, isolated by the mask): `max_abs_diff` is reported and checked against the dtype's tolerance.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from scorekeeper_worker.library import (
    GraphRunner,
    PackUnit,
    Pool,
    ScoringModel,
    build_inputs,
    pooled_rows,
    token_batches,
)

Timer = Callable[[Callable[[], object]], float]  # median milliseconds of a callable


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """`512x100,128x10` → [(512, 100), (128, 10)]: query tokens × items."""
    return [(int(q), int(n)) for q, n in (part.split("x") for part in text.split(",") if part)]


def mis_batch(model: ScoringModel, query_len: int, items: int, item_len: int,
              delimiter: int) -> tuple[PackUnit, list[PackUnit]]:
    """The MIS unit and the equivalent single-item sequences, pooled at each item's last token."""
    rng = random.Random(query_len * 100_003 + items)
    vocab = model.model.get_input_embeddings().num_embeddings
    query = [rng.randrange(10, vocab) for _ in range(query_len)]
    item_ids = [[rng.randrange(10, vocab) for _ in range(item_len)] for _ in range(items)]
    unit = PackUnit([*query, delimiter], visible_prefix=query_len, position_start=model.position_start)
    singles = []
    for i, ids in enumerate(item_ids):
        unit.pools.append(Pool(range(unit.num_tokens + item_len - 1, unit.num_tokens + item_len), i))
        unit.items.append([*ids, delimiter])
        sequence = query + ids
        singles.append(PackUnit(sequence, position_start=model.position_start,
                                pools=[Pool(range(len(sequence) - 1, len(sequence)), i)]))
    return unit, singles


def mis_throughput(model: ScoringModel, shapes: list[tuple[int, int]], item_len: int, delimiter: int,
                   max_tokens: int, runners: dict[str, GraphRunner], timer: Timer,
                   tolerance: tuple[float, float]) -> dict[str, Any]:
    """Per shape `QxN`: items/s of each arm, the MIS / single ratio, and MIS-vs-single agreement."""
    device = model.device
    rtol, atol = tolerance
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for query_len, items in shapes:
            unit, singles = mis_batch(model, query_len, items, item_len, delimiter)
            batches = token_batches(singles, max_tokens, lambda unit: unit.num_tokens)
            mis_rows = pooled_rows(model, build_inputs([unit], device))
            single_rows = torch.cat([pooled_rows(model, build_inputs(b, device)) for b in batches])
            error = (mis_rows - single_rows).abs().max().item()
            scale = max(1.0, single_rows.abs().max().item())
            result: dict[str, Any] = {
                "mis_tokens": unit.num_tokens, "single_tokens": sum(u.num_tokens for u in singles),
                "single_forwards": len(batches), "max_abs_diff": error, "ok": error <= atol + rtol * scale}
            ms = {"mis": timer(lambda unit=unit: pooled_rows(model, build_inputs([unit], device))),
                  "single": timer(lambda batches=batches: [pooled_rows(model, build_inputs(b, device))
                                                           for b in batches])}
            for layout, runner in runners.items():
                bucket = runner.select([unit])
                if bucket is not None:  # on CPU (--cpu-dry-run) the bucket's padded shapes run eagerly
                    ms[f"mis graph {layout}"] = timer(
                        lambda bucket=bucket, unit=unit, runner=runner: (runner.load(bucket, [unit]),
                                                                         runner.forward(bucket)))
            result["ms"] = {arm: round(t, 3) for arm, t in ms.items()}
            result["items_per_s"] = {arm: round(items / t * 1000, 1) for arm, t in ms.items()}
            result["mis_over_single"] = round(ms["single"] / ms["mis"], 2)
            out[f"{query_len}x{items}"] = result
    return out
