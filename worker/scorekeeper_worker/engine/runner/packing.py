"""Units of packing and their conversion to tensors: the only place Python lists become tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from scorekeeper_worker.model.kernels.attention import AttentionLayout, ItemBlock, LayoutKind, RowBlock, TokenLayout

# A block keeps rows whose length is at least this share of its longest row, so padding at most doubles the
# attention area of a block while a batch needs only a handful of blocks.
BLOCK_LENGTH_RATIO = 0.7


@dataclass(frozen=True)
class Pool:
    """Read one output vector: the mean of the unit's tokens at `offsets` (one offset = that token's row).
    Offsets count the unit's tokens in packed order: context row first, then item rows in order."""

    offsets: range
    slot: int  # the row of the request's result it fills (an item, a window, a question's target)


@dataclass(frozen=True)
class Readout:
    """Where one pooled vector of a batch goes: the unit it came from (its index in the batch) and the pool's slot.
    The queue knows each unit's job; packing never does."""

    unit: int
    slot: int


@dataclass
class PackUnit:
    """One context row (a whole sequence, or a multi-item query) and, for multi-item scoring, its item rows. An item
    may have a parent (`parents[i]`: the index of an earlier item, -1 for none; empty: no item has one): it then
    also sees every token of that item and is positioned after it, as in the sequence `query + parent + item`."""

    context: list[int]
    items: list[list[int]] = field(default_factory=list)
    visible_prefix: int = 0  # context tokens the items attend to (the query without its delimiter)
    token_types: list[int] | None = None  # for the context row (encoders)
    position_start: int = 0  # first position id (2 for XLM-R, whose positions start after padding_idx)
    positions: list[int] | None = None  # the context row's position ids where they are not position_start + index
    rope_table: int = 0  # the RoPE table of every token of the unit (model/trunk_patches.py)
    pools: list[Pool] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def context_positions(self) -> list[int]:
        if self.positions is not None:
            return self.positions
        return list(range(self.position_start, self.position_start + len(self.context)))

    @property
    def num_tokens(self) -> int:
        return len(self.context) + sum(len(item) for item in self.items)

    def parent(self, item: int) -> int:
        return self.parents[item] if self.parents else -1

    def item_start(self, item: int) -> int:
        """The first position id of an item (after its query's visible prefix, and its parent when it has one)."""
        parent = self.parent(item)
        return self.position_start + self.visible_prefix + (len(self.items[parent]) if parent >= 0 else 0)


@dataclass(frozen=True)
class GraphShape:
    """The fixed shapes of one CUDA-graph bucket: `tokens` packed tokens (live ones first, then padding) and
    `sequences` pooled-vector slots (scored sequences: items under multi-item scoring), plus one scratch slot that
    padding contributions add into. Pool contributions get `tokens + sequences` entries (mean pooling contributes
    every token of a sequence, last-token pooling one per slot)."""

    tokens: int
    sequences: int
    token_types: bool = False  # whether the model takes token_type_ids (the buffer exists for every batch then)
    pad_token: int = 0  # id of padding tokens: any id works, nothing attends to padding

    @property
    def contributions(self) -> int:
        return self.tokens + self.sequences


def fits(units: list[PackUnit], shape: GraphShape) -> bool:
    """Whether a batch fits a bucket's buffers."""
    pools = [pool for unit in units for pool in unit.pools]
    return (sum(u.num_tokens for u in units) <= shape.tokens and len(pools) <= shape.sequences
            and sum(len(p.offsets) for p in pools) <= shape.contributions)


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    token_type_ids: torch.Tensor | None  # [1, T]
    layout: AttentionLayout
    pool_token_index: torch.Tensor  # [M] packed token per pooled contribution
    pool_slot: torch.Tensor  # [M] which pooled vector it adds into
    pool_weight: torch.Tensor  # [M] 1 / tokens pooled into that vector
    readouts: list[Readout]  # one per pooled vector
    num_tokens: int
    rope_table: torch.Tensor  # [T] the RoPE table of each token
    padding_tokens: int = 0
    pool_rows: int = 0  # rows of the pooled output: len(readouts), or a bucket's slots + 1 (the scratch slot)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a forward pass reads, in a fixed order (CUDA-graph static buffers are refilled from it)."""
        tokens = self.layout.tokens.tensors() if self.layout.tokens is not None else []
        types = [] if self.token_type_ids is None else [self.token_type_ids]
        return [self.input_ids, self.position_ids, *types, *tokens, self.rope_table, self.pool_token_index,
                self.pool_slot, self.pool_weight]


@dataclass
class _Row:
    tokens: list[int]  # packed indices
    positions: list[int]
    context: int = -1  # item rows: index into the item-context rows
    parent: _Row | None = None  # child item rows: the parent item's row


