"""A batch as row blocks (the eager path on CPU, and `--attention-backend sdpa`), built on the host.

Rows are context rows (whole sequences, multi-item queries) and item rows; rows of similar lengths share a block,
padded to its longest row (model/kernels/layout.py describes what attention does with them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scorekeeper_worker.engine.runner.packing import ForwardInputs, PackUnit, pools
from scorekeeper_worker.model.kernels.attention import AttentionLayout, ItemBlock, RowBlock

# A block keeps rows whose length is at least this share of its longest row, so padding at most doubles the
# attention area of a block while a batch needs only a handful of blocks.
BLOCK_LENGTH_RATIO = 0.7


@dataclass
class Row:
    tokens: list[int]  # packed indices
    positions: list[int]
    context: int = -1  # item rows: index into the item-context rows
    parent: Row | None = None  # child item rows: the parent item's row


def _blocks(rows: list[Row]) -> list[list[Row]]:
    ordered = sorted(rows, key=lambda r: len(r.tokens), reverse=True)
    blocks: list[list[Row]] = []
    for row in ordered:
        if blocks and len(row.tokens) >= BLOCK_LENGTH_RATIO * len(blocks[-1][0].tokens):
            blocks[-1].append(row)
        else:
            blocks.append([row])
    return blocks


def _tensor(values: list[Any]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def row_block(rows: list[Row], spare: int) -> RowBlock:
    """Rows padded to the longest; padding reads token 0 (attention zeroes its keys and values: it is another
    request's token) and writes to the spare row `spare`."""
    width = max(1, max(len(r.tokens) for r in rows))
    pad = [width - len(r.tokens) for r in rows]
    return RowBlock(
        token_index=_tensor([r.tokens + [0] * p for r, p in zip(rows, pad, strict=True)]),
        lengths=_tensor([len(r.tokens) for r in rows]),
        positions=_tensor([r.positions + [0] * p for r, p in zip(rows, pad, strict=True)]),
        write_index=_tensor([t for r, p in zip(rows, pad, strict=True) for t in r.tokens + [spare] * p]),
        padded=any(pad),
        spans=tuple((r.tokens[0], len(r.tokens)) for r in rows) if all(map(_consecutive, rows)) else (),
    )


def _consecutive(row: Row) -> bool:
    return bool(row.tokens) and row.tokens == list(range(row.tokens[0], row.tokens[0] + len(row.tokens)))


def _item_block(rows: list[Row], spare: int) -> ItemBlock:
    parents = [r.parent for r in rows if r.parent is not None]
    return ItemBlock(**vars(row_block(rows, spare)), context=_tensor([r.context for r in rows]),
                     parents=row_block(parents, spare) if parents else None)


def build(units: list[PackUnit]) -> ForwardInputs:
    """The row-block layout of `units`, on the host."""
    ids: list[int] = []
    positions: list[int] = []
    token_types: list[int] = []
    context_rows: list[Row] = []
    item_context_rows: list[Row] = []
    item_rows: list[Row] = []
    starts: list[int] = []
    tables: list[int] = []
    uses_token_types = any(u.token_types is not None for u in units)

    for unit in units:
        start = len(ids)
        starts.append(start)
        context_positions = unit.context_positions()
        row = Row(list(range(start, start + len(unit.context))), context_positions)
        context_rows.append(row)
        ids += unit.context
        positions += context_positions
        token_types += unit.token_types or [0] * len(unit.context)
        if unit.items:  # the query tokens its items see: the context row without its delimiter
            item_context_rows.append(Row(row.tokens[:unit.visible_prefix], row.positions[:unit.visible_prefix]))
        unit_rows: list[Row] = []
        for i, item in enumerate(unit.items):
            first = unit.item_start(i)
            item_positions = list(range(first, first + len(item)))
            parent = unit_rows[unit.parent(i)] if unit.parent(i) >= 0 else None
            unit_rows.append(Row(list(range(len(ids), len(ids) + len(item))), item_positions,
                                 context=len(item_context_rows) - 1, parent=parent))
            ids += item
            positions += item_positions
            token_types += [0] * len(item)
        tables += [unit.rope_table] * unit.num_tokens
        item_rows += unit_rows

    spare = len(ids)
    context_blocks = [row_block(rows, spare) for rows in _blocks(context_rows)]
    # Child items come in blocks of their own: they have a third view, their parents.
    children = [r for r in item_rows if r.parent is not None]
    item_blocks = [_item_block(rows, spare)
                   for rows in _blocks([r for r in item_rows if r.parent is None]) + _blocks(children)]
    item_contexts = row_block(item_context_rows, spare) if item_context_rows else None
    pooled = pools(units, starts)
    token_index = torch.from_numpy(pooled.token)
    pooled_tokens, pooled_index = torch.unique(token_index, return_inverse=True)  # ascending
    return ForwardInputs(
        input_ids=_tensor([ids]),
        position_ids=_tensor([positions]),
        token_type_ids=_tensor([token_types]) if uses_token_types else None,
        layout=AttentionLayout(context_blocks, item_blocks, item_contexts),
        pool_token_index=token_index,
        pool_slot=torch.from_numpy(pooled.slot),
        pool_weight=torch.from_numpy(pooled.weight),
        readouts=pooled.readouts,
        num_tokens=len(ids),
        rope_table=_tensor(tables),
        pooled_tokens=pooled_tokens,
        pooled_index=pooled_index,
    )
