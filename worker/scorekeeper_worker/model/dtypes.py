"""Which dtype the model runs in: `--dtype` as asked, or for `auto` the checkpoint's dtype where the hardware runs it
fast. A pure decision over injected capabilities (`choose_dtype`), plus the one function that looks at the hardware."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from scorekeeper_worker.base.config import Device, DType

# x86: AVX512-BF16 or AMX; Arm: the BF16 extension. Without them PyTorch emulates bfloat16 matrix products on CPU,
# 5-6x slower than float32.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# Intel AMX: bfloat16 tile matrix products, several times float32's AVX-512 rate. Only there does `auto` run a float32
# checkpoint in bfloat16. Not measured by this project (no AMX machine so far: docs/benchmarks.md); AVX512-BF16
# alone (Zen 4, Cooper Lake) keeps float32 checkpoints in float32.
CPU_AMX_FLAGS = frozenset({"amx_bf16"})
_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class Hardware:
    device: Device
    bf16: bool  # runs bfloat16 matrix products natively
    description: str  # for the log line
    amx: bool = False  # CPU with AMX bfloat16 tiles


@dataclass(frozen=True)
class DTypeChoice:
    dtype: torch.dtype
    reason: str


def cpu_flags(cpuinfo: str) -> set[str]:
    """Feature flags from /proc/cpuinfo text (x86 `flags`, Arm `Features`)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


# Flags above an instruction-set cap. oneDNN (`ONEDNN_MAX_CPU_ISA`) and ATen (`ATEN_CPU_CAPABILITY`) never use
# instructions above their cap, so a process capped to AVX2 on an AVX-512 machine computes like an AVX2 CPU (no
# VNNI: int8 products saturate in 16-bit pairs; no native bfloat16) and must decide like one.
_AVX512 = ("avx512", "amx")
_ONEDNN_DROPS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("SSE41", "AVX", "AVX2"), (*_AVX512, "avx_vnni")),
    **dict.fromkeys(("AVX2_VNNI", "AVX2_VNNI_2"), _AVX512),
    "AVX512_CORE": ("avx512_vnni", "avx512_bf16", "avx512_fp16", "amx", "avx_vnni"),
    "AVX512_CORE_VNNI": ("avx512_bf16", "avx512_fp16", "amx"),
    **dict.fromkeys(("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512"), ("amx",)),
}
_ATEN_DROPS: dict[str, tuple[str, ...]] = {"avx2": _AVX512, "default": (*_AVX512, "avx2", "avx_vnni", "fma")}


def capped_flags(flags: set[str], environ: Mapping[str, str]) -> set[str]:
    """`flags` without those above the instruction-set caps that `environ` sets (oneDNN's and ATen's)."""
    drops = (*_ONEDNN_DROPS.get(environ.get("ONEDNN_MAX_CPU_ISA", "").upper(), ()),
             *_ATEN_DROPS.get(environ.get("ATEN_CPU_CAPABILITY", "").lower(), ()))
    return {flag for flag in flags if not flag.startswith(drops)}


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo"), environ: Mapping[str, str] | None = None) -> set[str]:
    """This machine's CPU feature flags as this process may use them (capped by `ONEDNN_MAX_CPU_ISA` and
    `ATEN_CPU_CAPABILITY` in `environ`, the process's environment by default); none where /proc/cpuinfo cannot be
    read."""
    try:
        flags = cpu_flags(cpuinfo.read_text())
    except OSError:
        return set()
    return capped_flags(flags, os.environ if environ is None else environ)


def detect_hardware(device: Device) -> Hardware:
    if device == Device.CUDA:  # the only GPU-specific branch
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return Hardware(device, torch.cuda.is_available() and torch.cuda.is_bf16_supported(), name)
    flags = host_cpu_flags()
    found = sorted(flags & CPU_BF16_FLAGS)
    return Hardware(device, bool(found), f"CPU ({', '.join(found) if found else 'no bfloat16 instructions'})",
                    amx=bool(flags & CPU_AMX_FLAGS))


def choose_dtype(requested: DType, checkpoint: torch.dtype | None, hardware: Hardware) -> DTypeChoice:
    """`checkpoint` is the dtype the weights were saved in (None when unknown, e.g. GGUF: de-quantized to float32)."""
    where = hardware.description
    if requested == DType.BFLOAT16 and hardware.device == Device.CUDA and not hardware.bf16:
        raise ValueError(f"--dtype bfloat16: {where} has no bfloat16 support; use --dtype float16 or auto")
    if requested != DType.AUTO:
        dtype = getattr(torch, requested.value)
        return DTypeChoice(dtype, f"--dtype {requested.value}")
    saved = _NAMES.get(checkpoint, "float32") if checkpoint is not None else "float32"
    if saved == "float32" and hardware.device == Device.CPU and hardware.amx:
        return DTypeChoice(torch.bfloat16, f"auto: the checkpoint is float32 and {where} has AMX, whose bfloat16 "
                                           "matrix products outrun float32")
    if saved == "float32":
        return DTypeChoice(torch.float32, f"auto: the checkpoint is {saved}")
    if hardware.device == Device.CPU:
        if saved == "bfloat16" and hardware.bf16:
            return DTypeChoice(torch.bfloat16, f"auto: the checkpoint is bfloat16 and {where} runs it natively")
        return DTypeChoice(torch.float32, f"auto: the checkpoint is {saved}, which {where} would emulate "
                                          "(several times slower than float32)")
    if saved == "bfloat16" and not hardware.bf16:
        return DTypeChoice(torch.float16, f"auto: the checkpoint is bfloat16 but {where} has no bfloat16 support")
    return DTypeChoice(getattr(torch, saved), f"auto: the checkpoint is {saved} and {where} runs it natively")


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))