def _blocks(rows: list[_Row]) -> list[list[_Row]]:
    ordered = sorted(rows, key=lambda r: len(r.tokens), reverse=True)
    blocks: list[list[_Row]] = []
    for row in ordered:
        if blocks and len(row.tokens) >= BLOCK_LENGTH_RATIO * len(blocks[-1][0].tokens):
            blocks[-1].append(row)
        else:
            blocks.append([row])
    return blocks


def _row_block(rows: list[_Row], spare: int, device: torch.device) -> RowBlock:
    """Rows padded to the longest; padding reads token 0 and writes to the spare row `spare`."""
    width = max(1, max(len(r.tokens) for r in rows))
    pad = [width - len(r.tokens) for r in rows]
    return RowBlock(
        token_index=_tensor([r.tokens + [0] * p for r, p in zip(rows, pad, strict=True)], device),
        lengths=_tensor([len(r.tokens) for r in rows], device),
        positions=_tensor([r.positions + [0] * p for r, p in zip(rows, pad, strict=True)], device),
        write_index=_tensor([t for r, p in zip(rows, pad, strict=True) for t in r.tokens + [spare] * p], device),
        padded=any(pad),
        spans=tuple((r.tokens[0], len(r.tokens)) for r in rows) if all(map(_consecutive, rows)) else (),
    )


def _consecutive(row: _Row) -> bool:
    return bool(row.tokens) and row.tokens == list(range(row.tokens[0], row.tokens[0] + len(row.tokens)))


def _item_block(rows: list[_Row], spare: int, device: torch.device) -> ItemBlock:
    parents = [r.parent for r in rows if r.parent is not None]
    return ItemBlock(**vars(_row_block(rows, spare, device)), context=_tensor([r.context for r in rows], device),
                     parents=_row_block(parents, spare, device) if parents else None)


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


def build_inputs(units: list[PackUnit], device: torch.device, kind: LayoutKind = LayoutKind.BLOCKS,
                 shape: GraphShape | None = None) -> ForwardInputs:
    """Pack units into one row. `kind` picks the attention layout; `shape` (token layouts only) pads the batch to
    a CUDA-graph bucket: padding tokens after the live ones, each its own segment, and pool entries that add zero
    into the scratch slot, so every tensor has the bucket's shape and no live value is needed to run it."""
    if shape is not None and kind == LayoutKind.BLOCKS:
        raise ValueError("graph-shaped inputs need a token layout (dense or flex)")
    if shape is not None and not fits(units, shape):
        raise ValueError(f"batch does not fit the {shape.tokens}-token bucket")
    if kind != LayoutKind.BLOCKS:
        return _build_token_inputs(units, device, kind, shape)
    ids: list[int] = []
    positions: list[int] = []
    token_types: list[int] = []
    context_rows: list[_Row] = []
    item_context_rows: list[_Row] = []
    item_rows: list[_Row] = []
    pools = _Pools()
    tables: list[int] = []
    uses_token_types = any(u.token_types is not None for u in units)

    for index, unit in enumerate(units):
        start = len(ids)
        context_positions = unit.context_positions()
        row = _Row(list(range(start, start + len(unit.context))), context_positions)
        context_rows.append(row)
        ids += unit.context
        positions += context_positions
        token_types += unit.token_types or [0] * len(unit.context)
        if unit.items:  # the query tokens its items see: the context row without its delimiter
            item_context_rows.append(_Row(row.tokens[:unit.visible_prefix], row.positions[:unit.visible_prefix]))
        unit_rows: list[_Row] = []
        for i, item in enumerate(unit.items):
            first = unit.item_start(i)
            item_positions = list(range(first, first + len(item)))
            parent = unit_rows[unit.parent(i)] if unit.parent(i) >= 0 else None
            unit_rows.append(_Row(list(range(len(ids), len(ids) + len(item))), item_positions,
                                  context=len(item_context_rows) - 1, parent=parent))
            ids += item
            positions += item_positions
            token_types += [0] * len(item)
        tables += [unit.rope_table] * unit.num_tokens
        item_rows += unit_rows
        pools.add(index, unit, start)

    spare = len(ids)
    context_blocks = [_row_block(rows, spare, device) for rows in _blocks(context_rows)]
    # Child items come in blocks of their own: they have a third view, their parents.
    children = [r for r in item_rows if r.parent is not None]
    item_blocks = [_item_block(rows, spare, device)
                   for rows in _blocks([r for r in item_rows if r.parent is None]) + _blocks(children)]
    item_contexts = _row_block(item_context_rows, spare, device) if item_context_rows else None
    layout = AttentionLayout(context_blocks, item_blocks, item_contexts)
    return _inputs(ids, _tensor([positions], device), token_types if uses_token_types else None, layout, pools,
                   tables, device, len(ids))


def _build_token_inputs(units: list[PackUnit], device: torch.device, kind: LayoutKind,
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
