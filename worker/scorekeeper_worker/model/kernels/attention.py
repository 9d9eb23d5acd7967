"""Packed attention: document masking and multi-item scoring without a T×T mask.

A packed batch is one row of T tokens, described by an `AttentionLayout` (`model/kernels/layout.py`): context rows
(whole sequences, or the shared queries of multi-item groups) and item rows (the items of a multi-item group, which
see their query and, causally, themselves). Rows are padded per block of similar lengths and gathered with
fixed-size index tensors, so the cost grows with N·I·(Q+I), never with T² (on CPU, context rows of whole sequences of
at least 64 tokens attend where they lie in the packed row instead, one fused call per row). Each block is one
attention call (`attention_kernels.tiled`: on CPU the fused flash kernel, which also returns the log-sum-exp):
decoder rows need no mask at all (rows are right-padded, so causality hides padding keys from every real query),
encoder rows a key-padding mask only where a block has padding, sliding windows a mask from position ids, and an
item's two views (its query, itself; a child item's three, with its parent item) are calls merged exactly by their
log-sum-exps. Softcapping (and non-CPU devices) take the explicit float32 path. Any mask or explicit score matrix
is built one tile of queries at a time, so memory is bounded by the tile, not by the square of the longest row.
Nothing here reads a device value back to the host.

Masked keys add exactly nothing, whatever their values: every kernel still multiplies a masked key's value by its
weight 0, and 0 × inf is NaN (one float16 request that overflows would turn its neighbours' rows NaN). So padding
slots of row blocks hold zero keys and values, never packed token 0, and the layouts that put other requests' keys in
a query's tiles (dense, flex) first zero every non-finite value and make its key NaN (`tiled.masked_values`), which
the mask removes where the key is masked and keeps where it is seen. The Triton kernel only loads its own ranges.

CUDA-graph buckets use the per-token rules instead (`LayoutKind.DENSE`: explicit tiles of a fixed number of
queries against the whole bucket, so the result does not depend on how far a bucket is padded; `LayoutKind.FLEX`,
FlexAttention with a block-sparse mask: `model/kernels/flex.py`; or `LayoutKind.TRITON`, ranges of keys per block of
queries: `model/kernels/mis_attention.py`, with flex for layers it does not cover; docs/gpu.md).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from scorekeeper_worker.model.kernels import mis_attention
from scorekeeper_worker.model.kernels.flex import flex_packed_attention
from scorekeeper_worker.model.kernels.layout import (
    AttentionLayout,
    ItemBlock,
    LayoutKind,
    RowBlock,
    TokenLayout,
    token_allowed,
)
from scorekeeper_worker.model.kernels.tiled import (
    Mask,
    RowMask,
    attend,
    attend_output,
    attend_spans,
    in_place,
    masked_values,
    merge,
)

__all__ = ["ATTENTION_NAME", "AttentionLayout", "ItemBlock", "LayoutKind", "RowBlock", "TokenLayout",
           "packed_attention", "token_allowed"]

ATTENTION_NAME = "scorekeeper_packed"
DENSE_QUERY_ROWS = 256  # queries per explicit tile of a graph bucket: fixed, so padding a bucket changes no tile


class TokenMask(Mask):
    """The per-token rules of a graph bucket (`token_allowed`) for tiles of queries against every token."""

    def __init__(self, tokens: TokenLayout, causal: bool, window: int | None) -> None:
        super().__init__()
        self.tokens, self.causal, self.window = tokens, causal, window
        self.index = torch.arange(tokens.segment.shape[0], device=tokens.segment.device)

    def allowed(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        index = self.index
        return token_allowed(self.tokens, index[q0:q1, None], index[None, k0:k1], self.causal, self.window)[None]


def _valid(block: RowBlock) -> torch.Tensor:
    return torch.arange(block.token_index.shape[1], device=block.lengths.device)[None, :] < block.lengths[:, None]


def _rows(x: torch.Tensor, index: torch.Tensor, groups: int = 1, valid: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, h, D] (token-major), index [R, L] → [R, h·groups, L, D] with one gather (K/V heads repeated for GQA).
    `valid` [R, L] (a padded block's keys and values): padding slots, which gathered packed token 0, are zeroed."""
    r, length = index.shape
    rows = x.index_select(0, index.reshape(-1)).view(r, length, x.shape[1], x.shape[2])
    if valid is not None:
        rows = rows.masked_fill_(~valid[..., None, None], 0)
    rows = rows.transpose(1, 2)
    return rows if groups == 1 else rows.repeat_interleave(groups, dim=1)


