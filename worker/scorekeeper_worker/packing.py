"""Units of packing and their conversion to tensors: the only place Python lists become tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from scorekeeper_worker.attention import AttentionLayout, ItemBlock, RowBlock

# A block keeps rows whose length is at least this share of its longest row, so padding at most doubles the
# attention area of a block while a batch needs only a handful of blocks.
BLOCK_LENGTH_RATIO = 0.7


@dataclass(frozen=True)
class Pool:
    """Read one output vector: the mean of the unit's tokens at `offsets` (one offset = that token's row).
    Offsets count the unit's tokens in packed order: context row first, then item rows in order."""

    offsets: range
    owner: Any  # opaque to packing: the scheduler's (job, slot)


@dataclass
class PackUnit:
    """One context row (a whole sequence, or a multi-item query) and, for multi-item scoring, its item rows."""

    context: list[int]
    items: list[list[int]] = field(default_factory=list)
    visible_prefix: int = 0  # context tokens the items attend to (the query without its delimiter)
    token_types: list[int] | None = None  # for the context row (encoders)
    position_start: int = 0  # first position id (2 for XLM-R, whose positions start after padding_idx)
    pools: list[Pool] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.context) + sum(len(item) for item in self.items)


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    token_type_ids: torch.Tensor | None  # [1, T]
    layout: AttentionLayout
    pool_token_index: torch.Tensor  # [M] packed token per pooled contribution
    pool_slot: torch.Tensor  # [M] which pooled vector it adds into
    pool_weight: torch.Tensor  # [M] 1 / tokens pooled into that vector
    owners: list[Any]  # one per pooled vector
    num_tokens: int
    padding_tokens: int = 0


@dataclass
class _Row:
    tokens: list[int]  # packed indices
    positions: list[int]
    context: int = -1  # item rows: index into the item-context rows
    prefix: int = 0


def _blocks(rows: list[_Row]) -> list[list[_Row]]:
    ordered = sorted(rows, key=lambda r: len(r.tokens), reverse=True)
    blocks: list[list[_Row]] = []
    for row in ordered:
        if blocks and len(row.tokens) >= BLOCK_LENGTH_RATIO * len(blocks[-1][0].tokens):
            blocks[-1].append(row)
        else:
            blocks.append([row])
    return blocks


def _row_block(rows: list[_Row], device: torch.device) -> tuple[list[list[int]], list[list[int]], list[int]]:
    width = max(1, max(len(r.tokens) for r in rows))
    index = [r.tokens + [0] * (width - len(r.tokens)) for r in rows]
    positions = [r.positions + [0] * (width - len(r.positions)) for r in rows]
    return index, positions, [len(r.tokens) for r in rows]


def _tensor(values: list[Any], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def build_inputs(units: list[PackUnit], device: torch.device) -> ForwardInputs:
    ids: list[int] = []
    positions: list[int] = []
    token_types: list[int] = []
    context_rows: list[_Row] = []
    item_context_rows: list[_Row] = []
    item_rows: list[_Row] = []
    pool_token: list[int] = []
    pool_slot: list[int] = []
    pool_weight: list[float] = []
    owners: list[Any] = []
    uses_token_types = any(u.token_types is not None for u in units)

    for unit in units:
        start = len(ids)
        context_positions = list(range(unit.position_start, unit.position_start + len(unit.context)))
        row = _Row(list(range(start, start + len(unit.context))), context_positions)
        context_rows.append(row)
        ids += unit.context
        positions += context_positions
        token_types += unit.token_types or [0] * len(unit.context)
        if unit.items:
            item_context_rows.append(row)
        for item in unit.items:
            first = unit.position_start + unit.visible_prefix
            item_positions = list(range(first, first + len(item)))
            item_rows.append(_Row(list(range(len(ids), len(ids) + len(item))), item_positions,
                                  context=len(item_context_rows) - 1, prefix=unit.visible_prefix))
            ids += item
            positions += item_positions
            token_types += [0] * len(item)
        for pool in unit.pools:
            for offset in pool.offsets:
                pool_token.append(start + offset)
                pool_slot.append(len(owners))
                pool_weight.append(1.0 / len(pool.offsets))
            owners.append(pool.owner)

    scatter = [0] * len(ids)
    flat_offset = 0
    context_blocks: list[RowBlock] = []
    item_blocks: list[ItemBlock] = []
    for is_item, rows in ((False, context_rows), (True, item_rows)):
        for block_rows in _blocks(rows):
            index, block_positions, lengths = _row_block(block_rows, device)
            width = len(index[0])
            for r, row in enumerate(block_rows):
                for j, token in enumerate(row.tokens):
                    scatter[token] = flat_offset + r * width + j
            flat_offset += len(block_rows) * width
            tensors = (_tensor(index, device), _tensor(lengths, device), _tensor(block_positions, device))
            if is_item:
                item_blocks.append(ItemBlock(*tensors, context=_tensor([r.context for r in block_rows], device),
                                             prefix_lengths=_tensor([r.prefix for r in block_rows], device)))
            else:
                context_blocks.append(RowBlock(*tensors))
    item_contexts = None
    if item_context_rows:
        index, block_positions, lengths = _row_block(item_context_rows, device)
        item_contexts = RowBlock(_tensor(index, device), _tensor(lengths, device), _tensor(block_positions, device))

    layout = AttentionLayout(context_blocks, item_blocks, item_contexts, _tensor(scatter, device))
    return ForwardInputs(
        input_ids=_tensor([ids], device),
        position_ids=_tensor([positions], device),
        token_type_ids=_tensor([token_types], device) if uses_token_types else None,
        layout=layout,
        pool_token_index=_tensor(pool_token, device),
        pool_slot=_tensor(pool_slot, device),
        pool_weight=torch.tensor(pool_weight, dtype=torch.float32, device=device),
        owners=owners,
        num_tokens=len(ids),
    )
