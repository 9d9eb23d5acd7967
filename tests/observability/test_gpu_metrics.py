"""The GPU series a worker on `--device cuda` exports (WorkerMetrics.watch_gpu), read at every scrape.

CPU-only here: the collector is fed by a reader the test controls, through the same code as torch's reader; torch's
own reader (base/gpu_stats.TorchGpu) runs too, on a machine without CUDA, where it must read an idle allocator and
never fail a scrape. Real device values are checked on a GPU machine (bench/gpu), not here.
"""

from __future__ import annotations

import math

import pytest
from cluster_models import ScriptedGpu
from obs_harness import parse_samples, value
from prometheus_client import generate_latest
from scorekeeper_worker.base.gpu_stats import TorchGpu
from scorekeeper_worker.base.metrics import WorkerMetrics

GIB = 1 << 30


def _scrape(metrics: WorkerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return parse_samples(generate_latest(metrics.registry).decode())


def test_every_scrape_reads_the_gpu_afresh() -> None:
    metrics, gpu = WorkerMetrics(), ScriptedGpu()
    metrics.watch_gpu(gpu)
    gpu.memory |= {"allocated": 3.0 * GIB, "reserved": 4.0 * GIB, "peak": 3.5 * GIB}
    first = _scrape(metrics)
    gpu.memory |= {"allocated": 1.0 * GIB, "peak": 6.0 * GIB}
    gpu.busy = 0.25
    second = _scrape(metrics)
    assert {name: value(first, f"scorekeeper_gpu_{name}", device="cuda:0") for name in
            ("memory_allocated_bytes", "memory_reserved_bytes", "memory_peak_bytes", "memory_total_bytes",
             "utilization_ratio")} == {"memory_allocated_bytes": 3 * GIB, "memory_reserved_bytes": 4 * GIB,
                                       "memory_peak_bytes": 3.5 * GIB, "memory_total_bytes": 80 * GIB,
                                       "utilization_ratio": 0.5}
    assert value(second, "scorekeeper_gpu_memory_allocated_bytes", device="cuda:0") == GIB
    assert value(second, "scorekeeper_gpu_memory_peak_bytes", device="cuda:0") == 6 * GIB
    assert value(second, "scorekeeper_gpu_utilization_ratio", device="cuda:0") == 0.25
    assert gpu.reads == 2


def test_without_nvml_there_is_no_utilisation_series_and_a_cpu_worker_has_no_gpu_series() -> None:
    metrics = WorkerMetrics()
    metrics.watch_gpu(ScriptedGpu(busy=None))
    names = {name for name, _ in _scrape(metrics)}
    assert "scorekeeper_gpu_memory_reserved_bytes" in names and "scorekeeper_gpu_utilization_ratio" not in names
    assert not {name for name, _ in _scrape(WorkerMetrics()) if name.startswith("scorekeeper_gpu_")}


def test_torch_reader_without_cuda_reads_an_idle_allocator_and_never_fails_a_scrape() -> None:
    """This machine has no CUDA (as a GPU worker before its model loaded has no CUDA context): memory reads 0, the
    device size is unknown (NaN) rather than initialising CUDA from a scrape, and NVML does not answer."""
    import torch

    assert not torch.cuda.is_initialized()
    gpu = TorchGpu()
    metrics = WorkerMetrics()
    metrics.watch_gpu(gpu)
    samples = _scrape(metrics)
    assert value(samples, "scorekeeper_gpu_memory_allocated_bytes", device="cuda:0") == 0
    assert value(samples, "scorekeeper_gpu_memory_peak_bytes", device="cuda:0") == 0
    assert math.isnan(value(samples, "scorekeeper_gpu_memory_total_bytes", device="cuda:0"))
    assert not gpu.has_utilization() and "scorekeeper_gpu_utilization_ratio" not in {n for n, _ in samples}
    assert not torch.cuda.is_initialized()


def test_a_failing_read_is_nan_and_the_scrape_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def lost(*_: object) -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "memory_reserved", lost)
    metrics = WorkerMetrics()
    metrics.watch_gpu(TorchGpu())
    for _ in range(2):  # logged once, NaN every time
        samples = _scrape(metrics)
        assert math.isnan(value(samples, "scorekeeper_gpu_memory_reserved_bytes", device="cuda:0"))
        assert value(samples, "scorekeeper_gpu_memory_allocated_bytes", device="cuda:0") == 0
