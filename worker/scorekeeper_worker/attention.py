"""Packed attention: document masking and multi-item scoring without a T×T mask.

A packed batch is one row of T tokens. Its layout, computed on the host (see `packing.py`), splits it into
- context rows: whole sequences (single-item scoring, encoders) or the shared query of a multi-item group; each
  token attends within its own row (causally for decoders);
- item rows: the items of a multi-item group; an item token attends to its group's query (the first `prefix_len`
  tokens of the context row) and, causally, to its own item. Items never see each other, and a delimiter token is
  kept out of every other token's view by placing it last in its row, after every token that could see it.

Rows are padded per block of similar lengths and gathered with fixed-size index tensors, so the cost grows with
N·I·(Q+I), never with T², and nothing here reads a device value back to the host.

The same rules can also be given per token (`TokenLayout`: segment, context segment, offset in row, visible prefix),
which has shapes that depend on the token count only: CUDA-graph buckets use it (`LayoutKind.DENSE`, one masked
T×T tile per head, or `LayoutKind.FLEX`, FlexAttention with a block-sparse mask built from the same metadata; see
`attention_flex.py` and docs/gpu.md). `token_allowed` is the one definition of who sees whom for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch
from transformers import AttentionInterface

ATTENTION_NAME = "scorekeeper_packed"


@dataclass
class RowBlock:
    """Rows padded to one length. `token_index[r, j]` is the packed index of the row's j-th token (0 when padding);
    `lengths[r]` how many are real; `positions[r, j]` the token's position id, used for causal/window masks."""

    token_index: torch.Tensor  # [R, L] int64
    lengths: torch.Tensor  # [R] int64
    positions: torch.Tensor  # [R, L] int64


@dataclass
class ItemBlock(RowBlock):
    """Item rows of multi-item groups; `context[r]` indexes `AttentionLayout.item_contexts`, whose rows hold the
    queries; `prefix_lengths[r]` is how many leading tokens of that row the item may see (the query)."""

    context: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [R]
    prefix_lengths: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [R]


class LayoutKind(StrEnum):
    BLOCKS = "blocks"  # row blocks (eager, reference): cost N·I·(Q+I)
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
    """Host-computed description of one packed batch; `scatter_index[t]` is where token t's output sits in the
    concatenation of all blocks' flattened outputs (context blocks first, then item blocks). Token layouts (DENSE,
    FLEX) have no blocks and carry `tokens` instead."""

    context_blocks: list[RowBlock]
    item_blocks: list[ItemBlock]
    item_contexts: RowBlock | None
    scatter_index: torch.Tensor  # [T] int64
    kind: LayoutKind = LayoutKind.BLOCKS
    tokens: TokenLayout | None = None
    _bias_cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def bias(self, key: tuple[object, ...], build: callable) -> torch.Tensor:  # type: ignore[valid-type]
        """Masks depend on the layer's causality and window only: build each once per forward pass."""
        if key not in self._bias_cache:
            self._bias_cache[key] = build()
        return self._bias_cache[key]  # type: ignore[return-value]

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
    if window is not None:
        allowed = allowed & (tokens.positions[q] - tokens.positions[kv] < window)
    return allowed


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor, causal: bool,
             window: int | None) -> torch.Tensor:
    """[R, Lq, Lk] bool: which keys each query may see, from positions (so multi-item positions just work)."""
    allowed = k_valid[:, None, :].expand(-1, q_pos.shape[1], -1)
    distance = q_pos[:, :, None] - k_pos[:, None, :]
    if causal:
        allowed = allowed & (distance >= 0)
    if window is not None:
        allowed = allowed & (distance < window)
    return allowed


def _to_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A finite minimum (not -inf) keeps fully masked padding rows finite; their outputs are never read.
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None, None]  # [R, 1, 1, Lq, Lk]


def _valid(block: RowBlock) -> torch.Tensor:
    return torch.arange(block.token_index.shape[1], device=block.lengths.device)[None, :] < block.lengths[:, None]


