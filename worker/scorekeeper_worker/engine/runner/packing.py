"""Units of packing (what the planner hands the engine), the shapes of CUDA-graph buckets, the tensors of one packed
batch (`ForwardInputs`), a batch's pools, and `to_device`. Batches are packed on the host, by the token packer
(engine/runner/token_packing.py) or the row-block packer (engine/runner/row_blocks.py): the only places Python lists
become tensors. `to_device` moves them through pinned memory with non-blocking copies, so that packing the next
batch never waits for the device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from scorekeeper_worker.model.kernels.attention import AttentionLayout


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
    padding contributions add into. `pooled_tokens`: the pool contributions a batch may have; mean pooling
    contributes every token of a sequence (`tokens + sequences`, the default), last-token and CLS pooling one per
    slot (`sequences`), so their pool gathers only the rows it reads."""

    tokens: int
    sequences: int
    token_types: bool = False  # whether the model takes token_type_ids (the buffer exists for every batch then)
    pad_token: int = 0  # id of padding tokens: any id works, nothing attends to padding
    pooled_tokens: int | None = None
    work_block: int = 0  # LayoutKind.TRITON: queries per item of the kernel's work list (0: no work list)

    @property
    def contributions(self) -> int:
        return self.tokens + self.sequences if self.pooled_tokens is None else self.pooled_tokens

    @property
    def segments(self) -> int:
        """With a work list: the most segments (context rows and items) a batch may have."""
        return 2 * self.sequences

    @property
    def work_items(self) -> int:
        """Rows of the work list (0: none): a work item per block of a segment's queries, at most this many."""
        return -(-self.tokens // self.work_block) + self.segments if self.work_block else 0


def fits(units: list[PackUnit], shape: GraphShape) -> bool:
    """Whether a batch fits a bucket's buffers."""
    pools = [pool for unit in units for pool in unit.pools]
    segments = sum(1 + len(u.items) for u in units) if shape.work_block else 0
    return (sum(u.num_tokens for u in units) <= shape.tokens and len(pools) <= shape.sequences
            and sum(len(p.offsets) for p in pools) <= shape.contributions and segments <= shape.segments)


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
    # Row blocks: the distinct pooled tokens (ascending) and each contribution's index among them, found on the host
    # so that a trunk that computes only the pooled rows after the last attention needs no device read.
    pooled_tokens: torch.Tensor | None = None
    pooled_index: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a forward pass reads, in a fixed order (CUDA-graph static buffers are refilled from it)."""
        tokens = self.layout.tokens.tensors() if self.layout.tokens is not None else []
        types = [] if self.token_type_ids is None else [self.token_type_ids]
        return [self.input_ids, self.position_ids, *types, *tokens, self.rope_table, self.pool_token_index,
                self.pool_slot, self.pool_weight]


@dataclass
class Pools:
    """A batch's pool contributions (packed token, pooled-vector slot, mean weight) and one readout per pool."""

    token: np.ndarray  # [M] int64
    slot: np.ndarray  # [M] int64
    weight: np.ndarray  # [M] float32
    readouts: list[Readout]


def pools(units: list[PackUnit], starts: list[int]) -> Pools:
    """The pools of `units`, unit `i` starting at packed token `starts[i]`; readouts in unit and pool order."""
    first, count, step, readouts = [], [], [], []
    for index, (unit, start) in enumerate(zip(units, starts, strict=True)):
        for pool in unit.pools:
            first.append(start + pool.offsets.start)
            count.append(len(pool.offsets))
            step.append(pool.offsets.step)
            readouts.append(Readout(index, pool.slot))
    counts = np.array(count, dtype=np.int64)
    total = int(counts.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    token = np.repeat(np.array(first, dtype=np.int64), counts) + within * np.repeat(np.array(step, np.int64), counts)
    weight = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)  # float64 1/n, rounded to float32
    return Pools(token, np.repeat(np.arange(len(counts), dtype=np.int64), counts), weight, readouts)


def _moved(value: object, device: torch.device, pinned: bool) -> object:
    if isinstance(value, torch.Tensor):
        if pinned:
            return value.pin_memory().to(device, non_blocking=True)
        return value.to(device)
    if isinstance(value, list):
        return [_moved(v, device, pinned) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _moved(getattr(value, f.name), device, pinned) for f in dataclasses.fields(value)
                   if f.init and not f.name.startswith("_")}
        return dataclasses.replace(value, **changes)
    return value


def to_device(inputs: ForwardInputs, device: torch.device) -> ForwardInputs:
    """Host-built inputs on `device` (themselves on the CPU). On CUDA every tensor goes through pinned memory with a
    non-blocking copy: a copy from pageable memory would first wait for the work already queued on the device.
    Views stay views (a token layout's positions are the batch's position ids)."""
    if device.type == "cpu":
        return inputs
    moved = _moved(inputs, device, device.type == "cuda")
    assert isinstance(moved, ForwardInputs)
    if moved.layout.tokens is not None:
        moved.layout.tokens.positions = moved.position_ids[0]
    return moved
