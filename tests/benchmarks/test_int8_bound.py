"""bench/cpu/int8_bound.py: its int8 kernels compute the model's own linear layers, its split finds the linear layers
and attention products in a real request's profile, and the bound is Amdahl's."""

from __future__ import annotations

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.files import minilm_path
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.model.trunk_patches import FusedLinear, fuse_linears

from bench.cpu import int8_bound
from bench.cpu.bench_minilm import make_workload


def test_bound_is_amdahls_law() -> None:
    assert int8_bound.bound(0.0, 4.0) == 1.0
    assert int8_bound.bound(1.0, 4.0) == pytest.approx(4.0)
    assert int8_bound.bound(0.5, 3.0) == pytest.approx(1.5)  # half the time, three times faster: 0.5 + 0.5 / 3


@pytest.mark.parametrize("gelu", [False, True])
def test_int8_kernels_compute_the_linear_layer(gelu: bool) -> None:
    torch.manual_seed(0)
    module = FusedLinear(torch.nn.Linear(64, 48), gelu=gelu)
    # full 8-bit activations on CPUs with VNNI, 7-bit where products saturate in 16 bits (AVX2, or capped to it)
    q_x = torch.randint(0, int8_bound.X_LEVELS, (32, 64), dtype=torch.uint8)
    x = (q_x.float() - int8_bound.X_ZERO_POINT) * int8_bound.X_SCALE
    scale = module.weight.abs().amax(1) / 127
    weight = torch.round(module.weight / scale[:, None]) * scale[:, None]  # what the int8 weights hold
    reference = torch.nn.functional.linear(x, weight, module.bias)
    reference = torch.nn.functional.gelu(reference) if gelu else reference
    expected = torch.clamp(torch.round(reference / int8_bound.OUT_SCALE) + int8_bound.ZERO_POINT, 0, 255)
    kernels = int8_bound.int8_kernels(module, 32)
    assert set(kernels) == ({"oneDNN"} if gelu else {"oneDNN", "FBGEMM"})
    for name, kernel in kernels.items():
        out = kernel(q_x)
        assert out.dtype == torch.uint8 and out.shape == (32, 48), name
        assert (out.float() - expected).abs().max() <= 1, name  # one step of rounding


@pytest.fixture(scope="module")
def minilm() -> ScoringModel:
    scoring = load_model(minilm_path(), DType.FLOAT32, "cpu", "int8-bound")
    fuse_linears(scoring.trunk)
    return scoring


def test_rate_ratio_times_every_linear_layer(minilm: ScoringModel) -> None:
    calls: list[int] = []
    trunk = minilm.trunk
    for module in trunk.modules():
        if isinstance(module, FusedLinear):
            module.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    assert int8_bound.int8_rate_ratio(trunk, tokens=64, reps=1) > 0
    assert calls == [64] * (6 * 6 * 2)  # 36 linear layers, one warm-up and one timed call each


def test_split_finds_linear_layers_and_attention_in_a_request(minilm: ScoringModel) -> None:
    split = int8_bound.time_split(minilm, make_workload(minilm_path(), "short", 8, 0))
    assert split["seconds"] > 0
    # Both categories are found and are shares of the whole; their sizes are timings (load moves them), which
    # the benchmark reports and this test does not judge.
    assert 0 < split["linear"] < 1 and 0 < split["attention"] < 1
    assert split["linear"] + split["attention"] < 1
