"""The vectorised token packer (engine/runner/token_packing.py) builds, bit for bit, the tensors of the per-token
packer it replaced (python_packer.py, beside this file), on random units: single sequences, multi-item groups with
child items (parents), token types, explicit positions, RoPE tables, empty queries and items, multi-token pools, with
and without padding to a bucket; and a bucket's staging buffer round-trips through the slot's views."""

from __future__ import annotations

import random

import pytest
import torch
from python_packer import build_token_inputs
from scorekeeper_worker.engine.runner import token_packing
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.packing import ForwardInputs, GraphShape, PackUnit, Pool, fits
from scorekeeper_worker.model.kernels.attention import LayoutKind

CPU = torch.device("cpu")


def _unit(rng: random.Random, types: bool) -> PackUnit:
    query = [rng.randrange(1000) for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.4:  # a whole sequence
        unit = PackUnit(query, position_start=rng.choice([0, 2]), rope_table=rng.randint(0, 1),
                        token_types=[rng.randint(0, 1) for _ in query] if types and rng.random() < 0.7 else None,
                        positions=[rng.randrange(50) for _ in query] if rng.random() < 0.2 else None)
        if query:
            start = rng.randrange(len(query))
            unit.pools.append(Pool(range(start, rng.randint(start + 1, len(query))), 0))
        return unit
    items = [[rng.randrange(1000) for _ in range(rng.randint(0, 9))] for _ in range(rng.randint(1, 5))]
    parents = [rng.randrange(i) if i and rng.random() < 0.5 else -1 for i in range(len(items))] \
        if rng.random() < 0.5 else []
    unit = PackUnit(query, items=items, visible_prefix=rng.randint(0, len(query)), parents=parents,
                    position_start=rng.choice([0, 2]), rope_table=rng.randint(0, 1))
    end = len(query)
    for i, item in enumerate(items):
        end += len(item)
        if item or rng.random() < 0.5:  # an empty item is read at the token before it
            unit.pools.append(Pool(range(max(end - 1, 0), max(end, 1)), i))
    return unit


def _same(got: ForwardInputs, want: ForwardInputs) -> None:
    assert len(got.tensors()) == len(want.tensors())
    for a, b in zip(got.tensors(), want.tensors(), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert (got.token_type_ids is None) == (want.token_type_ids is None)
    assert got.readouts == want.readouts
    assert (got.num_tokens, got.padding_tokens, got.pool_rows) == (want.num_tokens, want.padding_tokens,
                                                                   want.pool_rows)
    assert got.layout.tokens is not None and got.layout.static_shapes == want.layout.static_shapes
    assert got.layout.tokens.positions.data_ptr() == got.position_ids.data_ptr()  # a view of the ids' positions


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_packing_equals_the_per_token_packer(seed: int) -> None:
    rng = random.Random(seed)
    types = seed % 3 == 0
    units = [_unit(rng, types) for _ in range(rng.randint(1, 8))]
    kind = rng.choice([LayoutKind.DENSE, LayoutKind.FLEX])
    _same(build_inputs(units, CPU, kind), build_token_inputs(units, CPU, kind, None))
    tokens = sum(u.num_tokens for u in units)
    pools = sum(len(u.pools) for u in units)
    contributions = sum(len(p.offsets) for u in units for p in u.pools)
    shape = GraphShape(tokens + rng.randint(0, 300), pools + rng.randint(0, 5), types, pad_token=rng.randint(0, 9),
                       pooled_tokens=rng.choice([None, contributions + rng.randint(0, 7)]))
    assert fits(units, shape)
    _same(build_inputs(units, CPU, kind, shape), build_token_inputs(units, CPU, kind, shape))


def test_an_empty_batch_fills_a_bucket_with_padding() -> None:
    shape = GraphShape(64, 8, token_types=True, pad_token=5)
    _same(build_inputs([], CPU, LayoutKind.DENSE, shape), build_token_inputs([], CPU, LayoutKind.DENSE, shape))


def test_a_bucket_s_staging_buffer_round_trips_through_the_slot_views() -> None:
    rng = random.Random(7)
    units = [_unit(rng, True) for _ in range(6)]
    shape = GraphShape(512, 48, token_types=True)
    arrays = token_packing.pack(units, shape)
    staging = token_packing.Staging(shape.tokens, shape.contributions, shape.token_types)
    slot = staging.buffer(CPU)
    static = staging.views(slot, LayoutKind.FLEX, static=True)
    staged = staging.buffer(CPU)
    staging.write(arrays, staged)
    slot.copy_(staged)  # the one copy a batch takes into its slot
    token_packing.describe(static, arrays)
    _same(static, build_token_inputs(units, CPU, LayoutKind.FLEX, shape))
