"""FlexAttention backend: packed sequences and multi-item scoring with a block-sparse mask, never a dense T×T mask.

Input is a token layout (`attention.TokenLayout`, built on the host by `packing.build_inputs`). From it, on the
device and with tensor ops only (so it is recorded inside a CUDA graph and recomputed at every replay), we derive:
- `mask_mod`: `attention.token_allowed`, the same rule the dense and row-block paths use;
- the block tables of a `BlockMask` (128×128 tiles), exact without windows: each query token sees at most three
  ranges of packed indices (its own row up to itself, its query's visible prefix, its parent item), so a tile is
  listed exactly when some query's range meets it, and "full" (no mask_mod evaluated) when every query of the tile
  covers the key tile with one range; [T, nK] work per range, no mask_mod pass. Windows only drop tiles out of
  positional reach (conservative). Everything else is "partial" and masked per element, so a tile classified too
  coarsely costs time, never correctness. On a GPU the kernel reads these tables at run time, so a graph bucket
  pays for the live tiles, not for its full size. (The earlier tables compared segment-number ranges per tile and
  listed 280 tiles of the SGLang benchmark's 8,192-token bucket where 235 hold an allowed pair.)

On CUDA, `flex_attention` is compiled through Triton (`torch.compile`; static shapes for graph buckets, one kernel
per bucket size; dynamic shapes for eager batches, one compile for every token count); on CPU it runs eagerly (it
materializes the scores: a test and reference path, not a fast one).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from scorekeeper_worker.model.kernels.layout import AttentionLayout, TokenLayout, token_allowed
from scorekeeper_worker.model.kernels.tiled import masked_values

log = logging.getLogger(__name__)

BLOCK_SIZE = 128  # FlexAttention's tile size (its default)
MIN_HEAD_DIM = 16  # Triton's dot products need K >= 16: smaller heads are zero-padded (dot products unchanged)
# Compiled variants of flex_attention one process may need: dtypes × head layouts × score_mods × graph/eager. Past
# torch's default of 8, dynamo silently runs flex_attention unfused: slow, and it copies host scalars, which a
# CUDA-graph capture refuses (seen on an H200 when one process loaded several models).
RECOMPILE_LIMIT = 64
_compiled: dict[bool, Any] = {}


def _flex(device: torch.device, static: bool) -> Any:
    """The flex_attention to call. Graph buckets (`static`): compiled with static shapes, one kernel per bucket size
    (the attention-only GPU measurement: 7.0 → 4.6 ms per 8,192-token forward with exact tables); eager batches have
    arbitrary lengths, so dynamic shapes (static ones would recompile per length and hit the recompile limit)."""
    if device.type != "cuda":
        return flex_attention
    if static not in _compiled:
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        _compiled[static] = torch.compile(flex_attention, dynamic=not static)
    return _compiled[static]


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
    """`--attention-backend` → "sdpa", "flex" or "triton". auto: the Triton kernel (model/kernels/mis_attention.py,
    flex for the layers it does not cover) on CUDA when Triton is there, else the row-block (SDPA-style) reference
    path. An explicit flex on CPU runs eagerly (tests); on CUDA without Triton it is an error, named at start-up, and
    so is the Triton kernel on CPU outside Triton's interpreter (TRITON_INTERPRET=1: tests)."""
    available, why = flex_available(device)
    if name == "auto":
        chosen = "triton" if available else "sdpa"
        log.info("attention backend: %s (auto on %s%s)", chosen, device.type, f"; {why}" if why else "")
        return chosen
    if name in ("flex", "triton") and device.type == "cuda" and not available:
        raise ValueError(f"--attention-backend {name}: {why}")
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("--attention-backend triton: the Triton kernel runs on CUDA (on a CPU only under Triton's "
                         "interpreter, TRITON_INTERPRET=1, for tests)")
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


