"""glibc's allocator tuned for a model thread that allocates and frees the same large activations every forward.

By default glibc serves a block above its mmap threshold with a fresh mapping, and returns freed memory at the top of
the heap to the kernel past its trim threshold; both adapt to the largest block seen, but a forward's activations
(megabytes each, several alive at once) keep crossing them, so every forward faults its memory in again: 12,000 to
18,000 page faults per MiniLM rerank request of 200 pairs, 3–4 % of its time (docs/benchmarks.md). Fixed thresholds
keep blocks up to 32 MiB (glibc's maximum) in the heap and keep up to 512 MiB of freed heap for the next forward,
as tcmalloc, which vLLM preloads on CPU, does by design. A no-op where the C library is not glibc."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 512 << 20
TOP_PAD = 64 << 20  # grow the heap in steps of this much, not page by page


def keep_freed_memory() -> bool:
    """Set the thresholds (process-wide, once is enough); False where glibc's mallopt is not available."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.info("allocator thresholds unchanged: no glibc mallopt")
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
