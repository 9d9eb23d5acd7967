"""GPU checks (marked `cuda`, skipped without an NVIDIA GPU): captured graphs replay like eager for every bucket,
FlexAttention compiled through Triton equals the row-block reference, two batches in flight (double-buffered slots,
heads enqueued behind the replay, results copied back behind an event) give what one at a time gives.

bench/gpu/gpu_check.py runs the same checks plus timings in one command; see docs/gpu.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.compiled_trunk import CompiledTrunk
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.heads import ClassProbs, RowHead, RowResult
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import load_model
from test_graph_shaped import DELIMITER, batches_for

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

BUCKETS = (64, 128, 256, 512)


@pytest.mark.parametrize("kind", [LayoutKind.DENSE, LayoutKind.FLEX, LayoutKind.TRITON])
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


@pytest.mark.parametrize("kind", [LayoutKind.FLEX, LayoutKind.TRITON])
@pytest.mark.parametrize("name", ["qwen3-causal", "gemma2-cls3", "bert-cross"])
def test_compiled_kernels_equal_sdpa(name: str, kind: LayoutKind, tiny_model: Callable[[str], Path]) -> None:
    """Compiled flex and the Triton kernel (which gives Gemma2's windowed and softcapped layers to flex)."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cuda", name)
    units = batches_for(model, 512, DELIMITER if model.is_decoder else None, BUCKETS)["mixed" if model.is_decoder
                                                                                      else "single"]
    with torch.inference_mode():
        kernel = pooled_rows(model, build_inputs(units, model.device, kind))
        reference = pooled_rows(model, build_inputs(units, model.device))
    torch.testing.assert_close(kernel, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_kernel_equals_sdpa_with_the_dense_mask_on_the_gpu(dtype: torch.dtype) -> None:
    """The kernel's own tensor-core products (under the interpreter bfloat16 tiles are multiplied in float32)."""
    import random

    from scorekeeper_worker.engine.runner import token_packing
    from scorekeeper_worker.engine.runner.packing import PackUnit
    from scorekeeper_worker.model.kernels import mis_attention
    from scorekeeper_worker.model.kernels.layout import token_allowed

    rng = random.Random(0)
    units = [PackUnit([1] * 120, items=[[2] * rng.randint(1, 180) for _ in range(10)], visible_prefix=120,
                      parents=[-1] * 5 + [0, 1, 2, 3, 4]) for _ in range(3)] + [PackUnit([3] * 300)]
    arrays = token_packing.pack(units, work_block=mis_attention.BLOCK_M)
    inputs = token_packing.inputs(arrays, LayoutKind.TRITON, False, torch.device("cuda"))
    tokens = inputs.layout.tokens
    assert tokens is not None and tokens.work is not None and tokens.work_count is not None
    total = tokens.segment.shape[0]
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, h, total, 128, device="cuda", generator=generator, dtype=dtype) for h in (16, 8, 8))
    out = mis_attention.mis_attention(q, k, v, tokens.work, tokens.work_count, True, 128**-0.5)
    index = torch.arange(total, device="cuda")
    allowed = token_allowed(tokens, index[:, None], index[None, :], True, None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), attn_mask=allowed[None, None],
        scale=128**-0.5)[0].transpose(0, 1)
    torch.testing.assert_close(out[0].float(), expected, rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)


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
    single = GraphRunner(model, LayoutKind.FLEX, BUCKETS[-1:], max_tokens=BUCKETS[-1], max_seqs=64,
                         double_buffer=False)
    double = GraphRunner(model, LayoutKind.FLEX, BUCKETS[-1:], max_tokens=BUCKETS[-1], max_seqs=64)
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


class _Recorded:
    """A job that keeps each row's class scores and pre-head vector."""

    def __init__(self) -> None:
        self.rows: dict[object, RowResult] = {}

    def head(self, slot: object) -> RowHead:
        return RowHead(ClassProbs(True, 1.0), vector=True)

    def absorb(self, slots: list[object], rows: list[RowResult]) -> None:
        self.rows.update(zip(slots, rows, strict=True))


def test_two_batches_in_flight_give_what_one_at_a_time_gives(tiny_model: Callable[[str], Path]) -> None:
    """Launch batch N+1 before finishing N (the scheduler's pipeline): same class scores and pooled vectors as
    batches run one by one, and N is finished while N+1 may still run."""
    model = load_model(tiny_model("qwen3-cls3"), DType.FLOAT32, "cuda", "qwen3-cls3")
    runner = GraphRunner(model, LayoutKind.FLEX, BUCKETS, max_tokens=BUCKETS[-1], max_seqs=64)
    runner.capture()
    executor = Executor(model, "flex", runner)
    batches = [units for bucket in BUCKETS[-2:] for units in batches_for(model, bucket, DELIMITER, BUCKETS).values()]
    alone, piped = [_Recorded() for _ in batches], [_Recorded() for _ in batches]
    for job, units in zip(alone, batches, strict=True):
        executor.run([(job, unit) for unit in units])
    launched = [executor.launch([(job, unit) for unit in units]) for job, units in zip(piped[:2], batches, strict=True)]
    for i, (job, units) in enumerate(zip(piped[2:], batches[2:], strict=True)):
        executor.finish(launched[i])
        launched.append(executor.launch([(job, unit) for unit in units]))
    for flight in launched[len(batches) - 2:]:
        executor.finish(flight)
    for got, want in zip(piped, alone, strict=True):
        assert got.rows.keys() == want.rows.keys()
        for slot, row in want.rows.items():
            assert got.rows[slot].scores == row.scores and got.rows[slot].vector == row.vector
