"""FlashInfer's multi-item plan arguments (model/kernels/flashinfer_plan.py) give exactly the worker's attention rule.

No flashinfer here: `allowed` is the kernel's mask rule written in torch (FA3's `mask_multi_item_scoring`), and it
must equal `token_allowed` on every live query of random packed batches; the GPU run compares the kernel itself."""

from __future__ import annotations

import random

import pytest
import torch
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool
from scorekeeper_worker.model.kernels.attention import LayoutKind, TokenLayout, token_allowed
from scorekeeper_worker.model.kernels.flashinfer_plan import allowed, flashinfer_plan

CPU = torch.device("cpu")


def _layout(units: list[PackUnit], tokens: int) -> tuple[TokenLayout, int]:
    layout = build_inputs(units, CPU, LayoutKind.FLEX, GraphShape(tokens, max(1, len(units) * 8))).layout.tokens
    assert layout is not None
    return layout, sum(u.num_tokens for u in units)


def _random_units(seed: int) -> list[PackUnit]:
    """Plain sequences and multi-item groups (empty query, prefixes shorter than the query row, empty items)."""
    rng = random.Random(seed)
    units = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.4:
            length = rng.randint(1, 60)
            units.append(PackUnit([1] * length, pools=[Pool(range(length), 0)]))
        else:
            query = rng.randint(0, 30)
            items = [[1] * rng.randint(0, 20) for _ in range(rng.randint(1, 6))]
            units.append(PackUnit([1] * (query + rng.randint(1, 3)), items=items, visible_prefix=query,
                                  pools=[Pool(range(1), 0)]))
    return units


@pytest.mark.parametrize("seed", range(8))
def test_the_plan_allows_exactly_what_the_worker_allows(seed: int) -> None:
    units = _random_units(seed)
    live_tokens = sum(u.num_tokens for u in units)
    tokens, live = _layout(units, live_tokens + random.Random(seed).randint(0, 30))
    plan = flashinfer_plan(tokens, live)
    index = torch.arange(tokens.segment.shape[0])
    expected = token_allowed(tokens, index[:, None], index[None, :], True, None)
    got = allowed(plan)
    assert torch.equal(got[:live, :live], expected[:live, :live])
    assert not got[:live, live:].any()  # live queries never see padding (its own request)
    assert plan.qo_indptr[-1] == tokens.segment.shape[0] and torch.equal(plan.kv_indptr, plan.qo_indptr)


def test_the_sglang_benchmark_shape() -> None:
    """4 × (120-token query + delimiter, 10 items of 180 tokens + delimiter) in the 8,192-token bucket."""
    units = [PackUnit([5] * 121, items=[[6] * 181 for _ in range(10)], visible_prefix=120,
                      pools=[Pool(range(1), r)]) for r in range(4)]
    tokens, live = _layout(units, 8192)
    plan = flashinfer_plan(tokens, live, requests=8)
    assert plan.qo_indptr.tolist() == [0, 1931, 3862, 5793, 7724, 8192, 8192, 8192, 8192]
    assert plan.prefix_len_ptr.dtype == torch.uint32 and plan.token_pos_in_items_ptr.dtype == torch.uint16
    assert plan.prefix_len_ptr.to(torch.int64).tolist() == [120] * 4 + [468, 0, 0, 0]
    assert plan.token_pos_in_items_len == 1 + 10 * 181
    first = plan.token_pos_in_items_ptr.to(torch.int32)[: plan.token_pos_in_items_len].tolist()
    assert first[:3] == [1, 1, 2] and first[181:184] == [181, 1, 2]  # query delimiter; item 1; its delimiter; item 2
    assert plan.max_item_len_ptr.to(torch.int32).tolist() == [181] * 4 + [0] * 4
    assert plan.kv_last_page_len.tolist() == [1] * 5 + [0] * 3 and plan.kv_indices.tolist() == list(range(8192))


def test_what_flashinfer_cannot_express_is_refused() -> None:
    child = PackUnit([1] * 6, items=[[1] * 3, [1] * 2], visible_prefix=5, pools=[Pool(range(1), 0)], parents=[-1, 0])
    tokens, live = _layout([child], 16)
    with pytest.raises(ValueError, match="child items"):
        flashinfer_plan(tokens, live)
    with pytest.raises(ValueError, match="windowless"):
        flashinfer_plan(tokens, live, window=4)
    with pytest.raises(ValueError, match="causal"):
        flashinfer_plan(tokens, live, causal=False)
    plain, live = _layout([PackUnit([1] * 4, pools=[Pool(range(1), 0)])] * 3, 16)
    with pytest.raises(ValueError, match="plan slots"):
        flashinfer_plan(plain, live, requests=3)  # three sequences and the padding