def _key_rows(k: torch.Tensor, v: torch.Tensor, block: RowBlock, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's keys and values, its padding zero: every kernel still multiplies a masked key by its weight 0, and
    0 × inf is NaN, so padding must not hold packed token 0, another request's token, whose values may overflow."""
    valid = _valid(block) if block.padded else None
    return _rows(k, block.token_index, groups, valid), _rows(v, block.token_index, groups, valid)


def _put(out: torch.Tensor, block: RowBlock, o: torch.Tensor) -> None:
    """Block output [R, H, L, D] → its tokens' rows of `out` [T + 1, H, D] (padding into the spare last row)."""
    r, heads, length, dim = o.shape
    out.index_copy_(0, block.write_index, o.transpose(1, 2).reshape(r * length, heads, dim))


def _to_query_mask(block: ItemBlock, contexts: RowBlock, window: int | None) -> RowMask | None:
    """Item tokens against their query's keys: a window, or the padding of query rows (else nothing to mask).
    Folded (one query row for the batch, see `_item_to_query`): one row of every item token."""
    if window is None and not contexts.padded:
        return None
    valid = _valid(contexts) if contexts.padded else None
    if contexts.token_index.shape[0] == 1:
        return RowMask(block.positions.reshape(1, -1), contexts.positions, valid, False, window, contiguous=False)
    return RowMask(block.positions, contexts.positions[block.context], None if valid is None else valid[block.context],
                   False, window, contiguous=False)


def _to_parent_mask(block: ItemBlock, window: int | None) -> RowMask | None:
    """Child item tokens against their parent item's keys (all earlier): a window, or the parents' padding."""
    parents = block.parents
    assert parents is not None
    if window is None and not parents.padded:
        return None
    return RowMask(block.positions, parents.positions, _valid(parents) if parents.padded else None, False, window,
                   contiguous=False)


def _item_to_query(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, block: ItemBlock, contexts: RowBlock,
                   mask: RowMask | None, scale: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The item tokens' view of their query (`kc`, `vc`: the query rows' keys and values, gathered once per layer
    for every item block). With one query for the whole batch the items are folded into the query dimension: one
    call against the shared query K/V instead of R broadcast copies."""
    if contexts.token_index.shape[0] == 1:
        r, heads, length, dim = q_rows.shape
        folded = q_rows.transpose(0, 1).reshape(1, heads, r * length, dim)
        o, lse = attend(folded, kc, vc, mask, False, scale, softcap)
        return o[0].view(heads, r, length, dim).transpose(0, 1), lse[0].view(heads, r, length).transpose(0, 1)
    return attend(q_rows, kc[block.context], vc[block.context], mask, False, scale, softcap)


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     softcap: float | None = None, sliding_window: int | None = None,
                     scorekeeper_layout: AttentionLayout | None = None, **_: object) -> tuple[torch.Tensor, None]:
    """transformers attention function: q [1, H, T, D], k/v [1, Hkv, T, D] → ([1, T, H, D], None)."""
    if scorekeeper_layout is None:
        raise RuntimeError("packed attention needs `scorekeeper_layout`; run models through the executor")
    layout = scorekeeper_layout
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, h, D]
    tokens, heads, dim = q.shape
    groups = heads // k.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    causal = bool(getattr(module, "is_causal", True))
    window = sliding_window

    if layout.kind == LayoutKind.TRITON and window is None and softcap is None:
        rules = layout.tokens
        assert rules is not None and rules.work is not None and rules.work_count is not None
        return mis_attention.mis_attention(query, key, value, rules.work, rules.work_count, causal, scale,
                                           rules.work_block), None
    if layout.kind in (LayoutKind.FLEX, LayoutKind.TRITON):  # flex keeps windows and softcapping
        return flex_packed_attention(query, key, value, layout, causal, window, softcap, scale), None
    if layout.kind == LayoutKind.DENSE:
        assert layout.tokens is not None
        rules = layout.tokens
        index = torch.arange(tokens, device=q.device)
        mask = layout.cached(("dense", causal, window), lambda: TokenMask(rules, causal, window))
        k, v = masked_values(k, v)  # every query's tile holds every token of the bucket, other requests' too
        o, _lse = attend(_rows(q, index[None]), _rows(k, index[None], groups), _rows(v, index[None], groups),
                         mask, False, scale, softcap, explicit=True, query_rows=DENSE_QUERY_ROWS)  # type: ignore[arg-type]
        return o.transpose(1, 2), None

    out = torch.empty(tokens + 1, heads, dim, dtype=q.dtype, device=q.device)  # row `tokens` takes padding
    for i, block in enumerate(layout.context_blocks):
        if block.spans and in_place(q.device, softcap, window, block.token_index.shape[1]):
            attend_spans(query, key, value, block.spans, out, causal, scale)
            continue
        mask = layout.cached(("ctx", i, causal, window), lambda b=block: RowMask(
            b.positions, b.positions, _valid(b) if b.padded else None, causal, window, contiguous=True))
        qr, (kr, vr) = _rows(q, block.token_index), _key_rows(k, v, block, groups)
        _put(out, block, attend_output(qr, kr, vr, mask, causal, scale, softcap))  # type: ignore[arg-type]

    contexts = layout.item_contexts
    if contexts is not None:  # every item block reads the same query rows: gather them once
        kc, vc = _key_rows(k, v, contexts, groups)
    for i, block in enumerate(layout.item_blocks):
        assert contexts is not None
        to_query_mask = layout.cached(("to-query", i, window), lambda b=block: _to_query_mask(b, contexts, window))
        # An item sees its own tokens as its model sees a row (causally in decoders), as `token_allowed` says.
        mask = layout.cached(("item", i, causal, window), lambda b=block: RowMask(
            b.positions, b.positions, _valid(b) if b.padded else None, causal, window, contiguous=True))
        qr, (kr, vr) = _rows(q, block.token_index), _key_rows(k, v, block, groups)
        to_query = _item_to_query(qr, kc, vc, block, contexts, to_query_mask, scale, softcap)  # type: ignore[arg-type]
        to_item = attend(qr, kr, vr, mask, causal, scale, softcap)  # type: ignore[arg-type]
        if block.parents is None:
            _put(out, block, merge(to_query, to_item))
            continue
        parent_mask = layout.cached(("to-parent", i, window), lambda b=block: _to_parent_mask(b, window))
        kp, vp = _key_rows(k, v, block.parents, groups)
        to_parent = attend(qr, kp, vp, parent_mask, False, scale, softcap)  # type: ignore[arg-type]
        _put(out, block, merge(to_query, to_parent, to_item))
    return out[:tokens].unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, packed_attention)
