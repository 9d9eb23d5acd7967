"""`attend_output`'s batched path (short float32 rows on CPU: two batched products and a softmax per tile) against
the flash kernel's output (`attend`) on the same blocks: key padding, causal rows with and without padding, sliding
windows, a mask shared by every row, and tiles small enough to split the rows and the queries."""

from __future__ import annotations

import pytest
import scorekeeper_worker.model.kernels.tiled as tiled
import torch
from scorekeeper_worker.model.kernels.tiled import RowMask, attend, attend_output

HEADS, DIM = 4, 16


def _block(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [R, H, L, D] laid out as packed attention gathers them (a transposed view), and each row's length."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, length, HEADS, DIM, generator=generator).transpose(1, 2) for _ in range(3))
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    lengths[0] = length
    return q, k, v, lengths


def _mask(lengths: torch.Tensor, length: int, causal: bool, window: int | None) -> RowMask:
    positions = torch.arange(length)[None].expand(len(lengths), length)
    valid = positions < lengths[:, None]
    return RowMask(positions.where(valid, 0), positions.where(valid, 0), valid, causal, window, contiguous=True)


def _no_flash(*_: object, **__: object) -> None:
    raise AssertionError("short float32 rows must not reach the flash kernel")


def _real(out: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The output rows of real queries (a padding query's output is never read)."""
    return out.transpose(1, 2)[torch.arange(out.shape[2])[None] < lengths[:, None]]


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (False, 3), (True, 5)])
@pytest.mark.parametrize("length", [1, 7, 40])
def test_batched_output_matches_flash(monkeypatch: pytest.MonkeyPatch, causal: bool, window: int | None,
                                      length: int) -> None:
    q, k, v, lengths = _block(6, length, seed=length)
    expected = attend(q, k, v, _mask(lengths, length, causal, window), causal, 0.25, None)[0]
    monkeypatch.setattr(tiled, "_flash_cpu", _no_flash)
    got = attend_output(q, k, v, _mask(lengths, length, causal, window), causal, 0.25, None)
    torch.testing.assert_close(_real(got, lengths), _real(expected, lengths), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [1, 16 * HEADS, 40 * HEADS * 3])  # a query per tile; rows split; queries split
def test_small_tiles_give_the_same_output(monkeypatch: pytest.MonkeyPatch, tile: int) -> None:
    q, k, v, lengths = _block(5, 40, seed=1)
    whole = attend_output(q, k, v, _mask(lengths, 40, False, None), False, 0.25, None)
    monkeypatch.setattr(tiled, "BATCHED_TILE", tile)
    split = attend_output(q, k, v, _mask(lengths, 40, False, None), False, 0.25, None)
    torch.testing.assert_close(_real(split, lengths), _real(whole, lengths), rtol=1e-6, atol=1e-6)


def test_causal_rows_without_a_mask_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Causal rows with no padding get no mask; the causal one built for them covers every row and tile."""
    q, k, v, _ = _block(5, 12, seed=2)
    expected = attend(q, k, v, None, True, 0.25, None)[0]
    monkeypatch.setattr(tiled, "BATCHED_TILE", 2 * HEADS * 12)  # two rows per tile
    monkeypatch.setattr(tiled, "_flash_cpu", _no_flash)
    torch.testing.assert_close(attend_output(q, k, v, None, True, 0.25, None), expected, rtol=1e-5, atol=1e-5)


def test_long_rows_and_other_dtypes_keep_the_flash_kernel() -> None:
    q, k, v, lengths = _block(2, tiled.BATCHED_MAX_KEYS + 1, seed=3)
    mask = _mask(lengths, q.shape[2], False, None)
    assert torch.equal(attend_output(q, k, v, mask, False, 0.25, None), attend(q, k, v, mask, False, 0.25, None)[0])
    q16, k16, v16 = (t.to(torch.bfloat16) for t in _block(2, 8, seed=4)[:3])
    assert torch.equal(attend_output(q16, k16, v16, None, True, 0.25, None),
                       attend(q16, k16, v16, None, True, 0.25, None)[0])
