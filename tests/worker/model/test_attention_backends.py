"""Every attention backend that runs on CPU equals the row-block (SDPA-style) reference on packed and multi-item
batches, and FlexAttention's block tables never drop a pair the mask allows.

FlexAttention runs eagerly here (the unfused reference that reads only `mask_mod`), so the block tables a GPU kernel
uses are checked on their own: against the dense mask, and through one compiled CPU kernel that reads them."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from packed_units import mixed_units
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool
from scorekeeper_worker.model.kernels.attention import LayoutKind, TokenLayout, token_allowed
from scorekeeper_worker.model.kernels.flex import block_tables, flex_block_mask, resolve_backend
from scorekeeper_worker.model.loader import ScoringModel, load_model

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
CPU = torch.device("cpu")


def _units(model: ScoringModel, seed: int, multi_item: bool) -> list[PackUnit]:
    """Packed sequences of very different lengths and, for decoders, two multi-item groups (one with an empty
    query, one with an empty item)."""
    groups = ((30, [5, 1, 12, 0, 9]), (0, [4, 8])) if multi_item else ()
    return mixed_units(model, random.Random(seed), (1, 7, 40, 150), groups)


def _pooled(model: ScoringModel, units: list[PackUnit], kind: LayoutKind) -> torch.Tensor:
    with torch.inference_mode():
        return pooled_rows(model, build_inputs(units, CPU, kind))


@pytest.mark.parametrize("kind", [LayoutKind.DENSE, LayoutKind.FLEX])
@pytest.mark.parametrize("name", ["qwen3-causal", "gemma2-cls3", "mistral-cls3", "bert-cross", "modernbert-cross"])
def test_backends_equal_sdpa(name: str, kind: LayoutKind, tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    units = _units(model, 1, multi_item=model.is_decoder)
    torch.testing.assert_close(_pooled(model, units, kind), _pooled(model, units, LayoutKind.BLOCKS),
                               rtol=1e-5, atol=1e-5)


def test_sliding_window_is_applied_alike(tiny_model: Callable[[str], Path]) -> None:
    """Gemma2's sliding layers with a window much shorter than the sequences (the tiny config's is longer than any)."""
    model = load_model(tiny_model("gemma2-reward"), DType.FLOAT32, "cpu", "gemma2")
    layers = [layer.self_attn for layer in model.trunk.layers if layer.self_attn.sliding_window is not None]
    assert layers
    units = _units(model, 2, multi_item=True)
    full = _pooled(model, units, LayoutKind.BLOCKS)
    for attention in layers:
        attention.sliding_window = 6
    reference = _pooled(model, units, LayoutKind.BLOCKS)
    assert not torch.allclose(reference, full, atol=1e-3)  # the window matters here
    for kind in (LayoutKind.DENSE, LayoutKind.FLEX):
        torch.testing.assert_close(_pooled(model, units, kind), reference, rtol=1e-5, atol=1e-5)


def _random_layout(seed: int) -> TokenLayout:
    """A graph-shaped token layout with everything in it: sequences, multi-item groups (empty query, empty items,
    prefixes shorter than the query row, items that also see an earlier item of their group), padding."""
    rng = random.Random(seed)
    units = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            length = rng.randint(1, 70)
            units.append(PackUnit([1] * length, pools=[Pool(range(length), 0)]))
        else:
            query = rng.randint(0, 40)
            items = [[1] * rng.randint(0, 25) for _ in range(rng.randint(1, 6))]
            parents = [rng.choice([-1, *range(i)]) for i in range(len(items))]
            units.append(PackUnit([1] * (query + 1), items=items, visible_prefix=query, pools=[Pool(range(1), 0)],
                                  parents=parents))
    tokens = sum(u.num_tokens for u in units)
    shape = GraphShape(tokens=tokens + rng.randint(0, 40), sequences=len(units))
    layout = build_inputs(units, CPU, LayoutKind.FLEX, shape).layout.tokens
    assert layout is not None
    return layout


@pytest.mark.parametrize("seed", range(6))
def test_flex_block_tables_are_conservative(seed: int) -> None:
    """Every allowed pair lies in a listed tile; every "full" tile allows every pair; and tiles get skipped."""
    tokens = _random_layout(seed)
    length = tokens.segment.shape[0]
    block = 8
    index = torch.arange(length)
    for causal, window in ((True, None), (False, None), (True, 9), (False, 9)):  # (False, 9): ModernBERT's local
        padded, partial, full = block_tables(tokens, causal, window, block)
        assert not (partial & full).any()
        allowed = token_allowed(tokens, index[:, None], index[None, :], causal, window)
        size = partial.shape[0] * block
        dense = torch.zeros(size, size, dtype=torch.bool)
        dense[:length, :length] = allowed
        tiles = dense.view(partial.shape[0], block, partial.shape[0], block).permute(0, 2, 1, 3)
        assert not (tiles.any(-1).any(-1) & ~(partial | full)).any(), "an allowed pair sits in a skipped tile"
        if window is None:  # exact: no tile is listed without an allowed pair
            assert torch.equal(tiles.any(-1).any(-1), partial | full)
        assert tiles[full].all(), "a full tile holds a masked pair"
        assert (~(partial | full)).any(), "nothing skipped"
        # mask_mod on the padded metadata is the same rule on the real tokens
        padded_index = torch.arange(size)
        assert torch.equal(token_allowed(padded, padded_index[:, None], padded_index[None, :], causal,
                                         window)[:length, :length], allowed)


def test_block_tables_of_the_sglang_benchmark_shape_are_exact() -> None:
    """SGLang's scoring benchmark (a 120-token query, 10 items of 180 tokens, plus delimiters) four times in the
    8,192-token bucket: the tables list exactly the 235 tiles that hold an allowed pair (the range-based tables of
    the first GPU profile listed 280), none of them full (no 128-token tile lies inside one item or query)."""
    units = [PackUnit([5] * 121, items=[[6] * 181 for _ in range(10)], visible_prefix=120,
                      pools=[Pool(range(1), r)]) for r in range(4)]
    tokens = build_inputs(units, CPU, LayoutKind.FLEX, GraphShape(8192, 64)).layout.tokens
    assert tokens is not None
    _, partial, full = block_tables(tokens, causal=True, window=None)
    index = torch.arange(8192)
    needed = torch.cat([token_allowed(tokens, index[q:q + 1024, None], index[None, :], True, None)
                        .view(8, 128, 64, 128).any(-1).any(1) for q in range(0, 8192, 1024)])
    assert int(needed.sum()) == 235 and torch.equal(partial | full, needed)
    assert int(full.sum()) == 0


def test_compiled_flex_kernel_uses_the_block_tables() -> None:
    """One compiled CPU flex kernel (it reads kv_num_blocks/kv_indices and the full tiles) equals SDPA with the dense
    mask; the same kernel with the full tiles dropped does not, so the tables are what it used."""
    rng = random.Random(0)
    units = [PackUnit([1] * 300, pools=[Pool(range(1), 0)]),
             PackUnit([1] * 260, items=[[1] * rng.randint(60, 140) for _ in range(3)], visible_prefix=259,
                      pools=[Pool(range(1), 0)])]
    tokens = build_inputs(units, CPU, LayoutKind.FLEX, GraphShape(1000, 4)).layout.tokens  # not a tile multiple
    assert tokens is not None
    length = tokens.segment.shape[0]
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, 16, generator=generator) for heads in (4, 2, 2))
    index = torch.arange(length)
    mask = token_allowed(tokens, index[:, None], index[None, :], True, None)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    block_mask = flex_block_mask(tokens, causal=True, window=None)
    assert int(block_mask.full_kv_num_blocks.sum()) > 0 and int(block_mask.kv_num_blocks.sum()) > 0
    compiled = torch.compile(torch.nn.attention.flex_attention.flex_attention, dynamic=False)
    out = compiled(q, k, v, block_mask=block_mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    no_full = type(block_mask).from_kv_blocks(
        block_mask.kv_num_blocks, block_mask.kv_indices, torch.zeros_like(block_mask.full_kv_num_blocks),
        block_mask.full_kv_indices, BLOCK_SIZE=block_mask.BLOCK_SIZE, mask_mod=block_mask.mask_mod,
        seq_lengths=(length, length), compute_q_blocks=False)
    assert not torch.allclose(compiled(q, k, v, block_mask=no_full, scale=0.25, enable_gqa=True), expected, atol=1e-3)


def test_backend_resolution_on_cpu() -> None:
    assert resolve_backend("auto", CPU) == "sdpa"
    assert resolve_backend("sdpa", CPU) == "sdpa"
    assert resolve_backend("flex", CPU) == "flex"  # eager on CPU: a test and reference path
