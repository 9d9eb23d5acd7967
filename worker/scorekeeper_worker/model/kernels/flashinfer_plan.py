"""FlashInfer's multi-item-scoring plan arguments, built from the worker's token layout (no flashinfer import).

FlashInfer's batch prefill (flashinfer PR 1015) runs multi-item scoring with three extra plan arguments per request:
`prefix_len_ptr` (uint32 [B]: the shared prefix), `token_pos_in_items_ptr` (uint16, `token_pos_in_items_len` per
request, zero-padded: one entry per token after the prefix) and `max_item_len_ptr` (uint16 [B]). Its kernels mask a
query at index i of its request (FA3, `mask_multi_item_scoring`; FA2 the same rule) as: keys after i never; if
i < prefix_len, every earlier key (causal prefix); else key k iff k < prefix_len or k > i - pos[i - prefix_len].
So a token with `pos` p sees the prefix, itself and the p - 1 tokens before it.

The worker's rule (`layout.token_allowed`) in those terms, per request (a query row and its items, or a plain row):
prefix_len = the items' visible prefix (the whole row for a plain sequence); a query-row token past the prefix (the
delimiter) has pos = offset - prefix + 1 (it sees the whole query row up to itself); an item token pos = offset + 1
(its own item up to itself, never the row before it). Child items (which also see a parent item), windows and
bidirectional encoders have no FlashInfer equivalent: `flashinfer_plan` refuses them (ValueError) and those batches
keep flex. Graph buckets: the padding after the live tokens is one more request (its outputs are never read) and
`requests` pads the batch with empty requests, so plan shapes are a bucket's.

The paged wrapper with page size 1 (the ragged wrapper ignores these arguments on Hopper: flashinfer PR 3434): each
packed token is one page of the batch's own K/V, so `kv_indptr` = `qo_indptr`, `kv_indices` = 0..T-1 and every
non-empty request's last page holds 1 token.

Unverified on a GPU: the arguments are checked here against the rule above (`allowed`), not against the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scorekeeper_worker.model.kernels.layout import TokenLayout

UINT16_MAX = 65535


@dataclass
class FlashInferPlan:
    """`BatchPrefillWithPagedKVCacheWrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, …,
    page_size=1, causal=True, prefix_len_ptr=…, token_pos_in_items_ptr=…, token_pos_in_items_len=…,
    max_item_len_ptr=…)` for one packed batch."""

    qo_indptr: torch.Tensor  # int32 [B + 1]
    kv_indptr: torch.Tensor  # int32 [B + 1]
    kv_indices: torch.Tensor  # int32 [T]
    kv_last_page_len: torch.Tensor  # int32 [B]: 1, or 0 for an empty request
    prefix_len_ptr: torch.Tensor  # uint32 [B]
    token_pos_in_items_ptr: torch.Tensor  # uint16 [B · token_pos_in_items_len]
    token_pos_in_items_len: int
    max_item_len_ptr: torch.Tensor  # uint16 [B]


def _requests(tokens: TokenLayout, live: int) -> list[tuple[int, int, int, list[int]]]:
    """(start, end, prefix_len, pos per token after the prefix) per request, from the host copy of the layout."""
    segment, context = tokens.segment.tolist(), tokens.context.tolist()
    offset, prefix, parent = tokens.offset.tolist(), tokens.prefix.tolist(), tokens.parent.tolist()
    if any(p >= 0 for p in parent[:live]):
        raise ValueError("child items (an item that sees a parent item) have no FlashInfer multi-item equivalent")
    starts = [i for i in range(live) if context[i] < 0 and (i == 0 or segment[i] != segment[i - 1])]
    requests = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else live
        items = [i for i in range(start, end) if context[i] >= 0]
        prefix_len = prefix[items[0]] if items else end - start
        pos = [offset[i] + 1 if context[i] >= 0 else offset[i] - prefix_len + 1
               for i in range(start + prefix_len, end)]
        requests.append((start, end, prefix_len, pos))
    if live < len(segment):  # padding: one request, causal among itself; nothing reads its outputs
        requests.append((live, len(segment), len(segment) - live, []))
    return requests


def flashinfer_plan(tokens: TokenLayout, live: int | None = None, requests: int | None = None,
                    causal: bool = True, window: int | None = None) -> FlashInferPlan:
    """The plan arguments of a packed batch (`live`: its real tokens, the rest padding; `requests`: pad the batch
    to this many requests, for graph buckets). Host tensors; the caller moves them to the device."""
    if not causal or window is not None:
        raise ValueError("FlashInfer's multi-item mask is causal and windowless")
    live = tokens.segment.shape[0] if live is None else live
    found = _requests(tokens, live)
    if requests is not None:
        if len(found) > requests:
            raise ValueError(f"{len(found)} requests do not fit {requests} plan slots")
        end = found[-1][1] if found else 0
        found += [(end, end, 0, [])] * (requests - len(found))
    width = max((len(pos) for *_, pos in found), default=0)
    longest = max((max(pos, default=0) for *_, pos in found), default=0)
    if longest > UINT16_MAX:
        raise ValueError(f"an item of {longest} tokens exceeds FlashInfer's uint16 positions")
    indptr = torch.tensor([0] + [end for _, end, _, _ in found], dtype=torch.int32)
    pos = torch.zeros(len(found), width, dtype=torch.int32)
    for n, (*_, row) in enumerate(found):
        pos[n, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return FlashInferPlan(
        qo_indptr=indptr,
        kv_indptr=indptr.clone(),
        kv_indices=torch.arange(tokens.segment.shape[0], dtype=torch.int32),
        kv_last_page_len=torch.tensor([int(end > start) for start, end, _, _ in found], dtype=torch.int32),
        prefix_len_ptr=torch.tensor([p for _, _, p, _ in found], dtype=torch.int64).to(torch.uint32),
        token_pos_in_items_ptr=pos.reshape(-1).to(torch.uint16),
        token_pos_in_items_len=width,
        max_item_len_ptr=pos.amax(1).to(torch.uint16) if width else torch.zeros(len(found), dtype=torch.uint16),
    )


def allowed(plan: FlashInferPlan) -> torch.Tensor:
    """[T, T] bool: who sees whom under FlashInfer's multi-item mask with these arguments (the kernel's rule, in
    torch), for checking a plan against `layout.token_allowed`."""
    total = plan.kv_indices.shape[0]
    mask = torch.zeros(total, total, dtype=torch.bool)
    indptr = plan.qo_indptr.tolist()
    prefixes = plan.prefix_len_ptr.to(torch.int64).tolist()
    pos = plan.token_pos_in_items_ptr.to(torch.int32).view(len(prefixes), -1) if plan.token_pos_in_items_len \
        else torch.zeros(len(prefixes), 0, dtype=torch.int32)
    for n, prefix_len in enumerate(prefixes):
        start, end = indptr[n], indptr[n + 1]
        for i in range(end - start):
            keys = torch.arange(i + 1)
            if i < prefix_len:
                seen = torch.ones(i + 1, dtype=torch.bool)
            else:
                seen = (keys < prefix_len) | (keys > i - int(pos[n, i - prefix_len]))
            mask[start + i, start: start + i + 1] = seen
    return mask
