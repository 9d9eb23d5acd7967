"""FlexAttention backend: packed sequences and multi-item scoring with a block-sparse mask, never a dense T×T mask.

Input is a token layout (`attention.TokenLayout`, built on the host by `packing.build_inputs`). From it, on the
device and with tensor ops only (so it is recorded inside a CUDA graph and recomputed at every replay), we derive:
- `mask_mod`: `attention.token_allowed`, the same rule the dense and row-block paths use;
- the block tables of a `BlockMask` (128×128 tiles): a tile is skipped when no query of it can see any key of it
  (the segment ranges of the queries' own rows, query rows and parent items do not meet the keys'; later keys under
  causality; out of the window), computed without a mask_mod pass, and "full" (no mask_mod evaluated) when every
  pair is allowed: both tiles inside one segment with all keys before all queries, or item queries of one query row
  against keys of that query's visible prefix. Everything else is
  "partial" and masked per element, so a tile classified too coarsely costs time, never correctness. On a GPU
  the kernel reads these tables at run time, so a graph bucket pays for the live tiles, not for its full size.

On CUDA, `flex_attention` is compiled through Triton (`torch.compile`, dynamic shapes: one compile serves every
token count); on CPU it runs eagerly (it materializes the scores: a test and reference path, not a fast one).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from scorekeeper_worker.model.kernels.layout import AttentionLayout, TokenLayout, token_allowed

log = logging.getLogger(__name__)

BLOCK_SIZE = 128  # FlexAttention's tile size (its default)
MIN_HEAD_DIM = 16  # Triton's dot products need K >= 16: smaller heads are zero-padded (dot products unchanged)
# Compiled variants of flex_attention one process may need: dtypes × head layouts × score_mods × graph/eager. Past
# torch's default of 8, dynamo silently runs flex_attention unfused: slow, and it copies host scalars, which a
# CUDA-graph capture refuses (seen on an H200 when one process loaded several models).
RECOMPILE_LIMIT = 64
_compiled: Any = None


def _flex(device: torch.device) -> Any:
    global _compiled
    if device.type != "cuda":
        return flex_attention
    if _compiled is None:
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        _compiled = torch.compile(flex_attention, dynamic=True)
    return _compiled


@functools.cache
def _softcap_tensor(value: float, device: torch.device) -> torch.Tensor:
    """The soft-capping constant as a device tensor that `score_mod` captures. A Python float in the closure becomes,
    under dynamic shapes, a host float64 scalar copied to the GPU at every call: a CUDA-graph capture refuses that
    copy, and Inductor's lowering of flex_attention fails on it (seen on an H200). One tensor per value, reused."""
    return torch.full((), value, dtype=torch.float32, device=device)


def flex_available(device: torch.device) -> tuple[bool, str]:
    """Whether the flex backend can run fast on `device` (CUDA with Triton), and why not."""
    if device.type != "cuda":
        return False, "FlexAttention is compiled for GPUs only; on CPU it runs unfused (reference speed)"
    if importlib.util.find_spec("triton") is None:
        return False, "Triton is not installed (pip install 'scorekeeper[gpu]')"
    return True, ""


def resolve_backend(name: str, device: torch.device) -> str:
    """`--attention-backend` → "sdpa" or "flex". auto: flex on CUDA when Triton is there, else the row-block
    (SDPA-style) reference path. An explicit flex on CPU runs eagerly (tests); on CUDA without Triton it is an
    error, named at start-up."""
    available, why = flex_available(device)
    if name == "auto":
        chosen = "flex" if available else "sdpa"
        log.info("attention backend: %s (auto on %s%s)", chosen, device.type, f"; flex: {why}" if why else "")
        return chosen
    if name == "flex" and device.type == "cuda" and not available:
        raise ValueError(f"--attention-backend flex: {why}")
    log.info("attention backend: %s", name)
    return name


def _padded_tokens(tokens: TokenLayout, length: int) -> TokenLayout:
    """Metadata padded to `length` (a multiple of the tile size): the kernel evaluates mask_mod on whole tiles, so
    indices past the sequence must read valid entries. Padding is one new segment per index, after every other."""
    extra = length - tokens.segment.shape[0]
    if extra == 0:
        return tokens
    segment = tokens.segment
    tail = segment[-1:] + 1 + torch.arange(extra, device=segment.device)
    return TokenLayout(
        segment=torch.cat([segment, tail]),
        context=F.pad(tokens.context, (0, extra), value=-1),
        offset=F.pad(tokens.offset, (0, extra)),
        prefix=F.pad(tokens.prefix, (0, extra)),
        positions=F.pad(tokens.positions, (0, extra)),
        parent=F.pad(tokens.parent, (0, extra), value=-1),
    )


