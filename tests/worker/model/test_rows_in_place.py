"""Whole rows that lie as runs of packed tokens attend in place (`tiled.attend_spans`: the fused kernel on slices
of the packed projections, nothing gathered): packing marks such rows, rows of `IN_PLACE_MIN_KEYS` keys and more
take the path on CPU, and their output equals the gathered path's, for encoder and decoder rows and grouped-query
heads. Shorter rows, sliding windows and softcapping keep the gathered blocks."""

from __future__ import annotations

import types

import pytest
import scorekeeper_worker.model.kernels.attention as attention
import scorekeeper_worker.model.kernels.tiled as tiled
import torch
from scorekeeper_worker.engine.runner import row_blocks
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.kernels.attention import packed_attention

HEADS, DIM = 4, 16
CPU = torch.device("cpu")


def _units(lengths: list[int]) -> list[PackUnit]:
    return [PackUnit(context=list(range(5, 5 + n)), pools=[Pool(range(n), 0)]) for n in lengths]


def _projections(tokens: int, kv_heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q [1, H, T, D] and k/v [1, Hkv, T, D] as transformers hands them: views of [1, T, H, D] projections."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, tokens, heads, DIM, generator=generator).transpose(1, 2)
                 for heads in (HEADS, kv_heads, kv_heads))


def _attend(lengths: list[int], causal: bool, kv_heads: int = HEADS, window: int | None = None,
            softcap: float | None = None) -> torch.Tensor:
    inputs = build_inputs(_units(lengths), CPU)
    q, k, v = _projections(inputs.num_tokens, kv_heads, seed=sum(lengths))
    module = types.SimpleNamespace(is_causal=causal)
    out, _ = packed_attention(module, q, k, v, None, DIM**-0.5, sliding_window=window, softcap=softcap,  # type: ignore[arg-type]
                              scorekeeper_layout=inputs.layout)
    return out


def test_packing_marks_whole_sequences_as_spans() -> None:
    layout = build_inputs(_units([70, 3, 90, 65]), CPU).layout
    starts = {70: 0, 3: 70, 90: 73, 65: 163}
    for block in layout.context_blocks:
        lengths = block.lengths.tolist()
        assert block.spans == tuple((starts[n], n) for n in lengths)
        for (start, length), row in zip(block.spans, block.token_index.tolist(), strict=True):
            assert row[:length] == list(range(start, start + length))


def test_rows_that_are_not_runs_of_packed_tokens_have_no_spans() -> None:
    rows = [row_blocks.Row(tokens=[4, 5, 6], positions=[0, 1, 2]),
            row_blocks.Row(tokens=[0, 2, 3], positions=[0, 1, 2])]
    assert row_blocks.row_block(rows, 9).spans == ()
    assert row_blocks.row_block(rows[:1], 9).spans == ((4, 3),)


@pytest.mark.parametrize(("causal", "kv_heads"), [(False, HEADS), (True, HEADS), (True, 2)])
def test_rows_in_place_equal_the_gathered_rows(monkeypatch: pytest.MonkeyPatch, causal: bool, kv_heads: int) -> None:
    lengths = [70, 3, 130, 64, 20, 90]  # long rows in place, short ones gathered, in one batch
    spans: list[tuple[int, int]] = []
    original = attention.attend_spans

    def recorded(*args: object) -> None:
        spans.extend(args[3])  # type: ignore[arg-type]
        original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "attend_spans", recorded)
    got = _attend(lengths, causal, kv_heads)
    assert sorted(length for _, length in spans) == [64, 70, 90, 130]
    monkeypatch.setattr(attention, "in_place", lambda *_: False)
    want = _attend(lengths, causal, kv_heads)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("window", "softcap"), [(8, None), (None, 30.0)])
def test_windows_and_softcapping_keep_the_gathered_rows(monkeypatch: pytest.MonkeyPatch, window: int | None,
                                                        softcap: float | None) -> None:
    def fail(*_: object) -> None:
        raise AssertionError("rows that need a mask or softcapping must not attend in place")

    monkeypatch.setattr(attention, "attend_spans", fail)
    assert tiled.IN_PLACE_MIN_KEYS <= 100
    _attend([100, 120], True, window=window, softcap=softcap)
