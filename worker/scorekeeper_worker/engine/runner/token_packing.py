"""A batch in a token layout (CUDA-graph buckets, flex), built with vector operations from its units' lengths.

Python touches each segment (a context row, an item) and each pool once; every per-token array (ids, positions, segment,
query segment, offset in row, visible prefix, parent, RoPE table, token types) is a `repeat` of per-segment values plus
an offset within the segment, so an 8,192-token bucket of 44 segments costs well under a millisecond (the per-token
Python packer it replaced took about 5 ms; tests/worker/engine/runner/packing/python_packer.py keeps it as the reference
that the tests compare with, bit for bit). A bucket's arrays are written into one staging buffer (`Staging`): pinned on
CUDA, copied to the bucket's device buffer in one copy, whose views are the static tensors a graph reads."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from scorekeeper_worker.engine.runner.packing import ForwardInputs, GraphShape, PackUnit, Pools, pools
from scorekeeper_worker.model.kernels.attention import AttentionLayout, LayoutKind, TokenLayout
from scorekeeper_worker.model.kernels.mis_attention import WORK_FIELDS, work_list

# Rows of the int64 block, in order; `types` is there only when the bucket (or batch) has token types.
INT_ROWS = ("ids", "positions", "segment", "context", "offset", "prefix", "parent", "rope")


@dataclass
class TokenArrays:
    """A packed batch in a token layout, on the host: `ints` [rows, T] (INT_ROWS, then token types when `types`),
    the pools, and the live token count (the rest is padding)."""

    ints: np.ndarray
    types: bool
    pools: Pools
    live: int
    pool_rows: int  # rows of the pooled output: the readouts, or a bucket's slots + 1
    work: np.ndarray | None = None  # the Triton kernel's work list [W, WORK_FIELDS] (a bucket's: padded with zeros)
    work_live: int = 0  # its live rows
    work_block: int = 0

    def row(self, name: str) -> np.ndarray:
        return self.ints[INT_ROWS.index(name) if name != "types" else len(INT_ROWS)]


def pack(units: list[PackUnit], shape: GraphShape | None = None, work_block: int = 0) -> TokenArrays:
    """The token layout of `units`, padded to `shape` when given (the caller checked that they fit); with a
    `work_block` (a shape's own, if it has one), the Triton kernel's work list too."""
    length, pos, ctx, prefix, parent, table, unit_starts = [], [], [], [], [], [], []
    start = 0
    for unit in units:
        unit_starts.append(start)
        start += unit.num_tokens
        query = len(length)
        length.append(len(unit.context))
        pos.append(unit.position_start)
        ctx.append(-1)
        prefix.append(0)
        parent.append(-1)
        for i, item in enumerate(unit.items):
            length.append(len(item))
            pos.append(unit.item_start(i))
            ctx.append(query)
            prefix.append(unit.visible_prefix)
            parent.append(query + 1 + unit.parent(i) if unit.parent(i) >= 0 else -1)
        table += [unit.rope_table] * (1 + len(unit.items))
    lengths = np.array(length, dtype=np.int64)
    live = int(lengths.sum())
    total = live if shape is None else shape.tokens
    types = any(u.token_types is not None for u in units) if shape is None else shape.token_types
    ints = np.zeros((len(INT_ROWS) + types, total), dtype=np.int64)
    arrays = TokenArrays(ints, types, Pools(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32),
                                            []), live, 0)
    starts = np.cumsum(lengths) - lengths
    offset = np.arange(live, dtype=np.int64) - np.repeat(starts, lengths)
    ids = itertools.chain.from_iterable(sequence for u in units for sequence in (u.context, *u.items))
    arrays.row("ids")[:live] = np.fromiter(ids, dtype=np.int64, count=live)
    arrays.row("offset")[:live] = offset
    arrays.row("positions")[:live] = np.repeat(np.array(pos, dtype=np.int64), lengths) + offset
    arrays.row("segment")[:live] = np.repeat(np.arange(len(length), dtype=np.int64), lengths)
    arrays.row("context")[:live] = np.repeat(np.array(ctx, dtype=np.int64), lengths)
    arrays.row("prefix")[:live] = np.repeat(np.array(prefix, dtype=np.int64), lengths)
    arrays.row("parent")[:live] = np.repeat(np.array(parent, dtype=np.int64), lengths)
    arrays.row("rope")[:live] = np.repeat(np.array(table, dtype=np.int64), lengths)
    for unit, start in zip(units, unit_starts, strict=True):  # the rare explicit positions and token types
        if unit.positions is not None:
            arrays.row("positions")[start:start + len(unit.context)] = unit.positions
        if unit.token_types is not None and types:
            arrays.row("types")[start:start + len(unit.context)] = unit.token_types
    arrays.pools = pools(units, unit_starts)
    arrays.pool_rows = len(arrays.pools.readouts)
    block = shape.work_block if shape is not None and shape.work_block else work_block
    if block:
        work = work_list(starts, lengths, np.array(ctx, np.int64), np.array(prefix, np.int64),
                         np.array(parent, np.int64), block)
        arrays.work, arrays.work_live, arrays.work_block = work, len(work), block
    if shape is not None:
        _pad(arrays, shape, len(length))
    return arrays


def _pad(arrays: TokenArrays, shape: GraphShape, segments: int) -> None:
    """Padding tokens after the live ones, each a segment of its own (numbered after every real one) that sees only
    itself; pool entries that add zero into the scratch slot, so every array has the bucket's shape."""
    live, pad = arrays.live, shape.tokens - arrays.live
    arrays.row("ids")[live:] = shape.pad_token
    arrays.row("segment")[live:] = np.arange(segments, segments + pad, dtype=np.int64)
    arrays.row("context")[live:] = -1
    arrays.row("parent")[live:] = -1
    spare = shape.contributions - len(arrays.pools.token)
    p = arrays.pools
    p.token = np.concatenate([p.token, np.full(spare, shape.tokens - 1, dtype=np.int64)])  # any token: weight 0
    p.slot = np.concatenate([p.slot, np.full(spare, shape.sequences, dtype=np.int64)])
    p.weight = np.concatenate([p.weight, np.zeros(spare, dtype=np.float32)])
    arrays.pool_rows = shape.sequences + 1
    if arrays.work is not None:  # rows past the live ones are never read: the kernel stops at the live count
        arrays.work = np.concatenate([arrays.work, np.zeros((shape.work_items - arrays.work_live, WORK_FIELDS),
                                                            dtype=np.int64)])


class Staging:
    """The byte layout of a token-layout batch: the int64 block [rows, T], pool tokens and slots [2, M] (int64),
    with a work list its rows [W, WORK_FIELDS] and live count [1] (int64), then pool weights [M] (float32). One
    buffer of it holds a whole batch, so one copy moves it."""

    def __init__(self, tokens: int, contributions: int, types: bool, work_items: int = 0, work_block: int = 0) -> None:
        self.tokens, self.contributions, self.types = tokens, contributions, types
        self.work_items, self.work_block = work_items, work_block
        self.rows = len(INT_ROWS) + types
        self.work_at = self.rows * tokens + 2 * contributions  # in int64s
        self.int_bytes = 8 * (self.work_at + (work_items * WORK_FIELDS + 1 if work_block else 0))
        self.nbytes = self.int_bytes + 4 * contributions

    @staticmethod
    def of(arrays: TokenArrays) -> Staging:
        work_items = 0 if arrays.work is None else len(arrays.work)
        return Staging(arrays.ints.shape[1], len(arrays.pools.token), arrays.types, work_items, arrays.work_block)

    @staticmethod
    def for_shape(shape: GraphShape) -> Staging:
        return Staging(shape.tokens, shape.contributions, shape.token_types, shape.work_items, shape.work_block)

    def buffer(self, device: torch.device, pinned: bool = False) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device, pin_memory=pinned)

    def write(self, arrays: TokenArrays, buffer: torch.Tensor) -> None:
        """Fill a host buffer of this layout."""
        raw = buffer.numpy()
        ints = raw[:self.int_bytes].view(np.int64)
        ints[:self.rows * self.tokens] = arrays.ints.reshape(-1)
        ints[self.rows * self.tokens:self.rows * self.tokens + self.contributions] = arrays.pools.token
        ints[self.rows * self.tokens + self.contributions:self.work_at] = arrays.pools.slot
        if self.work_block:
            assert arrays.work is not None
            ints[self.work_at:-1] = arrays.work.reshape(-1)
            ints[-1] = arrays.work_live
        raw[self.int_bytes:].view(np.float32)[:] = arrays.pools.weight

    def views(self, buffer: torch.Tensor, kind: LayoutKind, static: bool) -> ForwardInputs:
        """The batch's tensors as views of `buffer` (readouts and counts are filled in by `inputs`)."""
        ints = buffer[:self.int_bytes].view(torch.int64)
        block = ints[:self.rows * self.tokens].view(self.rows, self.tokens)
        pool = ints[self.rows * self.tokens:self.work_at].view(2, self.contributions)

        def row(name: str) -> torch.Tensor:
            return block[INT_ROWS.index(name) if name != "types" else len(INT_ROWS)]

        position_ids = row("positions")[None]
        tokens = TokenLayout(segment=row("segment"), context=row("context"), offset=row("offset"),
                             prefix=row("prefix"), positions=position_ids[0], parent=row("parent"))
        if self.work_block:
            tokens.work = ints[self.work_at:-1].view(self.work_items, WORK_FIELDS)
            tokens.work_count, tokens.work_block = ints[-1:], self.work_block
        return ForwardInputs(
            input_ids=row("ids")[None], position_ids=position_ids,
            token_type_ids=row("types")[None] if self.types else None,
            layout=AttentionLayout(kind=kind, tokens=tokens, static_shapes=static),
            pool_token_index=pool[0], pool_slot=pool[1], pool_weight=buffer[self.int_bytes:].view(torch.float32),
            readouts=[], num_tokens=0, rope_table=row("rope"))


def inputs(arrays: TokenArrays, kind: LayoutKind, static: bool, device: torch.device | None = None) -> ForwardInputs:
    """The host tensors of `arrays` (one buffer; `device`: built there through one pinned copy instead)."""
    staging = Staging.of(arrays)
    host = staging.buffer(torch.device("cpu"), pinned=device is not None and device.type == "cuda")
    staging.write(arrays, host)
    buffer = host if device is None or device.type == "cpu" else host.to(device, non_blocking=True)
    batch = staging.views(buffer, kind, static)
    describe(batch, arrays)
    return batch


def describe(batch: ForwardInputs, arrays: TokenArrays) -> None:
    """The host-side facts of a batch: its readouts and token counts."""
    batch.readouts = arrays.pools.readouts
    batch.num_tokens = arrays.live
    batch.padding_tokens = arrays.ints.shape[1] - arrays.live
    batch.pool_rows = arrays.pool_rows