def _gather(x: torch.Tensor, index: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[H, T, D] and [R, L] → [R, Hkv, H/Hkv, L, D] (grouped for GQA without repeating K/V)."""
    heads, _, dim = x.shape
    rows = x[:, index]  # [H, R, L, D]
    return rows.permute(1, 0, 2, 3).reshape(index.shape[0], kv_heads, heads // kv_heads, index.shape[1], dim)


def _softcapped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    # Before the mask is added: tanh of a masked score would bring it back to -softcap (a small nonzero weight).
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _with_shared_context(x: torch.Tensor, context: torch.Tensor, fn: callable) -> torch.Tensor:  # type: ignore[valid-type]
    """Apply `fn(x_rows, context_rows)` where every item row uses the same single context row, by folding items
    into the token dimension: one matmul against the shared query K/V instead of N broadcast copies of it."""
    rows, kv_heads, groups, length, width = x.shape
    folded = x.permute(1, 2, 0, 3, 4).reshape(kv_heads, groups, rows * length, width)
    out = fn(folded, context[0])
    return out.reshape(kv_heads, groups, rows, length, -1).permute(2, 0, 1, 3, 4)


def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     softcap: float | None = None, sliding_window: int | None = None,
                     scorekeeper_layout: AttentionLayout | None = None, **_: object) -> tuple[torch.Tensor, None]:
    """transformers attention function: q [1, H, T, D], k/v [1, Hkv, T, D] → ([1, T, H, D], None)."""
    if scorekeeper_layout is None:
        raise RuntimeError("packed attention needs `scorekeeper_layout`; run models through the executor")
    layout = scorekeeper_layout
    q, k, v = query[0], key[0], value[0]
    heads, _, dim = q.shape
    kv_heads = k.shape[0]
    scale = scaling if scaling is not None else dim**-0.5
    causal = bool(getattr(module, "is_causal", True))
    window = sliding_window
    outputs: list[torch.Tensor] = []

    def scores(qr: torch.Tensor, kr: torch.Tensor) -> torch.Tensor:
        return _softcapped((qr.float() @ kr.float().transpose(-1, -2)) * scale, softcap)

    if layout.kind == LayoutKind.FLEX:
        from scorekeeper_worker.attention_flex import flex_packed_attention

        return flex_packed_attention(query, key, value, layout, causal, window, softcap, scale), None
    if layout.kind == LayoutKind.DENSE:
        assert layout.tokens is not None
        tokens = layout.tokens
        index = torch.arange(q.shape[1], device=q.device)[None, :]  # one row holding the whole packed batch
        bias = layout.bias(("dense", causal, window), lambda: _to_bias(
            token_allowed(tokens, index[0, :, None], index[0, None, :], causal, window)[None], torch.float32))
        qr, kr, vr = (_gather(t, index, kv_heads) for t in (q, k, v))
        out = (torch.softmax(scores(qr, kr) + bias, dim=-1).to(vr.dtype) @ vr).to(q.dtype)
        return out.permute(0, 3, 1, 2, 4).reshape(1, -1, heads, dim), None

    for i, block in enumerate(layout.context_blocks):
        bias = layout.bias(("ctx", i, causal, window), lambda b=block: _to_bias(
            _allowed(b.positions, b.positions, _valid(b), causal, window), torch.float32))
        qr, kr, vr = (_gather(t, block.token_index, kv_heads) for t in (q, k, v))
        outputs.append((torch.softmax(scores(qr, kr) + bias, dim=-1).to(vr.dtype) @ vr).to(q.dtype))

    if layout.item_blocks:
        contexts = layout.item_contexts
        assert contexts is not None
        kc, vc = (_gather(t, contexts.token_index, kv_heads) for t in (k, v))
        shared = kc.shape[0] == 1
        for i, block in enumerate(layout.item_blocks):
            def build(b: ItemBlock = block) -> torch.Tensor:
                ctx_pos = contexts.positions[b.context]
                ctx_valid = torch.arange(ctx_pos.shape[1], device=ctx_pos.device)[None, :] < b.prefix_lengths[:, None]
                to_ctx = _allowed(b.positions, ctx_pos, ctx_valid, causal, window)
                to_item = _allowed(b.positions, b.positions, _valid(b), causal, window)
                return _to_bias(torch.cat([to_ctx, to_item], dim=-1), torch.float32)

            bias = layout.bias(("item", i, causal, window), build)
            qr, kr, vr = (_gather(t, block.token_index, kv_heads) for t in (q, k, v))
            to_query = _with_shared_context(qr, kc, scores) if shared else scores(qr, kc[block.context])
            probs = torch.softmax(torch.cat([to_query, scores(qr, kr)], dim=-1) + bias, dim=-1).to(vr.dtype)
            p_query, p_item = probs.split([kc.shape[-2], kr.shape[-2]], dim=-1)
            from_query = _with_shared_context(p_query, vc, torch.matmul) if shared else p_query @ vc[block.context]
            outputs.append((from_query + p_item @ vr).to(q.dtype))

    # Every block output is [R, Hkv, G, L, D]; flatten to [(R·L), H, D] rows and pick each token's row.
    flat = torch.cat([o.permute(0, 3, 1, 2, 4).reshape(-1, heads, dim) for o in outputs], dim=0)
    return flat[layout.scatter_index].unsqueeze(0), None


AttentionInterface.register(ATTENTION_NAME, packed_attention)
