"""The garbage collector as the worker sees it: every pause observed by generation, and start-up objects frozen."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.serving.startup.gc_pauses import GcPauseObserver
from serving import RunningServer, free_port, wait_until_ready


def _value(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_a_forced_full_collection_is_observed_as_a_generation_2_pause() -> None:
    metrics = WorkerMetrics()
    observer = GcPauseObserver(metrics.gc_pauses)
    observer.install()
    try:
        before = _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2")
        gc.collect()  # (another thread's allocations may add a collection of their own, never remove one)
        assert _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2") >= before + 1
        assert _value(metrics, "scorekeeper_gc_pause_seconds_sum", generation="2") > 0
        gc.collect(0)
        assert _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="0") >= 1
    finally:
        observer.remove()
    assert observer not in gc.callbacks
    removed = _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2")
    gc.collect()  # no longer observed
    assert _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2") == removed


def test_every_generation_is_exported_from_start_up() -> None:
    metrics = WorkerMetrics()
    for generation in "012":
        assert _value(metrics, "scorekeeper_gc_pause_seconds_count", generation=generation) == 0
    assert _value(metrics, "scorekeeper_gc_frozen_objects") == 0


def test_a_server_observes_collections_and_stops_when_it_stops(tiny_model: Callable[[str], Path]) -> None:
    server = RunningServer(model=tiny_model("qwen3-cls3"))
    metrics: WorkerMetrics = server.app.state.metrics
    try:
        before = _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2")
        gc.collect()
        assert _value(metrics, "scorekeeper_gc_pause_seconds_count", generation="2") >= before + 1
        assert "scorekeeper_gc_frozen_objects 0.0" in httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    assert not any(isinstance(callback, GcPauseObserver) and callback.pauses is metrics.gc_pauses
                   for callback in gc.callbacks)


def test_the_default_worker_freezes_what_loading_left(tiny_model: Callable[[str], Path]) -> None:
    """`--gc-freeze` is on by default: after load every surviving object is in the permanent generation."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--model", str(tiny_model("qwen3-cls3")),
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_until_ready(url, process, timeout=300)
        lines = httpx.get(url + "/metrics", timeout=30).text.splitlines()
        frozen = next(float(line.split()[1]) for line in lines if line.startswith("scorekeeper_gc_frozen_objects "))
        assert frozen > 10_000  # torch, transformers, FastAPI and the model's modules
    finally:
        process.kill()
        process.wait(30)
