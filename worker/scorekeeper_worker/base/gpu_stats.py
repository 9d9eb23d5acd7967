"""The GPU's memory and utilisation, read at every scrape (WorkerMetrics.watch_gpu): memory from torch's caching
allocator, utilisation from NVML (torch.cuda.utilization) where nvidia-ml-py is installed.

A read never fails a scrape: an error reads as NaN, logged once. torch is imported on first use, so that importing the
metrics stays light (cli.py reads the configuration before torch loads).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class GpuReader(Protocol):
    """One GPU as the metrics read it; each method returns bytes (a ratio for utilization), NaN when unknown."""

    device: str  # the `device` label: cuda:0

    def allocated(self) -> float: ...

    def reserved(self) -> float: ...

    def peak(self) -> float: ...

    def total(self) -> float: ...

    def utilization(self) -> float: ...

    def has_utilization(self) -> bool: ...


class TorchGpu:
    """CUDA device `index` through torch. Until CUDA is initialised (by the model load) the allocator holds nothing
    and reads 0, and the device's size is NaN: a scrape must not be what initialises CUDA."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.device = f"cuda:{index}"
        self._failed: set[str] = set()

    def _read(self, what: str, read: Callable[[], float]) -> float:
        try:
            return float(read())
        except Exception as error:  # a scrape answers with the other series; the log says why once
            if what not in self._failed:
                self._failed.add(what)
                log.warning("cannot read the GPU's %s for /metrics: %s: %s", what, type(error).__name__, error)
            return math.nan

    def allocated(self) -> float:
        import torch

        return self._read("allocated memory", lambda: torch.cuda.memory_allocated(self.index))

    def reserved(self) -> float:
        import torch

        return self._read("reserved memory", lambda: torch.cuda.memory_reserved(self.index))

    def peak(self) -> float:
        import torch

        return self._read("peak memory", lambda: torch.cuda.max_memory_allocated(self.index))

    def total(self) -> float:
        import torch

        if not torch.cuda.is_initialized():
            return math.nan
        return self._read("memory size", lambda: torch.cuda.get_device_properties(self.index).total_memory)

    def utilization(self) -> float:
        import torch

        return self._read("utilisation", lambda: torch.cuda.utilization(self.index) / 100)

    def has_utilization(self) -> bool:
        """NVML answers: nvidia-ml-py is installed and the driver loaded (else no utilisation series at all)."""
        import torch

        try:
            torch.cuda.utilization(self.index)
        except Exception as error:
            log.info("no GPU utilisation metric: NVML does not answer (%s: %s)", type(error).__name__, error)
            return False
        return True
