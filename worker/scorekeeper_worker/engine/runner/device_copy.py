"""Device→host copies of pooled hidden states, timed for the copy-overhead metrics.

On CUDA: into a pinned buffer (PyTorch's caching host allocator, so no cudaHostAlloc per call) with a non-blocking
copy between two CUDA events; the only wait is on the end event, which the host needs anyway before it can read the
values (no device-wide synchronisation). Seconds = the events' copy time + the host-side conversion to Python floats.
On CPU the tensor is already on the host: the measured time is the conversion, exactly as before this helper.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class CopyStats:
    """Device→host copy of pooled hidden states, for the copy-overhead metrics."""

    vectors: int = 0
    bytes: int = 0
    seconds: float = 0.0


def host_vectors(rows: torch.Tensor) -> tuple[list[list[float]], float, int]:
    """[n, H] rows → (Python float lists, seconds, bytes copied)."""
    nbytes = rows.numel() * rows.element_size()
    if not rows.is_cuda:
        started = time.perf_counter()
        vectors = rows.to("cpu").float().tolist()
        return vectors, time.perf_counter() - started, nbytes
    host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host.copy_(rows, non_blocking=True)
    end.record()
    end.synchronize()  # the values are needed now: wait for this copy only
    started = time.perf_counter()
    vectors = host.float().tolist()
    return vectors, start.elapsed_time(end) / 1000 + time.perf_counter() - started, nbytes
