"""`--dtype`: float16 exists; `auto` is the checkpoint's dtype where the hardware runs it fast, decided by a pure
function over injected capabilities (tested here for hardware this machine does not have)."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from scorekeeper_worker.base.config import Device, DType
from scorekeeper_worker.cli import parse_config
from scorekeeper_worker.model.dtypes import Hardware, choose_dtype, cpu_flags, detect_hardware, host_cpu_flags
from scorekeeper_worker.model.loader import load_model
from serving import RunningServer

CPU_PLAIN = Hardware(Device.CPU, bf16=False, description="CPU (no bfloat16 instructions)")
CPU_BF16 = Hardware(Device.CPU, bf16=True, description="CPU (avx512_bf16)")
CPU_AMX = Hardware(Device.CPU, bf16=True, description="CPU (amx_bf16, avx512_bf16)", amx=True)
GPU_T4 = Hardware(Device.CUDA, bf16=False, description="Tesla T4")
GPU_A100 = Hardware(Device.CUDA, bf16=True, description="NVIDIA A100")


@pytest.mark.parametrize(("checkpoint", "hardware", "expected"), [
    (torch.bfloat16, CPU_PLAIN, torch.float32),  # emulated bfloat16 is 5-6x slower than float32
    (torch.bfloat16, CPU_BF16, torch.bfloat16),
    (torch.bfloat16, GPU_T4, torch.float16),
    (torch.bfloat16, GPU_A100, torch.bfloat16),
    (torch.float16, CPU_PLAIN, torch.float32),
    (torch.float16, CPU_BF16, torch.float32),
    (torch.float16, GPU_T4, torch.float16),
    (torch.float32, GPU_A100, torch.float32),
    (torch.float32, CPU_BF16, torch.float32),  # AVX512-BF16 without AMX: float32 stays float32
    (torch.bfloat16, CPU_AMX, torch.bfloat16),
    (None, GPU_T4, torch.float32),  # unknown (GGUF, de-quantized): float32
])
def test_auto_picks_the_checkpoint_dtype_where_the_hardware_runs_it(
        checkpoint: torch.dtype | None, hardware: Hardware, expected: torch.dtype) -> None:
    choice = choose_dtype(DType.AUTO, checkpoint, hardware)
    assert choice.dtype == expected
    assert choice.reason.startswith("auto: the checkpoint is")
    assert hardware.description in choice.reason or (expected == torch.float32 and "float32" in choice.reason)


@pytest.mark.parametrize("checkpoint", [torch.float32, None])
def test_auto_runs_float32_checkpoints_in_bfloat16_on_amx(checkpoint: torch.dtype | None) -> None:
    choice = choose_dtype(DType.AUTO, checkpoint, CPU_AMX)
    assert choice.dtype == torch.bfloat16 and "has AMX" in choice.reason
    assert choose_dtype(DType.FLOAT32, checkpoint, CPU_AMX).dtype == torch.float32  # asked for: as asked


@pytest.mark.parametrize("requested", [DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16])
def test_explicit_dtype_is_taken_as_asked(requested: DType) -> None:
    choice = choose_dtype(requested, torch.bfloat16, CPU_PLAIN)
    assert choice.dtype == getattr(torch, requested.value) and choice.reason == f"--dtype {requested.value}"


def test_bfloat16_on_a_gpu_without_it_is_refused() -> None:
    with pytest.raises(ValueError, match="--dtype bfloat16: Tesla T4 has no bfloat16 support; use --dtype float16"):
        choose_dtype(DType.BFLOAT16, torch.bfloat16, GPU_T4)


def test_cpu_flags_from_proc_cpuinfo() -> None:
    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\nbugs\t\t: spectre\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"
    assert {"avx512_bf16", "avx2"} <= cpu_flags(x86) and "spectre" not in cpu_flags(x86)
    assert "bf16" in cpu_flags(arm)
    assert cpu_flags("") == set()


def test_instruction_set_caps_remove_the_flags_above_them(tmp_path: Path) -> None:
    """`ONEDNN_MAX_CPU_ISA` and `ATEN_CPU_CAPABILITY` make an AVX-512 machine decide like the CPU it is capped to."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx2 fma avx_vnni avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8\n")
    everything = {"fpu", "avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"}
    assert host_cpu_flags(cpuinfo, {}) == everything
    assert host_cpu_flags(cpuinfo, {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}) == \
        {"fpu", "avx2", "fma"}
    assert host_cpu_flags(cpuinfo, {"ONEDNN_MAX_CPU_ISA": "avx2_vnni"}) == {"fpu", "avx2", "fma", "avx_vnni"}
    assert host_cpu_flags(cpuinfo, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}) == \
        everything - {"avx512_bf16", "amx_bf16", "amx_int8"}
    assert host_cpu_flags(cpuinfo, {"ATEN_CPU_CAPABILITY": "avx2"}) == {"fpu", "avx2", "fma", "avx_vnni"}
    assert host_cpu_flags(cpuinfo, {"ONEDNN_MAX_CPU_ISA": "ALL", "ATEN_CPU_CAPABILITY": "avx512"}) == everything


def test_this_cpu_is_described() -> None:
    hardware = detect_hardware(Device.CPU)
    flags = host_cpu_flags()  # as this process may use them (a run capped to AVX2 has no bfloat16 instructions)
    assert hardware.bf16 == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert hardware.amx == ("amx_bf16" in flags)
    assert hardware.description.startswith("CPU (")


def test_float16_flag_serves(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    assert parse_config(["serve", "--model", "/m", "--dtype", "float16"], {}).dtype == DType.FLOAT16
    path = tiny_model("bert-cross")
    exact = server_for(path).score(query="a question", items=["one answer", "another"]).json()["scores"]
    half = server_for(path, dtype="float16").score(query="a question", items=["one answer", "another"])
    assert half.status_code == 200
    np.testing.assert_allclose(half.json()["scores"], exact, atol=2e-2)


def test_auto_reads_the_checkpoint_dtype(tiny_model: Callable[[str], Path], tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A bfloat16 checkpoint under `auto`: bfloat16 where this CPU has bf16 instructions, float32 where it has not."""
    path = tmp_path / "bf16"
    shutil.copytree(tiny_model("bert-cross"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}))
    hardware = detect_hardware(Device.CPU)
    with caplog.at_level(logging.INFO, logger="scorekeeper_worker"):
        model = load_model(path, DType.AUTO, "cpu", "t")
    assert model.dtype == (torch.bfloat16 if hardware.bf16 else torch.float32)
    assert any(f"(auto: the checkpoint is bfloat16 and {hardware.description}" in r.message
               or f"(auto: the checkpoint is bfloat16, which {hardware.description} would emulate" in r.message
               for r in caplog.records)
