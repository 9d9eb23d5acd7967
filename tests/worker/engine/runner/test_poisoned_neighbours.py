"""One request's overflow never reaches its neighbours: masked keys and padding contribute exactly nothing, whatever
their values, in every attention layout (row blocks on the fused and the explicit path, graph buckets in the dense,
flex and Triton layouts, flex eagerly) and in the padded trunk (the model's own attention on padded blocks).

In float16 one request's activations can overflow. Masked keys used to get weight 0 and still be multiplied
(0 × inf = NaN), and row blocks padded every shorter row with packed token 0, so a co-batched request's rows turned
NaN. Here the first request of a batch gets keys and values of inf and NaN at every layer (or, in the padded trunk,
tokens whose embedding overflows float16); every other request's pooled rows must be bit for bit those of the same
batch without the poison, and the poisoned request's own rows non-finite (the poison did reach the forward)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import scorekeeper_worker.model.kernels.tiled as tiled
import torch
from leaky_attention import poisoned_keys
from packed_units import mixed_units
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import Pooling, ScoringModel, load_model

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
CPU = torch.device("cpu")
POISONED = 9  # tokens of the first request
OVERFLOWING = 7  # a token id no neighbour holds (packed_units draws ids from 10 up, and 3 as the delimiter)
BUCKET = 256
INF, NAN = float("inf"), float("nan")
# (layout, graph bucket, fused CPU kernel): the CPU's row blocks, the explicit path other devices take, graph buckets.
LAYOUTS = {"blocks": (LayoutKind.BLOCKS, False, True), "blocks-explicit": (LayoutKind.BLOCKS, False, False),
           "dense-bucket": (LayoutKind.DENSE, True, True), "flex": (LayoutKind.FLEX, False, True),
           "triton-bucket": (LayoutKind.TRITON, True, True)}
# qwen3: causal, multi-item groups (the Triton kernel); mistral: a sliding window (masks on the fused kernel, flex
# beside the Triton kernel); gemma2: softcapping (the explicit path; every layer flex in the Triton layout, so that
# layout is flex's); roberta: an encoder (key-padding masks). Row blocks in float32 too: on CPU short float32 rows
# take batched products with an additive mask, float16 ones the fused kernel.
MODELS = ["qwen3-cls3", "mistral-cls3", "gemma2-cls3", "roberta-cross"]
CASES = [(name, layout, dtype) for name in MODELS for layout in LAYOUTS
         for dtype in ([DType.FLOAT16, DType.FLOAT32] if layout == "blocks" else [DType.FLOAT16])
         if not (layout == "triton-bucket" and name == "gemma2-cls3")]


@functools.cache
def _model(path: Path, dtype: DType) -> ScoringModel:
    """A model loaded once for every layout and poison (none of them changes it)."""
    return load_model(path, dtype, "cpu", path.name)


def _batch(model: ScoringModel) -> list[PackUnit]:
    """The poisoned request first (so its first token is packed token 0, which padding used to read), then
    neighbours of other lengths (padded blocks) and, for decoders, multi-item groups; pooled as the model pools."""
    rng = random.Random(3)
    groups = ((30, [5, 1, 12, 0, 9]), (4, [2, 20])) if model.is_decoder else ()
    units = mixed_units(model, rng, (POISONED, 3, 7, 40, 70), groups)
    if model.pooling == Pooling.CLS:
        for unit in units:
            unit.pools = [Pool(range(1), pool.slot) for pool in unit.pools]
    return units


def _pooled(model: ScoringModel, units: list[PackUnit], kind: LayoutKind, bucket: bool) -> torch.Tensor:
    with torch.inference_mode():
        if not bucket:
            return pooled_rows(model, build_inputs(units, CPU, kind)).clone()
        runner = GraphRunner(model, kind, (BUCKET,), max_tokens=BUCKET, max_seqs=64)
        batch = runner.load(runner.buckets[0], units)
        return runner.forward(runner.buckets[0])[:len(batch.readouts)].clone()


def _assert_isolated(clean: torch.Tensor, dirty: torch.Tensor) -> None:
    assert not torch.isfinite(dirty[0]).all()  # the poisoned request's own row
    assert torch.isfinite(dirty[1:]).all(), (~torch.isfinite(dirty[1:])).any(-1).nonzero().flatten().tolist()
    assert torch.equal(dirty[1:], clean[1:])


@pytest.mark.parametrize(("key", "value"), [(NAN, INF), (-INF, NAN)])
@pytest.mark.parametrize(("name", "layout", "dtype"), CASES)
def test_a_neighbour_s_inf_and_nan_keys_and_values_reach_nobody_else(
        name: str, layout: str, dtype: DType, key: float, value: float, tiny_model: Callable[[str], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    kind, bucket, fused = LAYOUTS[layout]
    model = _model(tiny_model(name), dtype)
    if not fused:
        monkeypatch.setattr(tiled, "fused_kernel", lambda device: False)
    units = _batch(model)
    clean = _pooled(model, units, kind, bucket)
    with poisoned_keys(POISONED, key, value):
        dirty = _pooled(model, units, kind, bucket)
    _assert_isolated(clean, dirty)


@pytest.mark.parametrize("name", ["deberta-v2-cross", "roberta-cross", "qwen3-cls3"])
def test_a_neighbour_s_overflowing_embedding_reaches_nobody_else(name: str,
                                                                 tiny_model: Callable[[str], Path]) -> None:
    """float16 as the issue reproduced it: one token's embedding at 70,000 (inf in float16). DeBERTa runs its own
    attention on padded blocks, whose padding used to read packed token 0's id."""
    model = load_model(tiny_model(name), DType.FLOAT16, "cpu", name)
    units = _batch(model)
    clean = _pooled(model, units, LayoutKind.BLOCKS, False)
    with torch.no_grad():
        model.model.get_input_embeddings().weight[OVERFLOWING] = 70_000.0
    units[0].context = [OVERFLOWING] * len(units[0].context)
    dirty = _pooled(model, units, LayoutKind.BLOCKS, False)
    _assert_isolated(clean, dirty)
