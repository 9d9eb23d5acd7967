"""A prototype of the attention change proposed for worker/scorekeeper_worker/attention.py (not used by the worker).

`bench/profile_worker.py --proto` swaps it in for the registered `scorekeeper_packed` attention to measure what the
change buys end to end and to check that scores stay the same. Same inputs (the host-built `AttentionLayout`), but:

- blocks run through fused flash kernels (`scaled_dot_product_attention` / the CPU flash op that also returns the
  log-sum-exp) instead of materialising float32 [R, H, L, L] scores, scaling, adding a bias and a softmax;
- decoders need no mask at all: rows are right-padded, so causal masking already hides every padding key from
  every real query (positions inside a row are consecutive);
- encoders get only a key-padding mask [R, 1, 1, L], and none for blocks without padding;
- multi-item rows (one shared query): item→query attention for all items at once (items folded into the query
  dimension, no mask) and causal attention inside each item (batched over items, no mask), merged exactly by
  their log-sum-exp;
- q/k/v are gathered with one `index_select` from the token-major layout, and outputs are written straight to
  their tokens with one `index_copy_` (padding goes to a spare row) instead of `cat` + a scatter gather.

Falls back to the original for softcap, sliding windows, and batches whose items see different queries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scorekeeper_worker.attention import AttentionLayout, RowBlock, packed_attention

_flash_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [T, h, D] (token-major), index [R, L] → [R, h, L, D] with one gather."""
    r, length = index.shape
    return x.index_select(0, index.reshape(-1)).view(r, length, x.shape[1], x.shape[2]).transpose(1, 2)


def _valid(block: RowBlock) -> torch.Tensor:
    return torch.arange(block.token_index.shape[1], device=block.lengths.device)[None, :] < block.lengths[:, None]


def _put(out: torch.Tensor, block: RowBlock, o: torch.Tensor, spare: int) -> None:
    """o [R, H, L, D] → out[token] for the block's real tokens; padding lands in the spare row `spare`."""
    r, heads, length, dim = o.shape
    target = torch.where(_valid(block), block.token_index, spare).reshape(-1)
    out.index_copy_(0, target, o.transpose(1, 2).reshape(r * length, heads, dim))


def _repeat_kv(x: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def packed_attention_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          softcap: float | None = None, sliding_window: int | None = None,
                          scorekeeper_layout: AttentionLayout | None = None, **kwargs: object
                          ) -> tuple[torch.Tensor, None]:
    layout = scorekeeper_layout
    shared = layout is not None and (not layout.item_blocks or (
        layout.item_contexts is not None and layout.item_contexts.token_index.shape[0] == 1))
    if layout is None or softcap is not None or sliding_window is not None or not shared:
        return packed_attention(module, query, key, value, attention_mask, scaling, dropout, softcap,
                                sliding_window, scorekeeper_layout=layout, **kwargs)
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, h, D]
    tokens, heads, dim = q.shape
    groups = heads // k.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    causal = bool(getattr(module, "is_causal", True))
    out = torch.empty(tokens + 1, heads, dim, dtype=q.dtype, device=q.device)  # row `tokens` takes padding

    for block in layout.context_blocks:
        qr = _rows(q, block.token_index)
        kr, vr = (_repeat_kv(_rows(t, block.token_index), groups, 1) for t in (k, v))
        mask = None
        if not causal and int(block.lengths.min()) < block.token_index.shape[1]:
            mask = _valid(block)[:, None, None, :]  # [R, 1, 1, L] key padding
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, is_causal=causal, scale=scale)
        _put(out, block, o, tokens)

    if layout.item_blocks:
        contexts = layout.item_contexts
        assert contexts is not None
        prefix = int(layout.item_blocks[0].prefix_lengths[0])
        context_tokens = contexts.token_index[0, :prefix]
        kc, vc = (_repeat_kv(t.index_select(0, context_tokens).transpose(0, 1), groups, 0)[None] for t in (k, v))
        for block in layout.item_blocks:
            r, length = block.token_index.shape
            qr = _rows(q, block.token_index)  # [R, H, L, D]
            folded = qr.transpose(0, 1).reshape(1, heads, r * length, dim)
            o1, lse1 = _flash_with_lse(folded, kc, vc, 0.0, False, scale=scale)  # items → the shared query
            kr, vr = (_repeat_kv(_rows(t, block.token_index), groups, 1) for t in (k, v))
            o2, lse2 = _flash_with_lse(qr, kr, vr, 0.0, causal, scale=scale)  # inside each item
            o1 = o1[0].view(heads, r, length, dim).transpose(0, 1)
            lse1 = lse1[0].view(heads, r, length).transpose(0, 1)
            top = torch.maximum(lse1, lse2)
            w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
            o = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
            _put(out, block, o.to(q.dtype), tokens)
    return out[:tokens].unsqueeze(0), None
