"""Multi-item attention in Triton: packed sequences, multi-item groups and child items, by ranges of keys per block of
queries, never a mask tile of the whole batch.

A batch in a token layout is a list of segments (a sequence, a multi-item query, an item), each a run of packed
tokens. A token sees at most three runs of keys (`layout.token_allowed`): its own segment (up to itself in decoders),
the first `prefix` tokens of its query (items), and its parent item (child items). So the work is cut into work items
of at most BLOCK_M consecutive queries of one segment, each described by eight integers (`work_list`, built on the
host while packing): its queries, and the three key ranges. One program per (work item, K/V head) loops over the
key tiles of the three ranges only; masks are comparisons with those bounds (and the diagonal), so the tiles it
computes are its own request's: keys past a range load as zeros, so another request's values, even inf or NaN,
never enter a product. A GQA group's query heads are stacked as rows of one tile, so each K/V tile is loaded once
for the group.

The grid is fixed for a CUDA graph (a bucket's most work items, `WORK_FIELDS` per item), and the number of live items
is read on the device, so a replay needs no host value. Tokens outside every work item (a bucket's padding) get
zeros. The running maximum starts finite: a row that sees no key in a tile must not turn NaN.

Windows and softcapping are not covered: those layers run flex (model/kernels/flex.py). On CPU the kernel runs under
Triton's interpreter (`TRITON_INTERPRET=1`), which is how the tests check it against SDPA with the dense mask; the
interpreter's bfloat16 dot product is wrong, so there bfloat16 tiles are multiplied in float32 (on a GPU, in
bfloat16: tests/worker/engine/runner/test_cuda.py checks that)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import torch

WORK_FIELDS = 8  # q_start, q_len, own_lo, own_hi, prefix_lo, prefix_hi, parent_lo, parent_hi
BLOCK_M = 64  # queries per work item on a GPU
BLOCK_N = 64  # keys per tile


def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def work_list(starts: np.ndarray, lengths: np.ndarray, context: np.ndarray, prefix: np.ndarray, parent: np.ndarray,
              block: int) -> np.ndarray:
    """[W, WORK_FIELDS] int64: every non-empty segment cut into blocks of at most `block` queries. Per segment: its
    first token and length, its query segment (-1: none) and visible prefix, its parent segment (-1: none)."""
    chunks = -(-lengths // block)
    segment = np.repeat(np.arange(len(lengths), dtype=np.int64), chunks)
    first = np.repeat(np.cumsum(chunks) - chunks, chunks)
    within = (np.arange(len(segment), dtype=np.int64) - first) * block
    work = np.zeros((len(segment), WORK_FIELDS), dtype=np.int64)
    seg_start, seg_len = starts[segment], lengths[segment]
    work[:, 0] = seg_start + within
    work[:, 1] = np.minimum(block, seg_len - within)
    work[:, 2] = seg_start
    work[:, 3] = seg_start + seg_len
    ctx, par = context[segment], parent[segment]
    has_ctx, has_par = ctx >= 0, par >= 0
    work[:, 4] = np.where(has_ctx, starts[np.maximum(ctx, 0)], 0)
    work[:, 5] = work[:, 4] + np.where(has_ctx, prefix[segment], 0)
    work[:, 6] = np.where(has_par, starts[np.maximum(par, 0)], 0)
    work[:, 7] = work[:, 6] + np.where(has_par, lengths[np.maximum(par, 0)], 0)
    return work


def computed_pairs(work: np.ndarray, causal: bool, block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> int:
    """Query × key pairs the kernel computes per head for `work` (whole tiles: BLOCK_M rows per work item, BLOCK_N
    keys per tile), for comparing its work with flex's."""
    q_start, q_len, own_lo, own_hi = work[:, 0], work[:, 1], work[:, 2], work[:, 3]
    own_end = np.minimum(own_hi, q_start + q_len) if causal else own_hi
    keys = [own_end - own_lo, work[:, 5] - work[:, 4], work[:, 7] - work[:, 6]]
    tiles = sum(-(-np.maximum(k, 0) // block_n) for k in keys)
    return int((tiles * block_m * block_n).sum())


if available():
    import triton
    import triton.language as tl

    @triton.jit
    def _keys(q, m_i, l_i, acc, K, V, kvh, lo, hi, tok, row_ok, d, d_ok, stride_kt, stride_kh, stride_vt,
              stride_vh, scale, DIAGONAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
              DOT_F32: tl.constexpr):
        """Online softmax over the keys [lo, hi), a tile at a time; `DIAGONAL`: a key after its query is masked."""
        for start in range(lo, hi, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            k_ok = keys < hi
            k = tl.load(K + keys[None, :] * stride_kt + kvh * stride_kh + d[:, None],
                        mask=k_ok[None, :] & d_ok[:, None], other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION) * scale
            visible = k_ok[None, :] & row_ok[:, None]
            if DIAGONAL:
                visible = visible & (keys[None, :] <= tok[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + keys[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                        mask=k_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_F32:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _mis_attention(Q, K, V, Out, WORK, COUNT, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_ot, stride_oh, scale, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                       CAUSAL: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
        item = tl.program_id(0)
        kvh = tl.program_id(1)
        if item < tl.load(COUNT):
            fields = WORK + item * 8
            q_start = tl.load(fields)
            q_len = tl.load(fields + 1)
            own_lo = tl.load(fields + 2)
            own_hi = tl.load(fields + 3)
            rows = tl.arange(0, GROUP_PAD * BLOCK_M)
            within = rows % BLOCK_M
            group = rows // BLOCK_M
            tok = q_start + within
            head = kvh * GROUP + group
            row_ok = (within < q_len) & (group < GROUP)
            d = tl.arange(0, D_PAD)
            d_ok = d < HEAD_DIM
            q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_F32:
                q = q.to(tl.float32)
            m_i = tl.full([GROUP_PAD * BLOCK_M], -1.0e30, tl.float32)  # finite: see the module docstring
            l_i = tl.zeros([GROUP_PAD * BLOCK_M], tl.float32)
            acc = tl.zeros([GROUP_PAD * BLOCK_M, D_PAD], tl.float32)
            m_i, l_i, acc = _keys(q, m_i, l_i, acc, K, V, kvh, tl.load(fields + 4), tl.load(fields + 5), tok, row_ok,
                                  d, d_ok, stride_kt, stride_kh, stride_vt, stride_vh, scale, False, BLOCK_N, PRECISION,
                                  DOT_F32)
            m_i, l_i, acc = _keys(q, m_i, l_i, acc, K, V, kvh, tl.load(fields + 6), tl.load(fields + 7), tok, row_ok,
                                  d, d_ok, stride_kt, stride_kh, stride_vt, stride_vh, scale, False, BLOCK_N, PRECISION,
                                  DOT_F32)
            own_end = own_hi
            if CAUSAL:
                own_end = tl.minimum(own_hi, q_start + q_len)
            m_i, l_i, acc = _keys(q, m_i, l_i, acc, K, V, kvh, own_lo, own_end, tok, row_ok, d, d_ok, stride_kt,
                                  stride_kh, stride_vt, stride_vh, scale, CAUSAL, BLOCK_N, PRECISION, DOT_F32)
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                     out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << (n - 1).bit_length())


def mis_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, work: torch.Tensor,
                  count: torch.Tensor, causal: bool, scale: float, block_m: int = BLOCK_M,
                  block_n: int = BLOCK_N) -> torch.Tensor:
    """q [1, H, T, D], k/v [1, Hkv, T, D] (transformers' layout) → [1, T, H, D]. `work` [W, WORK_FIELDS] int64 on the
    device, built with `block_m`; `count` [1] int64: how many of its rows are live (a graph bucket's grid is W)."""
    q, k, v = query[0], key[0], value[0]  # [H, T, D]: strides over tokens and heads, no copy
    heads, tokens, dim = q.shape
    group = heads // k.shape[0]
    out = torch.zeros(tokens, heads, dim, dtype=q.dtype, device=q.device)
    if work.shape[0] == 0:
        return out[None]
    grid = (work.shape[0], k.shape[0])
    kernel: Any = _mis_attention
    kernel[grid](q, k, v, out, work, count, q.stride(1), q.stride(0), k.stride(1), k.stride(0), v.stride(1),
                 v.stride(0), out.stride(0), out.stride(1), scale, GROUP=group, GROUP_PAD=_pow2(group),
                 BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=dim, D_PAD=_pow2(dim, 16), CAUSAL=causal,
                 PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                 DOT_F32=q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1")
    return out[None]
