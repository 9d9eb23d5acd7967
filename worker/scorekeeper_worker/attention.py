"""Packed attention: document masking and multi-item scoring without a T×T mask.

A packed batch is one row of T tokens. Its layout, computed on the host (see `packing.py`), splits it into
- context rows: whole sequences (single-item scoring, encoders) or the shared queries of multi-item groups; each
  token attends within its own row (causally for decoders);
- item rows: the items of a multi-item group; an item token attends to its group's query (`item_contexts`: the
  query tokens items may see, without the delimiter) and, causally, to its own item. Items never see each other,
  and a delimiter token is kept out of every other token's view by placing it last in its row, after every token
  that could see it.

Rows are padded per block of similar lengths and gathered with fixed-size index tensors, so the cost grows with
N·I·(Q+I), never with T². Each block is one fused attention call (on CPU the flash kernel, which also returns the
log-sum-exp): decoder rows need no mask at all (rows are right-padded, so causality hides padding keys from every
real query), encoder rows a key-padding mask only where a block has padding, and an item's two views (its query,
itself) are two calls merged exactly by their log-sum-exps. Only softcapping (and non-CPU devices) take the
explicit float32 path. Nothing here reads a device value back to the host.

The same rules can also be given per token (`TokenLayout`: segment, context segment, offset in row, visible prefix),
which has shapes that depend on the token count only: CUDA-graph buckets use it (`LayoutKind.DENSE`, one masked
T×T tile per head, or `LayoutKind.FLEX`, FlexAttention with a block-sparse mask built from the same metadata; see
`attention_flex.py` and docs/gpu.md). `token_allowed` is the one definition of who sees whom for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch
from transformers import AttentionInterface

ATTENTION_NAME = "scorekeeper_packed"
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass
class RowBlock:
    """Rows padded to one length. `token_index[r, j]` is the packed index of the row's j-th token (0 when padding);
    `lengths[r]` how many are real; `positions[r, j]` the token's position id (for sliding windows); `write_index`
    the [R·L] packed index each row slot's output goes to (the spare row T for padding). `padded` (host-side)
    says whether any row is shorter than the block."""

    token_index: torch.Tensor  # [R, L] int64
    lengths: torch.Tensor  # [R] int64
    positions: torch.Tensor  # [R, L] int64
    write_index: torch.Tensor  # [R·L] int64
    padded: bool


@dataclass
class ItemBlock(RowBlock):
    """Item rows of multi-item groups; `context[r]` indexes the rows of `AttentionLayout.item_contexts`."""

    context: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [R]


class LayoutKind(StrEnum):
    BLOCKS = "blocks"  # row blocks (eager): cost N·I·(Q+I)
    DENSE = "dense"  # per-token metadata, one masked T×T tile per head (graph buckets with the sdpa backend)
    FLEX = "flex"  # per-token metadata, FlexAttention with a block-sparse mask (attention_flex.py)


@dataclass
class TokenLayout:
    """The attention rules per packed token (all [T] int64). Every row (a context row, or one item) is a segment,
    numbered in packed order; a token sees the earlier tokens of its own segment (all of them in encoders) and, for
    an item token, the first `prefix` tokens of segment `context` (its query). Padding tokens are segments of their
    own (each sees only itself), numbered after every real segment."""

    segment: torch.Tensor
    context: torch.Tensor  # item tokens: their query's segment; everything else -1
    offset: torch.Tensor  # index of the token in its row
    prefix: torch.Tensor  # item tokens: how many leading tokens of `context` they see; else 0
    positions: torch.Tensor  # position ids (windows are distances in positions): a view of the batch's ids

    def tensors(self) -> list[torch.Tensor]:
        """The tensors this layout owns (`positions` belongs to the batch's position ids)."""
        return [self.segment, self.context, self.offset, self.prefix]


@dataclass
class AttentionLayout:
    """Host-computed description of one packed batch: row blocks (BLOCKS), or per-token rules (DENSE, FLEX)."""

    context_blocks: list[RowBlock] = field(default_factory=list)
    item_blocks: list[ItemBlock] = field(default_factory=list)
    item_contexts: RowBlock | None = None  # the query tokens each multi-item group's items see
    kind: LayoutKind = LayoutKind.BLOCKS
    tokens: TokenLayout | None = None
    _bias_cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def bias(self, key: tuple[object, ...], build: Callable[[], object]) -> object:
        """Masks depend on the layer's causality, window and dtype only: build each once per forward pass."""
        if key not in self._bias_cache:
            self._bias_cache[key] = build()
        return self._bias_cache[key]

    def reset(self) -> None:
        """Forget the masks of the previous forward pass. A layout whose tensors are refilled in place (CUDA-graph
        static buffers) must rebuild its masks from the new values, inside the pass (so a graph records the
        computation, never a mask of the warm-up data)."""
        self._bias_cache.clear()


def token_allowed(tokens: TokenLayout, q: torch.Tensor, kv: torch.Tensor, causal: bool,
                  window: int | None) -> torch.Tensor:
    """Whether query token `q` may see key token `kv` (packed indices; any broadcastable shapes, so the same
    function fills a dense [T, T] mask and serves as FlexAttention's `mask_mod`). Mirrors the row-block rules:
    causality within a row follows packed order (positions increase along a row), an item token sees the first
    `prefix` tokens of its query row (which always precede it), windows compare position ids."""
    segment = tokens.segment
    same = segment[q] == segment[kv]
    if causal:
        same = same & (kv <= q)
    allowed = same | ((tokens.context[q] == segment[kv]) & (tokens.offset[kv] < tokens.prefix[q]))
    if window is not None:  # symmetric: causal rules already drop later keys
        allowed = allowed & ((tokens.positions[q] - tokens.positions[kv]).abs() < window)
    return allowed


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor, causal: bool,
             window: int | None) -> torch.Tensor:
    """[R, Lq, Lk] bool ([R, 1, Lk] when only key padding matters): which keys each query may see, from positions
    (so multi-item positions just work)."""
    allowed = k_valid[:, None, :]
    distance = q_pos[:, :, None] - k_pos[:, None, :]
    if causal:
        allowed = allowed & (distance >= 0)
    if window is not None:  # |distance|: encoders' local windows are symmetric (ModernBERT)
        allowed = allowed & (distance.abs() < window)
    return allowed


