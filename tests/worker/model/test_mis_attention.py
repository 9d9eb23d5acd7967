"""The Triton multi-item attention kernel (model/kernels/mis_attention.py), on CPU under Triton's interpreter (the
suite sets TRITON_INTERPRET=1 without a GPU): equal to SDPA with the dense `token_allowed` mask on random layouts
(sequences, multi-item groups, child items, empty queries and items, a bucket's padding and long padding runs),
causal and bidirectional, grouped-query heads, head dims 16 to 128, float32 and bfloat16; a neighbour's inf and NaN
values reach nobody else; and through a model, the kernel's rows equal the row blocks' (eager and in a bucket)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner import token_packing
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool
from scorekeeper_worker.model.kernels import mis_attention
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.kernels.layout import TokenLayout, token_allowed
from scorekeeper_worker.model.loader import load_model

pytestmark = pytest.mark.skipif(not mis_attention.available(), reason="Triton is part of the test install")
BLOCK = 16  # small blocks: several work items per segment and several tiles per range on test-sized batches


def _units(rng: random.Random, count: int) -> list[PackUnit]:
    units = []
    for _ in range(count):
        query = [1] * rng.choice([0, 1, rng.randint(2, 40)])
        if rng.random() < 0.3:
            units.append(PackUnit(query or [1]))
            continue
        items = [[2] * rng.choice([0, 1, rng.randint(2, 35)]) for _ in range(rng.randint(1, 4))]
        parents = [rng.randrange(i) if i and rng.random() < 0.5 else -1 for i in range(len(items))] \
            if rng.random() < 0.5 else []
        units.append(PackUnit(query, items=items, visible_prefix=rng.randint(0, len(query)), parents=parents))
    return units


def _layout(units: list[PackUnit], shape: GraphShape | None = None) -> TokenLayout:
    tokens = token_packing.inputs(token_packing.pack(units, shape, BLOCK), LayoutKind.TRITON, shape is not None)
    assert tokens.layout.tokens is not None
    return tokens.layout.tokens


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout, causal: bool,
               live: int) -> torch.Tensor:
    """SDPA with the dense mask, in float64, on the live tokens: [T, H, D]."""
    index = torch.arange(live)
    allowed = token_allowed(layout, index[:, None], index[None, :], causal, None)
    group = q.shape[1] // k.shape[1]
    kk, vv = (t[:, :, :live].repeat_interleave(group, 1).double() for t in (k, v))
    out = F.scaled_dot_product_attention(q[:, :, :live].double(), kk, vv, attn_mask=allowed[None, None],
                                         scale=q.shape[-1] ** -0.5)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("causal", [True, False])
def test_the_kernel_equals_sdpa_with_the_dense_mask(seed: int, causal: bool) -> None:
    rng = random.Random(seed)
    units = _units(rng, rng.randint(1, 5))
    live = sum(u.num_tokens for u in units)
    padded = seed % 2 == 1  # a bucket: padding after the live tokens, a long run of it on odd seeds
    shape = GraphShape(live + rng.randint(1, 150), 64, work_block=BLOCK) if padded else None
    layout = _layout(units, shape)
    total = layout.segment.shape[0]
    heads, kv_heads, dim = rng.choice([(4, 4, 16), (4, 2, 24), (6, 2, 64), (3, 1, 128)])
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, total, dim, generator=generator) for h in (heads, kv_heads, kv_heads))
    assert layout.work is not None and layout.work_count is not None
    out = mis_attention.mis_attention(q, k, v, layout.work, layout.work_count, causal, dim**-0.5, BLOCK, BLOCK)
    expected = _reference(q, k, v, layout, causal, live)
    torch.testing.assert_close(out[0, :live].double(), expected, rtol=0, atol=1e-5)
    assert not out[0, live:].any()  # padding: zeros, read by nobody


def test_bfloat16_stays_within_its_rounding() -> None:
    rng = random.Random(11)
    units = _units(rng, 4)
    layout = _layout(units)
    total = layout.segment.shape[0]
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, h, total, 32, generator=generator).bfloat16() for h in (4, 2, 2))
    assert layout.work is not None and layout.work_count is not None
    out = mis_attention.mis_attention(q, k, v, layout.work, layout.work_count, True, 32**-0.5, BLOCK, BLOCK)
    expected = _reference(q.float(), k.float(), v.float(), layout, True, total)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out[0].double(), expected, rtol=0, atol=3e-2)


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_a_neighbour_s_inf_and_nan_reach_nobody_else(poison: float) -> None:
    """One request's keys and values overflow: every other segment's output is exactly what it is without them."""
    units = [PackUnit([1] * 20, items=[[2] * 7, [2] * 9], visible_prefix=19), PackUnit([3] * 33),
             PackUnit([1] * 12, items=[[2] * 5], visible_prefix=12)]
    layout = _layout(units, GraphShape(96, 16, work_block=BLOCK))
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 96, 16, generator=generator) for h in (2, 1, 1))
    work, count = layout.work, layout.work_count
    assert work is not None and count is not None
    clean = mis_attention.mis_attention(q, k, v, work, count, True, 0.25, BLOCK, BLOCK)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, 36:69] = poison  # the second request: the sequence of 33 tokens
    poisoned_v[:, :, 36:69] = poison
    dirty = mis_attention.mis_attention(q, poisoned_k, poisoned_v, work, count, True, 0.25, BLOCK, BLOCK)
    others = torch.cat([torch.arange(0, 36), torch.arange(69, 96)])
    assert torch.equal(dirty[0, others], clean[0, others])


@pytest.mark.parametrize("name", ["qwen3-causal", "gemma2-cls3", "bert-cross"])
def test_through_a_model_the_kernel_gives_the_row_blocks_rows(name: str, tiny_model: Callable[[str], Path]) -> None:
    """Gemma2's sliding-window and softcapped layers run flex under the same layout: its rows still match."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    rng = random.Random(5)
    units = []
    for unit in _units(rng, 4) if model.is_decoder else [PackUnit([rng.randrange(5, 90) for _ in range(n)])
                                                          for n in (17, 40, 3)]:
        unit.context = [rng.randrange(5, 90) for _ in unit.context]
        unit.items = [[rng.randrange(5, 90) for _ in item] for item in unit.items] if model.is_decoder else []
        end = len(unit.context)
        unit.pools = [Pool(range(max(end - 1, 0), max(end, 1)), -1)] if unit.context else []
        for i, item in enumerate(unit.items):
            end += len(item)
            unit.pools.append(Pool(range(max(end - 1, 0), max(end, 1)), i))
        units.append(unit)
    with torch.inference_mode():
        kernel = pooled_rows(model, build_inputs(units, torch.device("cpu"), LayoutKind.TRITON))
        reference = pooled_rows(model, build_inputs(units, torch.device("cpu")))
        torch.testing.assert_close(kernel, reference, rtol=1e-4, atol=1e-5)
        runner = GraphRunner(model, LayoutKind.TRITON, (512,), max_tokens=512, max_seqs=64)
        bucket = runner.buckets[0]
        batch = runner.load(bucket, units)
        padded = runner.forward(bucket)[: len(batch.readouts)]
        torch.testing.assert_close(padded, reference, rtol=1e-4, atol=1e-5)
