"""Whether a failed forward left the device unusable for everyone: a CUDA error (a device-side assert, an illegal
memory access) is sticky, every later kernel launch in the process fails too, so retrying on a smaller batch cannot
help and the process must restart. Anything else (a Python error, a CPU-side IndexError, an error of one request's
inputs) leaves the device as it was, and the batch can be split to find the request behind it.

Unverified on a GPU here: recognised by type (torch.AcceleratorError, torch >= 2.8; torch.cuda's own errors) and
by the messages PyTorch gives a sticky CUDA error, which tests inject as the same exception a real one raises."""

from __future__ import annotations

import torch

# Messages of the CUDA errors that poison the context (PyTorch re-raises them as RuntimeError on older versions).
POISON_MARKERS = ("device-side assert", "CUDA error", "illegal memory access", "CUBLAS_STATUS_EXECUTION_FAILED",
                  "cudaErrorLaunchFailure", "unspecified launch failure")
POISON_TYPES: tuple[type[BaseException], ...] = tuple(
    cls for cls in (getattr(torch, "AcceleratorError", None), getattr(torch.cuda, "CudaError", None))
    if isinstance(cls, type))


def poisons_device(error: BaseException) -> bool:
    """True when `error` (or what it was raised from) is an error that leaves the accelerator unusable."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, POISON_TYPES):
            return True
        text = str(current)
        if any(marker in text for marker in POISON_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False
