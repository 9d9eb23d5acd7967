"""The compiled trunk (`--compile`, engine/runner/compiled_trunk.py) on CPU: exact against transformers in float32,
no further from a float32 reference than the plain layers in bfloat16, and never fatal.

Inductor on CPU needs a C++ compiler and takes ~20 s per compile, so only three real compiles run here (float32
static bucket, float32 eager with dynamic shapes, bfloat16 static bucket), on a two-layer Qwen3. The fallbacks
(failure, budget) are driven by a pass that raises when it is asked to run compiled, so they cost no compile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import reference
import tiny_models
import torch
from scorekeeper_worker.base.config import CompileMode, DType, WorkerConfig
from scorekeeper_worker.cli import parse_config
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.compiled_trunk import (
    EAGER_KEY,
    CompiledTrunk,
    _mode,
    compile_enabled,
    trunk_layers,
)
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import PackUnit
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import ScoringModel, load_model

from bench.gpu import gpu_mis

CPU = torch.device("cpu")
needs_compiler = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("g++") is None,
                                    reason="Inductor on CPU needs a C++ compiler")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.build("qwen3-cls3", tmp_path_factory.mktemp("compiled"))


def _load(path: Path, dtype: DType) -> ScoringModel:
    return load_model(path, dtype, "cpu", "qwen3-cls3")


def _batch(model: ScoringModel) -> tuple[list[PackUnit], list[PackUnit]]:
    """A multi-item unit (query of 9, 4 items of 5) and the same items as plain sequences."""
    unit, singles = gpu_mis.mis_batch(model, query_len=9, items=4, item_len=5, delimiter=3)
    return [unit], singles


def _bucket_rows(model: ScoringModel, compiler: CompiledTrunk | None, units: list[PackUnit]) -> torch.Tensor:
    """Pooled rows through a 64-token graph bucket (the padded path on CPU: what a GPU bucket captures)."""
    runner = GraphRunner(model, LayoutKind.DENSE, [64], 64, 8, compiler=compiler)
    bucket = runner.buckets[0]
    batch = runner.load(bucket, units)
    return runner.forward(bucket)[: len(batch.readouts)].float()


@needs_compiler
def test_float32_compiled_trunk_equals_transformers(model_dir: Path) -> None:
    model = _load(model_dir, DType.FLOAT32)
    compiler = CompiledTrunk(model.trunk)
    units, singles = _batch(model)
    hf_model, _, _ = reference.load_model(model_dir)
    expected = torch.tensor([reference.classifier_pooled(hf_model, single.context) for single in singles],
                            dtype=torch.float32)
    with torch.inference_mode():
        static = _bucket_rows(model, compiler, units)
        dynamic = compiler.run(EAGER_KEY, False, lambda: pooled_rows(model, build_inputs(units, CPU)))
    assert set(compiler.compiled) == {"the 64-token bucket", EAGER_KEY} and not compiler.disabled
    torch.testing.assert_close(static, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dynamic, expected, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_bfloat16_compiled_trunk_is_no_further_from_float32(model_dir: Path) -> None:
    """Both bfloat16 trunks against the float32 one: compiling may round differently, never worse overall."""
    units, _ = _batch(_load(model_dir, DType.FLOAT32))
    with torch.inference_mode():
        truth = _bucket_rows(_load(model_dir, DType.FLOAT32), None, units)
        plain = _bucket_rows(_load(model_dir, DType.BFLOAT16), None, units)
        model = _load(model_dir, DType.BFLOAT16)
        compiler = CompiledTrunk(model.trunk)
        compiled = _bucket_rows(model, compiler, units)
    assert compiler.compiled and not compiler.disabled
    plain_error = (plain - truth).abs().max().item()
    compiled_error = (compiled - truth).abs().max().item()
    scale = truth.abs().max().item()
    assert compiled_error <= 1.25 * plain_error + 1e-3 * scale, (compiled_error, plain_error)
    assert plain_error < 5e-2 * scale  # the docs' bfloat16 tolerance, so the comparison means something


def test_the_layers_are_one_list_and_plain_outside_a_compiled_pass(model_dir: Path) -> None:
    model = _load(model_dir, DType.FLOAT32)
    layers = trunk_layers(model.trunk)
    assert layers == list(model.trunk.layers)
    units, _ = _batch(model)
    with torch.inference_mode():
        before = pooled_rows(model, build_inputs(units, CPU))
        CompiledTrunk(model.trunk)
        after = pooled_rows(model, build_inputs(units, CPU))  # no compile mode set: the plain layers, no compile
    assert torch.equal(before, after)


def test_a_failing_compile_falls_back_to_plain_layers(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []
    compiler = CompiledTrunk(_load(model_dir, DType.FLOAT32).trunk, on_failure=lambda: failures.append(1))
    modes: list[str | None] = []

    def forward() -> str:
        modes.append(_mode.get())
        if _mode.get() is not None:
            raise RuntimeError("inductor lowering failed")
        return "plain"

    assert compiler.run("the 256-token bucket", True, forward) == "plain"
    assert compiler.run("the 256-token bucket", True, forward) == "plain"  # stays plain: no second attempt
    assert modes == ["static", None, None] and failures == [1]
    assert "the 256-token bucket" in compiler.disabled and not compiler.compiled
    assert "torch.compile of the trunk failed for the 256-token bucket" in caplog.text
    assert compiler.run(EAGER_KEY, False, lambda: _mode.get()) == "dynamic"  # other keys keep compiling


def test_the_compile_budget_leaves_later_targets_plain(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    compiled: list[str] = []
    compiler = CompiledTrunk(_load(model_dir, DType.FLOAT32).trunk, budget_seconds=1e-9,
                             on_compiled=lambda key, seconds: compiled.append(key))
    assert compiler.run("the 8192-token bucket", True, lambda: _mode.get()) == "static"  # the budget is not spent yet
    assert compiler.run("the 4096-token bucket", True, lambda: _mode.get()) is None
    assert compiler.run("the 8192-token bucket", True, lambda: _mode.get()) == "static"  # compiled ones stay
    assert compiled == ["the 8192-token bucket"] and compiler.disabled == {"the 4096-token bucket": "budget"}
    assert "compile budget" in caplog.text


def test_the_flag_defaults_to_off_until_proven_on_a_gpu() -> None:
    assert WorkerConfig(model="m").compile == CompileMode.AUTO
    assert not compile_enabled("auto", torch.device("cuda")) and not compile_enabled("auto", CPU)
    assert compile_enabled("on", CPU) and not compile_enabled("off", torch.device("cuda"))
    config = parse_config(["serve", "--model", "m", "--compile", "on", "--compile-budget-seconds", "90",
                           "--compile-cache-dir", "/cache/compile"], environ={})
    assert (config.compile, config.compile_budget_seconds) == (CompileMode.ON, 90.0)
    assert config.compile_cache_dir == Path("/cache/compile")


def test_the_compile_cache_is_keyed_by_the_cpu_vector_instructions(tmp_path: Path) -> None:
    """A cache written by an AVX-512 process and read by an AVX2 one ran 16-lane kernels built for 8 lanes (an abort
    in the suite capped to AVX2): each instruction set gets its own directory, and so does Inductor's default."""
    code = ("import os; from pathlib import Path; from scorekeeper_worker.engine.runner.compiled_trunk import "
            "CompiledTrunk, keyed_cache_dir; import torch; "
            "trunk = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])); "
            "CompiledTrunk(trunk); print(keyed_cache_dir(Path('/cache'))); "
            "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])")

    def directories(isa: str, inductor_dir: Path | None = None) -> list[str]:
        environ = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        environ["ATEN_CPU_CAPABILITY"] = isa
        if inductor_dir is not None:  # the pod's emptyDir, set by the operator
            environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
        return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                              check=True).stdout.split()

    native, avx2 = directories("default"), directories("avx2")
    key = f"torch-{torch.__version__}-avx2"
    assert avx2[0] == f"/cache/{key}" and Path(avx2[1]).name == key
    assert directories("avx2", tmp_path)[1] == str(tmp_path / key)
    host_has_avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
    assert (native != avx2) == host_has_avx512, (native, avx2)
