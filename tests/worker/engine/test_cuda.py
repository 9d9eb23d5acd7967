"""GPU checks (marked `cuda`, skipped without an NVIDIA GPU): captured graphs replay like eager for every bucket,
FlexAttention compiled through Triton equals the row-block reference, pinned copies return the right values.

bench/gpu/gpu_check.py runs the same checks plus timings in one command; see docs/gpu.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.compiled_trunk import CompiledTrunk
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.device_copy import host_vectors
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import build_inputs
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import load_model
from test_graph_shaped import DELIMITER, batches_for

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

BUCKETS = (64, 128, 256, 512)


@pytest.mark.parametrize("kind", [LayoutKind.DENSE, LayoutKind.FLEX])
@pytest.mark.parametrize("name", ["qwen3-cls3", "gemma2-reward", "bert-embed"])
def test_replay_equals_eager_for_every_bucket(name: str, kind: LayoutKind, tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cuda", name)
    failures: list[int] = []
    runner = GraphRunner(model, kind, BUCKETS, max_tokens=BUCKETS[-1], max_seqs=64,
                         on_capture_failure=lambda: failures.append(1))
    runner.capture()
    assert not failures and all(b.graph is not None for b in runner.buckets)
    with torch.inference_mode():
        for bucket in runner.buckets:
            delimiter = DELIMITER if model.is_decoder else None
            for batch_kind, units in batches_for(model, bucket.tokens, delimiter, BUCKETS).items():
                assert runner.select(units) is bucket
                batch = runner.load(bucket, units)
                replayed = runner.forward(bucket)[: len(batch.readouts)].clone()
                same_shapes = pooled_rows(model, bucket.static)[: len(batch.readouts)]  # eager on the same buffers
                torch.testing.assert_close(replayed, same_shapes, rtol=1e-5, atol=1e-5, msg=batch_kind)
                reference = pooled_rows(model, build_inputs(units, model.device))
                torch.testing.assert_close(replayed, reference, rtol=1e-4, atol=1e-4, msg=batch_kind)


@pytest.mark.parametrize("name", ["qwen3-causal", "gemma2-cls3", "bert-cross"])
def test_compiled_flex_equals_sdpa(name: str, tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cuda", name)
    units = batches_for(model, 512, DELIMITER if model.is_decoder else None, BUCKETS)["mixed" if model.is_decoder
                                                                                      else "single"]
    with torch.inference_mode():
        flex = pooled_rows(model, build_inputs(units, model.device, LayoutKind.FLEX))
        reference = pooled_rows(model, build_inputs(units, model.device))
    torch.testing.assert_close(flex, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.BFLOAT16])
def test_compiled_trunk_replays_like_the_plain_layers(dtype: DType, tiny_model: Callable[[str], Path]) -> None:
    """--compile on a GPU: every bucket compiles (no fallback), is captured, and its replay equals the plain layers'
    eager pass (float32: to 1e-4; bfloat16: within the capture probe's 5e-2 of the largest value)."""
    model = load_model(tiny_model("qwen3-cls3"), dtype, "cuda", "qwen3-cls3")
    compiler = CompiledTrunk(model.trunk)
    runner = GraphRunner(model, LayoutKind.FLEX, BUCKETS[-2:], max_tokens=BUCKETS[-1], max_seqs=64,
                         compiler=compiler)
    runner.capture()
    assert not compiler.disabled and len(compiler.compiled) == 2 and all(b.graph for b in runner.buckets)
    with torch.inference_mode():
        for bucket in runner.buckets:
            units = batches_for(model, bucket.tokens, DELIMITER, BUCKETS)["mixed"]
            batch = runner.load(bucket, units)
            replayed = runner.forward(bucket)[: len(batch.readouts)].float()
            plain = pooled_rows(model, build_inputs(units, model.device)).float()
            tolerance = 1e-4 if dtype == DType.FLOAT32 else 5e-2 * plain.abs().max().item()
            torch.testing.assert_close(replayed, plain, rtol=0, atol=tolerance)


def test_double_buffered_replays_equal_single_buffer_ones(tiny_model: Callable[[str], Path]) -> None:
    """Two slots per bucket, copies on the copy stream: batches loaded back to back (the second copied while the
    first replays) give the single-buffer runner's rows."""
    model = load_model(tiny_model("qwen3-cls3"), DType.FLOAT32, "cuda", "qwen3-cls3")
    single = GraphRunner(model, LayoutKind.FLEX, BUCKETS[-1:], max_tokens=BUCKETS[-1], max_seqs=64)
    double = GraphRunner(model, LayoutKind.FLEX, BUCKETS[-1:], max_tokens=BUCKETS[-1], max_seqs=64,
                         double_buffer=True)
    single.capture()
    double.capture()
    assert all(slot.graph is not None for slot in double.buckets[0].slots)
    with torch.inference_mode():
        kinds = batches_for(model, BUCKETS[-1], DELIMITER, BUCKETS)
        expected = []
        for units in kinds.values():
            batch = single.load(single.buckets[0], units)
            expected.append(single.forward(single.buckets[0])[: len(batch.readouts)].clone())
        outputs = []
        for units in kinds.values():  # no sync between batches: the next copy overlaps the replay
            batch = double.load(double.buckets[0], units)
            outputs.append(double.forward(double.buckets[0])[: len(batch.readouts)].clone())
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_pinned_copy_returns_the_values() -> None:
    rows = torch.randn(7, 96, device="cuda", dtype=torch.bfloat16)
    vectors, seconds, nbytes = host_vectors(rows)
    assert vectors == rows.float().cpu().tolist()
    assert seconds > 0 and nbytes == 7 * 96 * 2
