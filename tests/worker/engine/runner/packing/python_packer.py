"""The per-token packer the vectorised one replaced (engine/runner/token_packing.py), kept as its reference: it
builds a token layout's tensors one Python list entry per token, as the worker packed before the vectorised packer,
and tests/worker/engine/runner/packing/test_token_packing.py asserts that the two agree bit for bit on random units."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from scorekeeper_worker.engine.runner.packing import ForwardInputs, GraphShape, PackUnit, Readout
from scorekeeper_worker.model.kernels.attention import AttentionLayout, LayoutKind, TokenLayout


@dataclass
class _Pools:
    """The pooling of a batch: per contribution its packed token, pooled-vector slot and mean weight; per pooled
    vector its readout."""

    token: list[int] = field(default_factory=list)
    slot: list[int] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)
    readouts: list[Readout] = field(default_factory=list)

    def add(self, index: int, unit: PackUnit, start: int) -> None:
        """The pools of the batch's unit `index`, which starts at packed token `start`."""
        for pool in unit.pools:
            for offset in pool.offsets:
                self.token.append(start + offset)
                self.slot.append(len(self.readouts))
                self.weight.append(1.0 / len(pool.offsets))
            self.readouts.append(Readout(index, pool.slot))


def _inputs(ids: list[int], position_ids: torch.Tensor, token_types: list[int] | None, layout: AttentionLayout,
            pools: _Pools, tables: list[int], device: torch.device, live: int, pool_rows: int = 0) -> ForwardInputs:
    """The tensors of a packed batch (`live` of its tokens real, the rest padding)."""
    return ForwardInputs(
        input_ids=_tensor([ids], device),
        position_ids=position_ids,
        token_type_ids=_tensor([token_types], device) if token_types is not None else None,
        layout=layout,
        pool_token_index=_tensor(pools.token, device),
        pool_slot=_tensor(pools.slot, device),
        pool_weight=torch.tensor(pools.weight, dtype=torch.float32, device=device),
        readouts=pools.readouts,
        num_tokens=live,
        rope_table=_tensor(tables, device),
        padding_tokens=len(ids) - live,
        pool_rows=pool_rows,
    )


def _tensor(values: list[Any], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def build_token_inputs(units: list[PackUnit], device: torch.device, kind: LayoutKind,
                        shape: GraphShape | None) -> ForwardInputs:
    ids: list[int] = []
    positions: list[int] = []
    token_types: list[int] = []
    segment: list[int] = []
    context: list[int] = []
    offset: list[int] = []
    prefix: list[int] = []
    parent: list[int] = []
    pools = _Pools()
    tables: list[int] = []
    rows = 0

    for index, unit in enumerate(units):
        start = len(ids)
        query_segment = rows
        rows += 1
        ids += unit.context
        positions += unit.context_positions()
        token_types += unit.token_types or [0] * len(unit.context)
        segment += [query_segment] * len(unit.context)
        context += [-1] * len(unit.context)
        offset += range(len(unit.context))
        prefix += [0] * len(unit.context)
        parent += [-1] * len(unit.context)
        for i, item in enumerate(unit.items):
            first = unit.item_start(i)
            ids += item
            positions += range(first, first + len(item))
            token_types += [0] * len(item)
            segment += [rows] * len(item)
            context += [query_segment] * len(item)
            offset += range(len(item))
            prefix += [unit.visible_prefix] * len(item)
            parent += [query_segment + 1 + unit.parent(i) if unit.parent(i) >= 0 else -1] * len(item)
            rows += 1
        tables += [unit.rope_table] * unit.num_tokens
        pools.add(index, unit, start)

    live = len(ids)
    pool_rows = len(pools.readouts)
    uses_token_types = any(u.token_types is not None for u in units)
    if shape is not None:
        pad = shape.tokens - live
        ids += [shape.pad_token] * pad
        positions += [0] * pad
        token_types += [0] * pad
        segment += range(rows, rows + pad)  # after every real segment, one each: padding sees only itself
        context += [-1] * pad
        offset += [0] * pad
        prefix += [0] * pad
        tables += [0] * pad
        parent += [-1] * pad
        spare = shape.contributions - len(pools.token)
        pools.token += [shape.tokens - 1] * spare  # any token: the weight is zero and the slot is the scratch one
        pools.slot += [shape.sequences] * spare
        pools.weight += [0.0] * spare
        pool_rows = shape.sequences + 1
        uses_token_types = shape.token_types

    position_ids = _tensor([positions], device)
    tokens = TokenLayout(segment=_tensor(segment, device), context=_tensor(context, device),
                         offset=_tensor(offset, device), prefix=_tensor(prefix, device), positions=position_ids[0],
                         parent=_tensor(parent, device))
    layout = AttentionLayout(kind=kind, tokens=tokens, static_shapes=shape is not None)
    return _inputs(ids, position_ids, token_types if uses_token_types else None, layout, pools, tables, device, live,
                   pool_rows)