def _valid(block: RowBlock) -> torch.Tensor:
    return torch.arange(block.token_index.shape[1], device=block.lengths.device)[None, :] < block.lengths[:, None]


def _to_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, Lq or 1, Lk] bool → additive [R, 1, Lq or 1, Lk]. A finite minimum (not -inf) keeps a fully masked row
    finite, with a log-sum-exp near the minimum, so it weighs nothing in a merge; padding rows are never read."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def _rows(x: torch.Tensor, index: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """x [T, h, D] (token-major), index [R, L] → [R, h·groups, L, D] with one gather (K/V heads repeated for GQA)."""
    r, length = index.shape
    rows = x.index_select(0, index.reshape(-1)).view(r, length, x.shape[1], x.shape[2]).transpose(1, 2)
    return rows if groups == 1 else rows.repeat_interleave(groups, dim=1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
            scale: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, H, Lq, D] against [R, H, Lk, D] → (output [R, H, Lq, D], log-sum-exp [R, H, Lq] float32). `causal`
    (only with Lq = Lk and no bias) masks keys after the query; `bias` is additive in q's dtype."""
    if softcap is None and q.device.type == "cpu":
        return _flash_cpu(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
    return _attend_explicit(q, k, v, bias, causal, scale, softcap)


def _attend_explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
                     scale: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`_attend` in float32 with materialised scores: softcapping, other devices, and the DENSE graph layout (whose
    result must not depend on how far a bucket is padded, so no kernel tiling over the token count)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if softcap is not None:  # before the mask: tanh of a masked score would give it weight again
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.float()
    elif causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu_(1)
        scores = scores.masked_fill(future, torch.finfo(torch.float32).min)
    # softmax (not exp(scores - lse)): its result does not change when masked columns are appended.
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype), torch.logsumexp(scores, dim=-1)


