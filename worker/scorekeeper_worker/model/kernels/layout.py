"""The description of one packed batch that attention reads: row blocks (eager) or per-token rules (graph buckets).

A packed batch is one row of T tokens. Its layout, computed on the host (see `engine/runner/packing.py`), splits it into
- context rows: whole sequences (single-item scoring, encoders) or the shared queries of multi-item groups; each
  token attends within its own row (causally for decoders);
- item rows: the items of a multi-item group; an item token attends to its group's query (`item_contexts`: the
  query tokens items may see, without the delimiter) and to its own item (causally for decoders). Items never see
  each other, and in decoders (the only models serving sends multi-item units) a delimiter token is kept out of
  every other token's view by placing it last in its row, after every token that could see it;
- child item rows (decisions: an option's answer tokens after its question): an item that also sees every token of
  one earlier item of its group, its parent (`ItemBlock.parents`), so a group is a tree of depth two: query →
  question → options. The parent's tokens come between the query and the child in positions, as in the flat
  sequence `query + parent + child`.

The same rules can also be given per token (`TokenLayout`: segment, context segment, offset in row, visible prefix),
which has shapes that depend on the token count only: CUDA-graph buckets use it (`LayoutKind.DENSE` or
`LayoutKind.FLEX`; see `model/kernels/flex.py` and docs/gpu.md); a child item's tokens also name their parent's segment.
`token_allowed` is the one definition of who sees whom for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch


@dataclass
class RowBlock:
    """Rows padded to one length. `token_index[r, j]` is the packed index of the row's j-th token (0 when padding:
    attention zeroes the keys and values gathered there); `lengths[r]` how many are real; `positions[r, j]` the
    token's position id (for sliding windows); `write_index` the [R·L] packed index each row slot's output goes to
    (the spare row T for padding). `padded` (host-side) says whether any row is shorter than the block. `spans`
    (host-side): each row's (first packed index, length) when every row is a run of consecutive packed tokens, as
    whole sequences are (else empty); such rows can attend where they lie, without gathering them."""

    token_index: torch.Tensor  # [R, L] int64
    lengths: torch.Tensor  # [R] int64
    positions: torch.Tensor  # [R, L] int64
    write_index: torch.Tensor  # [R·L] int64
    padded: bool
    spans: tuple[tuple[int, int], ...] = ()


@dataclass
class ItemBlock(RowBlock):
    """Item rows of multi-item groups; `context[r]` indexes the rows of `AttentionLayout.item_contexts`. Child items
    come in blocks of their own, with `parents`: row r of it is the parent item of row r (its `write_index` unused)."""

    context: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [R]
    parents: RowBlock | None = None


class LayoutKind(StrEnum):
    BLOCKS = "blocks"  # row blocks (eager): cost N·I·(Q+I)
    DENSE = "dense"  # per-token metadata, masked tiles of queries × T per head (graph buckets, sdpa backend)
    FLEX = "flex"  # per-token metadata, FlexAttention with a block-sparse mask (model/kernels/flex.py)
    TRITON = "triton"  # per-token metadata and a work list: ranges of keys per block of queries (mis_attention.py)


@dataclass
class TokenLayout:
    """The attention rules per packed token (all [T] int64). Every row (a context row, or one item) is a segment,
    numbered in packed order; a token sees the earlier tokens of its own segment (all of them in encoders) and, for
    an item token, the first `prefix` tokens of segment `context` (its query) and, for a child item's token, every
    token of segment `parent`. Padding tokens are segments of their own (each sees only itself), numbered after
    every real segment."""

    segment: torch.Tensor
    context: torch.Tensor  # item tokens: their query's segment; everything else -1
    offset: torch.Tensor  # index of the token in its row
    prefix: torch.Tensor  # item tokens: how many leading tokens of `context` they see; else 0
    positions: torch.Tensor  # position ids (windows are distances in positions): a view of the batch's ids
    parent: torch.Tensor  # child item tokens: their parent item's segment (seen whole); everything else -1
    # The Triton kernel's work list (LayoutKind.TRITON): [W, 8] int64 rows of `work_block` queries each
    # (model/kernels/mis_attention.work_list), and how many of its rows are live ([1] int64).
    work: torch.Tensor | None = None
    work_count: torch.Tensor | None = None
    work_block: int = 0

    def tensors(self) -> list[torch.Tensor]:
        """The tensors this layout owns (`positions` belongs to the batch's position ids)."""
        work = [] if self.work is None or self.work_count is None else [self.work, self.work_count]
        return [self.segment, self.context, self.offset, self.prefix, self.parent, *work]


@dataclass
class AttentionLayout:
    """Host-computed description of one packed batch: row blocks (BLOCKS), or per-token rules (DENSE, FLEX)."""

    context_blocks: list[RowBlock] = field(default_factory=list)
    item_blocks: list[ItemBlock] = field(default_factory=list)
    item_contexts: RowBlock | None = None  # the query tokens each multi-item group's items see
    kind: LayoutKind = LayoutKind.BLOCKS
    tokens: TokenLayout | None = None
    static_shapes: bool = False  # graph-bucket inputs: shapes are a bucket's, so kernels may compile for them
    _cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def cached(self, key: tuple[object, ...], build: Callable[[], object]) -> object:
        """Masks depend on the layer's causality, window and dtype only: build each once per forward pass."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def reset(self) -> None:
        """Forget the masks of the previous forward pass. A layout whose tensors are refilled in place (CUDA-graph
        static buffers) must rebuild its masks from the new values, inside the pass (so a graph records the
        computation, never a mask of the warm-up data)."""
        self._cache.clear()


def token_allowed(tokens: TokenLayout, q: torch.Tensor, kv: torch.Tensor, causal: bool,
                  window: int | None) -> torch.Tensor:
    """Whether query token `q` may see key token `kv` (packed indices; any broadcastable shapes, so the same
    function fills a dense [T, T] mask and serves as FlexAttention's `mask_mod`). Mirrors the row-block rules:
    causality within a row follows packed order (positions increase along a row), an item token sees the first
    `prefix` tokens of its query row (which always precede it), a child item token every token of its parent item
    (which precedes it too), windows compare position ids."""
    segment = tokens.segment
    same = segment[q] == segment[kv]
    if causal:
        same = same & (kv <= q)
    allowed = same | ((tokens.context[q] == segment[kv]) & (tokens.offset[kv] < tokens.prefix[q]))
    allowed = allowed | (tokens.parent[q] == segment[kv])
    if window is not None:  # symmetric: causal rules already drop later keys
        allowed = allowed & ((tokens.positions[q] - tokens.positions[kv]).abs() < window)
    return allowed
