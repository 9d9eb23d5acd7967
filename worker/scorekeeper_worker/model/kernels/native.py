"""The compiled encoder attention kernel (`_encoder_attention`, built from encoder_attention.cpp at install) behind
one function: `attend_spans(q, k, v, spans, out, scale)` for whole rows of packed tokens, every head, no mask.

It is optional: the package installs without a C++ compiler, and then `available()` is False and the worker keeps
torch's kernels (model/kernels/tiled.py). Where it is built, `eligible` says which calls it takes: CPU, float32,
heads 32 or 64 wide, one key/value head per query head, rows of at most `max_keys()` tokens, no causality, window
or softcapping (encoders: MiniLM, BERT, RoBERTa, XLM-R cross-encoders and embedders). Its instruction set follows
torch's own CPU capability (AVX-512 or AVX2, so `ATEN_CPU_CAPABILITY=avx2` caps both); below AVX2 it is not used.
The worker switches it on per model at load (`--native-attention`, serving/startup/load.py) by marking the model's
attention modules (`enable`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

NATIVE_ATTRIBUTE = "scorekeeper_native_attention"  # set on a model's attention modules: they use this kernel


def _extension() -> ModuleType | None:
    try:
        return importlib.import_module("scorekeeper_worker.model.kernels._encoder_attention")
    except ImportError:
        return None


_EXTENSION = _extension()


def instruction_set() -> str | None:
    """"avx512" or "avx2" as torch's CPU capability says (it honours ATEN_CPU_CAPABILITY); None below AVX2."""
    capability = torch.backends.cpu.get_cpu_capability()
    return {"AVX512": "avx512", "AVX2": "avx2"}.get(capability)


def available() -> str | None:
    """Why the kernel cannot run here (None: it can)."""
    if _EXTENSION is None:
        return "the extension was not built (no C++ compiler at install)"
    if instruction_set() is None:
        return f"the CPU has neither AVX-512 nor AVX2 (torch's capability: {torch.backends.cpu.get_cpu_capability()})"
    return None


def max_keys() -> int:
    return 0 if _EXTENSION is None else int(_EXTENSION.max_keys())


def enable(model: torch.nn.Module) -> int:
    """Mark the model's bidirectional attention modules (transformers' attention modules say `is_causal`):
    `packed_attention` runs their whole rows here when the call is `eligible`. Returns how many were marked."""
    marked = 0
    for module in model.modules():
        if getattr(module, "is_causal", True) is False:
            setattr(module, NATIVE_ATTRIBUTE, True)
            marked += 1
    return marked


def eligible(module: torch.nn.Module, q: torch.Tensor, groups: int, causal: bool, window: int | None,
             softcap: float | None) -> bool:
    return (getattr(module, NATIVE_ATTRIBUTE, False) and _EXTENSION is not None and q.device.type == "cpu"
            and q.dtype == torch.float32 and q.shape[-1] in (32, 64) and groups == 1 and not causal
            and window is None and softcap is None)


def attend_spans(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans: torch.Tensor, out: torch.Tensor,
                 scale: float) -> None:
    """q, k, v [T, H, D] token-major views with unit stride inside a token (transformers' views of the packed
    projections are), spans int64 [R, 2] (first packed token, length ≤ max_keys()), out [T', H, D] contiguous
    (T' ≥ T): each row's tokens attend to that row's, every head, in torch's intra-op threads' number."""
    assert _EXTENSION is not None
    tokens, heads, dim = q.shape
    stride = q.stride(0)
    for t in (q, k, v):
        if t.stride(0) != stride or t.stride(1) != dim or t.stride(2) != 1 or t.dtype != torch.float32:
            raise ValueError("q, k and v must share one token stride, with each token's heads contiguous")
    if not out.is_contiguous() or out.shape[1:] != q.shape[1:]:
        raise ValueError("out must be contiguous [T', H, D]")
    spans = spans.contiguous()
    _EXTENSION.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), stride, heads * dim, heads, dim,
                      spans.data_ptr(), spans.shape[0], scale, torch.get_num_threads(),
                      int(instruction_set() == "avx512"))
