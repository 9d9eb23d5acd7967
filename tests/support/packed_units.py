"""Packed batches for engine tests: single sequences of mixed lengths and multi-item groups, seeded."""

from __future__ import annotations

import random
from collections.abc import Sequence

from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.loader import ScoringModel

DELIMITER = 3


def mixed_units(model: ScoringModel, rng: random.Random, lengths: Sequence[int],
                groups: Sequence[tuple[int, list[int]]] = ()) -> list[PackUnit]:
    """One unit per length (pooled as the model pools), then one multi-item unit per (query length, item lengths)
    group, items separated by DELIMITER; an empty query or item is allowed."""
    units = []
    for length in lengths:
        ids = [rng.randrange(10, 120) for _ in range(length)]
        offsets = range(length - 1, length) if model.is_decoder else range(length)
        types = [0] * (length // 2) + [1] * (length - length // 2) if model.uses_token_types else None
        units.append(PackUnit(ids, token_types=types, position_start=model.position_start,
                              pools=[Pool(offsets, len(units))]))
    for query, items in groups:
        unit = PackUnit([rng.randrange(10, 120) for _ in range(query)] + [DELIMITER], visible_prefix=query)
        for length in items:
            offset = unit.num_tokens + length - 1 if length else query - 1
            unit.items.append([rng.randrange(10, 120) for _ in range(length)] + [DELIMITER])
            unit.pools.append(Pool(range(offset, offset + 1), len(units) + len(unit.pools)))
        units.append(unit)
    return units
