"""Graph-shaped eager: the CUDA-graph path (buckets, padding, static buffers, bucket choice) with capture off.

Everything a graph replay depends on except the capture itself runs here on CPU: batches are padded to their bucket,
copied into the bucket's static buffers and run from them. Padded batches must give exactly (bit for bit, float32)
the pooled rows of the same batch unpadded, for every bucket and every kind of batch, whatever the padding token,
wherever this machine's matrix products give a row the same bits whatever the number of rows beside it (MKL's
AVX-512 kernels do for these sizes; its AVX2 kernels, a CPU without AVX-512 or one capped with
`MKL_ENABLE_INSTRUCTIONS=AVX2`, do not): there, to float32 rounding (`assert_padding_changes_nothing`)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import scorekeeper_worker.model.kernels.tiled as tiled
import torch
from prometheus_client.parser import text_string_to_metric_families
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner, probe_units
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool, fits
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.kernels.flex import flex_block_mask
from scorekeeper_worker.model.loader import Pooling, ScoringModel, load_model
from serving import RunningServer

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BUCKETS = (32, 64, 128)
MAX_SEQS = 64
DELIMITER = 3  # a real token id of every tiny vocabulary
CPU = torch.device("cpu")


def _ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(10, 120) for _ in range(count)]


def _single(rng: random.Random, model: ScoringModel, lengths: list[int]) -> list[PackUnit]:
    units = []
    for length in lengths:
        ids = _ids(rng, length)
        # As the planner pools: the mean of every token, the first one (CLS), or the last one (decoders).
        offsets = {Pooling.MEAN: range(length), Pooling.CLS: range(1), Pooling.LAST: range(length - 1, length)}[
            model.pooling]
        types = [0] * (length // 2) + [1] * (length - length // 2) if model.uses_token_types else None
        units.append(PackUnit(ids, token_types=types, position_start=model.position_start,
                              pools=[Pool(offsets, ("single", len(units)))]))
    return units


def _multi_item(rng: random.Random, model: ScoringModel, query: int, items: list[int],
                delimiter: int | None) -> PackUnit:
    """`query [D] item [D] item …` as planning.py lays it out, including empty items (scored at the query's end)."""
    tail = [] if delimiter is None else [delimiter]
    unit = PackUnit(_ids(rng, query) + tail, visible_prefix=query, position_start=model.position_start)
    for length in items:
        offset = unit.num_tokens + length - 1 if length else query - 1
        unit.items.append(_ids(rng, length) + tail)
        unit.pools.append(Pool(range(offset, offset + 1), ("multi", len(unit.pools))))
    return unit


def batches_for(model: ScoringModel, bucket: int, delimiter: int | None, buckets: tuple[int, ...] = BUCKETS,
                max_seqs: int = MAX_SEQS) -> dict[str, list[PackUnit]]:
    """Batches of one kind each (single-item, multi-item, mixed), sized to land in `bucket` of `buckets` (more
    tokens than the next smaller bucket holds) with at most `max_seqs` pooled vectors. Also used by test_cuda.py
    and bench/gpu/gpu_check.py."""
    rng = random.Random(bucket)
    low = max((b for b in buckets if b < bucket), default=0)
    target = rng.randint(max(low + 1, 24), bucket)
    longest_item = max(8, 4 * target // max_seqs)  # items average ≥ 2·target/max_seqs tokens: ≤ max_seqs/2 of them

    def lengths(total: int, longest: int) -> list[int]:
        out: list[int] = []
        while sum(out) < total:
            out.append(min(rng.randint(1, longest), total - sum(out)))
        return out

    def multi_item(query: int, total: int) -> PackUnit:
        extra = delimiter is not None
        items: list[int] = [] if extra else [0]  # an empty item, scored at the query's last token
        used = query + extra
        while used + 1 + extra <= total:
            items.append(min(rng.randint(1, longest_item), total - used - extra))
            used += items[-1] + extra
        return _multi_item(rng, model, query, items, delimiter)

    batches = {"single": _single(rng, model, lengths(target, max(2, bucket // 4)))}
    if model.is_decoder:
        batches["multi-item"] = [multi_item(8, target)]
        first = _single(rng, model, [target // 4])
        last = _single(rng, model, [3])
        batches["mixed"] = [*first, multi_item(5, target - target // 4 - 3), *last]
    for name, units in batches.items():
        tokens = sum(u.num_tokens for u in units)
        assert low < tokens <= bucket, (name, tokens, bucket)
        assert sum(len(u.pools) for u in units) <= max_seqs, (name, bucket, max_seqs)
    return batches


def products_ignore_padding(model: ScoringModel, rows: int, padded: int) -> bool:
    """Whether this machine's matrix products give the same bits with a bucket's padding beside them: every linear
    layer of `model`'s trunk on `rows` rows alone and among `padded` rows, and attention's two products (scores against
    `padded` keys, and a weighted sum whose weights past `rows` keys are zero) against the same over `rows` keys."""
    generator = torch.Generator().manual_seed(rows)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=model.dtype)

    config = model.model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    with torch.inference_mode():
        for layer in model.trunk.modules():  # the heads run on pooled rows, never on padding
            if isinstance(layer, torch.nn.Linear):
                x = randn(padded, layer.in_features)
                if not torch.equal(layer(x[:rows]), layer(x)[:rows]):
                    return False
        q, k, v = randn(1, heads, rows, head_dim), randn(1, heads, padded, head_dim), randn(1, heads, padded, head_dim)
        weights = torch.cat([randn(1, heads, rows, rows), torch.zeros(1, heads, rows, padded - rows)], dim=-1)
        return torch.equal(q @ k[:, :, :rows].transpose(-1, -2), (q @ k.transpose(-1, -2))[..., :rows]) and \
            torch.equal(weights[..., :rows] @ v[:, :, :rows], weights @ v)


def assert_padding_changes_nothing(model: ScoringModel, padded: torch.Tensor, unpadded: torch.Tensor, tokens: int,
                                   bucket_tokens: int, label: str = "") -> None:
    """A padded bucket's rows against the unpadded batch's: bit for bit where the matrix products allow it, else to
    float32 rounding (padding that leaked into attention would move rows far more)."""
    if products_ignore_padding(model, tokens, bucket_tokens):
        assert torch.equal(padded, unpadded), label
    else:
        torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-6, msg=label)


@pytest.fixture(scope="module")
def models(tiny_model: Callable[[str], Path]) -> Callable[[str], ScoringModel]:
    cache: dict[str, ScoringModel] = {}

    def get(name: str) -> ScoringModel:
        if name not in cache:
            cache[name] = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
        return cache[name]

    return get


def _runner(model: ScoringModel, kind: LayoutKind = LayoutKind.DENSE, pad_token: int = 0, **kwargs: Any) -> GraphRunner:
    runner = GraphRunner(model, kind, BUCKETS, max_tokens=BUCKETS[-1], max_seqs=MAX_SEQS, pad_token=pad_token,
                         **kwargs)
    runner.capture()
    return runner


# qwen3: GQA; gemma2: attention softcapping; mistral: a sliding window shorter than the batches; bert-embed: encoder,
# mean pooling; xlmr-cross: positions starting at 2, first-token pooling; bert-cross: token types; modernbert-cross:
# symmetric local windows shorter than the batches.
@pytest.mark.parametrize("fused", [True, False], ids=["cpu-kernels", "gpu-kernels"])
@pytest.mark.parametrize("name", ["qwen3-cls3", "gemma2-reward", "mistral-cls3", "bert-embed", "xlmr-cross",
                                  "bert-cross", "modernbert-cross"])
def test_padded_batches_equal_unpadded_ones_in_every_bucket(name: str, fused: bool,
                                                            models: Callable[[str], ScoringModel],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if not fused:  # the row blocks as a GPU runs them: explicit float32 tiles, no fused CPU kernel
        monkeypatch.setattr(tiled, "fused_kernel", lambda device: False)
    model = models(name)
    runner = _runner(model)
    assert not runner.capture_enabled
    with torch.inference_mode():
        for bucket in runner.buckets:
            for kind, units in batches_for(model, bucket.tokens, DELIMITER if model.is_decoder else None).items():
                assert runner.select(units) is bucket, kind  # the smallest bucket that fits
                batch = runner.load(bucket, units)
                live = len(batch.readouts)
                padded = runner.forward(bucket)
                assert padded.shape[0] == MAX_SEQS + 1  # the bucket's slots and the scratch one
                unpadded = pooled_rows(model, build_inputs(units, CPU, LayoutKind.DENSE))
                assert batch.padding_tokens == bucket.tokens - batch.num_tokens
                assert_padding_changes_nothing(model, padded[:live], unpadded, batch.num_tokens, bucket.tokens,
                                               f"{name} {kind} bucket {bucket.tokens}")
                reference = pooled_rows(model, build_inputs(units, CPU))  # row blocks, the eager path
                torch.testing.assert_close(padded[:live], reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False], ids=["cpu-kernels", "gpu-kernels"])
@pytest.mark.parametrize("name", ["qwen3-cls3", "gemma2-reward", "bert-embed", "xlmr-cross", "modernbert-cross"])
def test_capture_probe_agrees_with_row_blocks(name: str, fused: bool, models: Callable[[str], ScoringModel],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch that checks every capture (plain sequences and a multi-item group, encoders included) gives the row
    blocks' rows on the padded path of both layouts, also with the kernels a GPU runs (no fused CPU kernel). On an
    H200 it refused every float32 bert-embed bucket: the row blocks ran encoder items causally, the token layouts
    bidirectionally, as the model runs a row."""
    if not fused:
        monkeypatch.setattr(tiled, "fused_kernel", lambda device: False)
    model = models(name)
    vocab = model.model.get_input_embeddings().num_embeddings
    for kind in (LayoutKind.DENSE, LayoutKind.FLEX):
        runner = _runner(model, kind)
        with torch.inference_mode():
            for bucket in runner.buckets:
                units = probe_units(bucket.shape, vocab, model.position_start)
                batch = runner.load(bucket, units)
                padded = runner.forward(bucket)[: len(batch.readouts)]
                reference = pooled_rows(model, build_inputs(units, CPU))
                torch.testing.assert_close(padded, reference, rtol=1e-5, atol=1e-5, msg=f"{kind} {bucket.tokens}")
                runner._check(bucket)  # the capture's own check, at its tolerance


@pytest.mark.parametrize("kind", [LayoutKind.DENSE, LayoutKind.FLEX])
def test_delimiter_valued_padding_changes_no_score(kind: LayoutKind, models: Callable[[str], ScoringModel]) -> None:
    """The SGLang failure: padding made of the delimiter token. Boundaries come from the host, so nothing moves."""
    model = models("qwen3-cls3")
    units = batches_for(model, 128, DELIMITER)["multi-item"]
    results = []
    with torch.inference_mode():
        for pad_token in (0, DELIMITER, 7):
            runner = _runner(model, kind, pad_token=pad_token)
            bucket = runner.select(units)
            assert bucket is not None and bucket.tokens == 128
            batch = runner.load(bucket, units)
            assert (batch.input_ids[0, batch.num_tokens:] == pad_token).all()
            results.append(runner.forward(bucket)[: len(batch.readouts)].clone())
        unpadded = pooled_rows(model, build_inputs(units, CPU, kind))
    for result in results:
        assert torch.equal(result, results[0])  # the same products: the padding token changes no bit
        assert_padding_changes_nothing(model, result, unpadded, batch.num_tokens, 128)


def test_static_buffers_are_refilled_between_batches(models: Callable[[str], ScoringModel]) -> None:
    """Two different batches through the same bucket's buffers: nothing of the first (masks included) survives."""
    model = models("qwen3-cls3")
    runner = _runner(model)
    first, second = batches_for(model, 64, None)["mixed"], batches_for(model, 64, DELIMITER)["single"]
    with torch.inference_mode():
        for units in (first, second, first):
            bucket = runner.select(units)
            assert bucket is not None and bucket.tokens == 64
            batch = runner.load(bucket, units)
            out = runner.forward(bucket)[: len(batch.readouts)]
            unpadded = pooled_rows(model, build_inputs(units, CPU, LayoutKind.DENSE))
            assert_padding_changes_nothing(model, out, unpadded, batch.num_tokens, bucket.tokens)


def test_double_buffered_slots_give_the_single_buffer_results(models: Callable[[str], ScoringModel]) -> None:
    """Double buffering alternates two sets of static buffers per bucket (on a GPU: batch N+1 copied on a copy
    stream while N replays); every batch's rows are bit-identical to the single-buffer runner's."""
    model = models("qwen3-cls3")
    single, double = _runner(model), _runner(model, double_buffer=True)
    batches = [batches_for(model, 64, DELIMITER)[kind] for kind in ("mixed", "single", "multi-item", "mixed")]
    used = []
    with torch.inference_mode():
        for units in batches:
            bucket, other = double.select(units), single.select(units)
            assert bucket is not None and other is not None and len(bucket.slots) == 2
            batch = double.load(bucket, units)
            used.append(bucket.current)
            single.load(other, units)
            live = len(batch.readouts)
            assert torch.equal(double.forward(bucket)[:live], single.forward(other)[:live])
    assert used == [1, 0, 1, 0]  # the slots alternate
    assert double.buckets[0].slots[0].static is not double.buckets[0].slots[1].static


def test_bucket_selection(models: Callable[[str], ScoringModel]) -> None:
    model = models("qwen3-cls3")
    runner = _runner(model)

    def units(lengths: list[int]) -> list[PackUnit]:
        return [PackUnit([5] * n, pools=[Pool(range(n - 1, n), i)]) for i, n in enumerate(lengths)]

    assert runner.select(units([1])).tokens == 32
    assert runner.select(units([32])).tokens == 32
    assert runner.select(units([20, 13])).tokens == 64
    assert runner.select(units([128])).tokens == 128
    assert runner.select(units([100, 29])) is None  # above the largest bucket: eager
    assert runner.select(units([1] * 20)).tokens == 32
    assert runner.select(units([1] * (MAX_SEQS + 1))) is None  # more scored sequences than slots: eager
    runner.buckets[0].disabled = True  # a bucket whose capture failed is skipped
    assert runner.select(units([1])).tokens == 64
    shape = GraphShape(tokens=16, sequences=2)
    many_empty = PackUnit([1, 2], items=[[], [], []], visible_prefix=2,
                          pools=[Pool(range(1, 2), i) for i in range(3)])
    assert not fits([many_empty], shape)
    with pytest.raises(ValueError, match="does not fit"):
        build_inputs([many_empty], CPU, LayoutKind.DENSE, shape)
    with pytest.raises(ValueError, match="token layout"):
        build_inputs(units([3]), CPU, LayoutKind.BLOCKS, shape)


def test_graph_shaped_forward_reads_no_device_value(models: Callable[[str], ScoringModel],
                                                    tiny_model: Callable[[str], Path]) -> None:
    """A capturable forward never reads a device value on the host (`.item()`, `if tensor:`): on the meta device,
    which has no values, any such read raises. The whole trunk + pooling runs there, and so does the flex mask."""
    model = load_model(tiny_model("gemma2-cls3"), DType.FLOAT32, "cpu", "meta")
    model.model.to("meta")
    meta = torch.device("meta")
    units = batches_for(models("gemma2-cls3"), 128, DELIMITER)["mixed"]
    shape = GraphShape(tokens=128, sequences=MAX_SEQS)
    with torch.inference_mode():
        out = pooled_rows(model, build_inputs(units, meta, LayoutKind.DENSE, shape))
        assert out.shape == (MAX_SEQS + 1, 32) and out.device == meta
        tokens = build_inputs(units, meta, LayoutKind.FLEX, shape).layout.tokens
        assert tokens is not None
        assert flex_block_mask(tokens, causal=True, window=4).kv_num_blocks.device == meta


class _StaleGraph:
    """Stands in for a captured graph that baked in its capture batch: replay changes nothing."""

    def replay(self) -> None:
        pass


def test_capture_failures_fall_back_to_eager(models: Callable[[str], ScoringModel],
                                             caplog: pytest.LogCaptureFixture) -> None:
    model = models("qwen3-cls3")
    failures: list[int] = []
    with caplog.at_level(logging.ERROR, logger="scorekeeper_worker.engine.runner.cuda_graphs"):
        runner = _runner(model, capture=True, on_capture_failure=lambda: failures.append(1))  # no CUDA: fails
    assert len(failures) == len(BUCKETS)
    assert all(b.disabled and b.graph is None for b in runner.buckets)
    assert "CUDA graph capture of the 128-token bucket failed" in caplog.text
    assert runner.select([PackUnit([1, 2], pools=[Pool(range(1, 2), 0)])]) is None  # so: eager

    # A graph that "captured" but replays stale values is caught by the probe batch and disabled the same way.
    runner = _runner(model)
    bucket = runner.buckets[1]
    with torch.inference_mode():
        bucket.output = pooled_rows(model, bucket.static)  # what the capture batch gave
    bucket.graph = _StaleGraph()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="replay differs from eager"), torch.inference_mode():
        runner._check(bucket)


def test_server_with_cuda_graph_flag_scores_like_eager(tiny_model: Callable[[str], Path],
                                                       server_for: Callable[..., RunningServer]) -> None:
    """End to end over HTTP: --cuda-graph on CPU runs the padded path; scores, pooled hidden states and
    multi-item scores equal the eager server's, and the metrics say which path and bucket ran."""
    path = tiny_model("qwen3-cls3")
    eager = server_for(path, multi_item_scoring=True)
    graphs = server_for(path, multi_item_scoring=True, cuda_graph=True, cuda_graph_token_buckets=(64, 256),
                        cuda_graph_max_seqs=16)
    rng = random.Random(5)
    query, items = _ids(rng, 12), [_ids(rng, rng.randint(1, 9)) for _ in range(7)]
    big = [_ids(rng, 120) for _ in range(4)]  # single-item, 4 × 132 tokens: above the largest bucket → eager
    # Eager CPU runs fused flash kernels, the graph path explicit float32 scores: rounding differs (≈ 1e-6).
    for body in ({"multi_item_scoring": True}, {"multi_item_scoring": False}, {"return_pooled_hidden_states": True}):
        want = eager.score(query=query, items=items, **body).json()
        got = graphs.score(query=query, items=items, **body).json()
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=1e-5)
        if "pooled_hidden_states" in body:
            np.testing.assert_allclose(got["pooled_hidden_states"], want["pooled_hidden_states"], rtol=1e-5,
                                       atol=1e-5)
    got, want = graphs.score(query=query, items=big).json(), eager.score(query=query, items=big).json()
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=1e-5)
    runs: dict[tuple[str, str], float] = {}
    padding = 0.0
    for family in text_string_to_metric_families(httpx.get(graphs.url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "scorekeeper_cuda_graph_runs_total":
                runs[sample.labels["path"], sample.labels["bucket"]] = sample.value
            elif sample.name == "scorekeeper_padding_tokens_total":
                padding = sample.value
    assert runs["padded", "64"] >= 1  # the multi-item request
    assert runs["padded", "256"] >= 1  # seven single-item sequences
    assert runs["eager", "none"] >= 1  # above the largest bucket
    assert padding > 0