def _merge(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Attention over the union of two disjoint key sets, from each set's output and log-sum-exp."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - top)[..., None], torch.exp(lse_b - top)[..., None]
    return ((out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)).to(out_a.dtype)


def _put(out: torch.Tensor, block: RowBlock, o: torch.Tensor) -> None:
    """Block output [R, H, L, D] → its tokens' rows of `out` [T + 1, H, D] (padding into the spare last row)."""
    r, heads, length, dim = o.shape
    out.index_copy_(0, block.write_index, o.transpose(1, 2).reshape(r * length, heads, dim))


def _item_to_query(q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, block: ItemBlock,
                   contexts: RowBlock, bias: torch.Tensor | None, scale: float,
                   softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The item tokens' view of their query. With one query for the whole batch (and no window bias) the items are
    folded into the query dimension: one call against the shared query K/V instead of R broadcast copies."""
    kc, vc = _rows(k, contexts.token_index, groups), _rows(v, contexts.token_index, groups)
    if contexts.token_index.shape[0] == 1 and (bias is None or bias.shape[0] == 1):
        r, heads, length, dim = q_rows.shape
        folded = q_rows.transpose(0, 1).reshape(1, heads, r * length, dim)
        o, lse = _attend(folded, kc, vc, bias, False, scale, softcap)
        return o[0].view(heads, r, length, dim).transpose(0, 1), lse[0].view(heads, r, length).transpose(0, 1)
    return _attend(q_rows, kc[block.context], vc[block.context], bias, False, scale, softcap)


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

    if layout.kind == LayoutKind.FLEX:
        from scorekeeper_worker.attention_flex import flex_packed_attention

        return flex_packed_attention(query, key, value, layout, causal, window, softcap, scale), None
    if layout.kind == LayoutKind.DENSE:
        assert layout.tokens is not None
        rules = layout.tokens
        index = torch.arange(tokens, device=q.device)
        bias = layout.bias(("dense", causal, window, q.dtype), lambda: _to_bias(
            token_allowed(rules, index[:, None], index[None, :], causal, window)[None], q.dtype))
        o, _lse = _attend_explicit(_rows(q, index[None]), _rows(k, index[None], groups), _rows(v, index[None], groups),
                          bias, False, scale, softcap)  # type: ignore[arg-type]
        return o.transpose(1, 2), None

    out = torch.empty(tokens + 1, heads, dim, dtype=q.dtype, device=q.device)  # row `tokens` takes padding
    for i, block in enumerate(layout.context_blocks):
        bias = None
        if window is not None or (block.padded and not causal):
            bias = layout.bias(("ctx", i, causal, window, q.dtype), lambda b=block: _to_bias(
                _allowed(b.positions, b.positions, _valid(b), causal, window), q.dtype))
        qr, kr, vr = (_rows(t, block.token_index, g) for t, g in ((q, 1), (k, groups), (v, groups)))
        _put(out, block, _attend(qr, kr, vr, bias, causal and bias is None, scale, softcap)[0])  # type: ignore[arg-type]

    contexts = layout.item_contexts
    for i, block in enumerate(layout.item_blocks):
        assert contexts is not None
        to_query_bias = to_item_bias = None
        if window is not None or contexts.padded:
            to_query_bias = layout.bias(("to-query", i, window, q.dtype), lambda b=block: _to_bias(_allowed(
                b.positions, contexts.positions[b.context], _valid(contexts)[b.context], False, window), q.dtype))
        if window is not None:
            to_item_bias = layout.bias(("item", i, window, q.dtype), lambda b=block: _to_bias(
                _allowed(b.positions, b.positions, _valid(b), True, window), q.dtype))
        qr, kr, vr = (_rows(t, block.token_index, g) for t, g in ((q, 1), (k, groups), (v, groups)))
        to_query = _item_to_query(qr, k, v, groups, block, contexts, to_query_bias, scale, softcap)  # type: ignore[arg-type]
        to_item = _attend(qr, kr, vr, to_item_bias, to_item_bias is None, scale, softcap)  # type: ignore[arg-type]
        _put(out, block, _merge(to_query, to_item))
    return out[:tokens].unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, packed_attention)