def _key_intervals(padded: TokenLayout, causal: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per query token, the packed-index ranges [lo, hi] (inclusive; empty when lo > hi) of the keys it may see,
    windows aside: its own segment (up to itself under causality), the first `prefix` tokens of its query row (items)
    and its parent item (child items). `token_allowed` is exactly their union, because segments are numbered in
    packed order (so `searchsorted` finds a segment's first and last token) and `offset` counts from a row's start."""
    segment = padded.segment
    index = torch.arange(segment.shape[0], device=segment.device)

    def first(ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(segment, ids)

    def last(ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(segment, ids, right=True) - 1

    own = (first(segment), index if causal else last(segment))
    context = padded.context.clamp(min=0)
    context_lo = first(context)
    context_hi = torch.where(padded.context >= 0, torch.minimum(context_lo + padded.prefix, last(context) + 1) - 1,
                             context_lo - 1)
    parent = padded.parent.clamp(min=0)
    parent_lo = first(parent)
    parent_hi = torch.where(padded.parent >= 0, last(parent), parent_lo - 1)
    return [own, (context_lo, context_hi), (parent_lo, parent_hi)]


def block_tables(tokens: TokenLayout, causal: bool, window: int | None,
                 block_size: int = BLOCK_SIZE) -> tuple[TokenLayout, torch.Tensor, torch.Tensor]:
    """(padded metadata, partial [nQ, nK] bool, full [nQ, nK] bool) for `tokens`. Exact without windows: a tile is
    listed if and only if it holds an allowed pair, and full if and only if each of its queries sees all its keys
    through one of its ranges. Windows only drop tiles whose position ranges are out of reach (conservative: every
    allowed pair lies in a listed tile, and a full tile allows every pair). Costs [T, nK] per range, never T²."""
    length = tokens.segment.shape[0]
    blocks = max(1, -(-length // block_size))
    padded = _padded_tokens(tokens, blocks * block_size)
    device = padded.segment.device
    tile_first = torch.arange(blocks, device=device) * block_size  # [nK] first key of each tile
    tile_last = tile_first + block_size - 1
    listed = torch.zeros(blocks * block_size, blocks, dtype=torch.bool, device=device)
    covered = torch.zeros_like(listed)
    for lo, hi in _key_intervals(padded, causal):
        lo, hi = lo[:, None], hi[:, None]
        listed |= (lo <= tile_last) & (hi >= tile_first) & (lo <= hi)
        covered |= (lo <= tile_first) & (hi >= tile_last)
    nonempty = listed.view(blocks, block_size, blocks).any(1)
    full = covered.view(blocks, block_size, blocks).all(1)
    complete = tile_last < length  # tiles cut by the sequence end are never full (the kernel masks past the end)
    full = full & complete[:, None] & complete[None, :]
    if window is not None:  # symmetric windows: a key may also be ahead of the query (encoders)
        positions = padded.positions.view(blocks, block_size)
        pos_lo, pos_hi = positions.amin(1), positions.amax(1)
        nonempty = (nonempty & (pos_lo[:, None] - pos_hi[None, :] < window)
                    & (pos_lo[None, :] - pos_hi[:, None] < window))
        full = full & (pos_hi[:, None] - pos_lo[None, :] < window) & (pos_hi[None, :] - pos_lo[:, None] < window)
    full = full & nonempty
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
    key, value = masked_values(key, value)  # a partial tile multiplies its masked keys, other requests' too
    dim = query.shape[-1]
    if dim < MIN_HEAD_DIM:
        query, key, value = (F.pad(t, (0, MIN_HEAD_DIM - dim)) for t in (query, key, value))

    score_mod = None
    if softcap is not None:
        cap = _softcap_tensor(softcap, query.device)

        def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                      kv: torch.Tensor) -> torch.Tensor:
            return torch.tanh(score / cap) * cap

    flex = _flex(query.device, layout.static_shapes)
    out = flex(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
               enable_gqa=query.shape[1] != key.shape[1])
    return out[..., :dim].transpose(1, 2)