def block_tables(tokens: TokenLayout, causal: bool, window: int | None,
                 block_size: int = BLOCK_SIZE) -> tuple[TokenLayout, torch.Tensor, torch.Tensor]:
    """(padded metadata, partial [nQ, nK] bool, full [nQ, nK] bool) for `tokens`. Conservative by construction:
    every allowed (query, key) pair lies in a partial or full tile, and a full tile allows every pair."""
    length = tokens.segment.shape[0]
    blocks = max(1, -(-length // block_size))
    padded = _padded_tokens(tokens, blocks * block_size)
    device = padded.segment.device

    def per_block(x: torch.Tensor) -> torch.Tensor:
        return x.view(blocks, block_size)

    segment = per_block(padded.segment)
    visible = per_block(torch.where(padded.context >= 0, padded.context, padded.segment))
    parent = per_block(torch.where(padded.parent >= 0, padded.parent, padded.segment))
    seg_lo, seg_hi = segment.amin(1), segment.amax(1)
    vis_lo, vis_hi = visible.amin(1), visible.amax(1)
    par_lo, par_hi = parent.amin(1), parent.amax(1)
    pos_lo, pos_hi = per_block(padded.positions).amin(1), per_block(padded.positions).amax(1)
    q_block = torch.arange(blocks, device=device)[:, None]
    k_block = torch.arange(blocks, device=device)[None, :]

    def meets(q_lo: torch.Tensor, q_hi: torch.Tensor) -> torch.Tensor:  # query tiles' range vs keys' segments
        return (seg_lo[None, :] <= q_hi[:, None]) & (q_lo[:, None] <= seg_hi[None, :])

    nonempty = meets(seg_lo, seg_hi) | meets(vis_lo, vis_hi) | meets(par_lo, par_hi)
    if causal:
        nonempty = nonempty & (k_block <= q_block)
    if window is not None:  # symmetric windows: a key may also be ahead of the query (encoders)
        nonempty = nonempty & (pos_lo[:, None] - pos_hi[None, :] < window)
        nonempty = nonempty & (pos_lo[None, :] - pos_hi[:, None] < window)

    single = seg_lo == seg_hi
    same_row = single[:, None] & single[None, :] & (seg_lo[:, None] == seg_lo[None, :])
    if causal:
        same_row = same_row & (k_block < q_block)
    items = per_block(padded.context >= 0).all(1) & (vis_lo == vis_hi)
    query_prefix = (items[:, None] & single[None, :] & (vis_lo[:, None] == seg_lo[None, :])
                    & (per_block(padded.offset).amax(1)[None, :] < per_block(padded.prefix).amin(1)[:, None]))
    complete = (torch.arange(blocks, device=device) + 1) * block_size <= length
    full = (same_row | query_prefix) & complete[:, None] & complete[None, :] & nonempty
    if window is not None:
        full = full & (pos_hi[:, None] - pos_lo[None, :] < window) & (pos_hi[None, :] - pos_lo[:, None] < window)
    return padded, nonempty & ~full, full


def _ordered(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nQ, nK] bool → BlockMask's (counts [1, 1, nQ], indices [1, 1, nQ, nK]): listed tiles first, in order."""
    counts = mask.sum(-1, dtype=torch.int32)
    indices = torch.argsort(mask.to(torch.int32), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def flex_block_mask(tokens: TokenLayout, causal: bool, window: int | None,
                    block_size: int = BLOCK_SIZE) -> BlockMask:
    length = tokens.segment.shape[0]
    padded, partial, full = block_tables(tokens, causal, window, block_size)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return token_allowed(padded, q, kv, causal, window)

    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(length, length), compute_q_blocks=False)


def flex_packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: AttentionLayout,
                          causal: bool, window: int | None, softcap: float | None, scale: float) -> torch.Tensor:
    """q [1, H, T, D], k/v [1, Hkv, T, D] → [1, T, H, D]."""
    tokens = layout.tokens
    assert tokens is not None
    block_mask = layout.cached(("flex", causal, window), lambda: flex_block_mask(tokens, causal, window))
    dim = query.shape[-1]
    if dim < MIN_HEAD_DIM:
        query, key, value = (F.pad(t, (0, MIN_HEAD_DIM - dim)) for t in (query, key, value))

    score_mod = None
    if softcap is not None:
        cap = _softcap_tensor(softcap, query.device)

        def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                      kv: torch.Tensor) -> torch.Tensor:
            return torch.tanh(score / cap) * cap

    out = _flex(query.device)(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=query.shape[1] != key.shape[1])
    return out[..., :dim].transpose(1, 2)
