"""The model thread's on-CPU share of each CPU forward (BatchStats.cpu_share, `scorekeeper_model_thread_cpu_share`):
measured on real forwards of a model thread pinned to one CPU, alone there and beside a busy process pinned to the
same CPU, which the kernel's fair scheduler gives half of it (other load on the machine only lowers the share)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.executor import BatchStats, Executor
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.prepare import Limits

MEASURED_SECONDS = 0.5  # of forwards: many time slices, so a half share cannot read as a whole one


def _share_of_forwards(model: ScoringModel, cpu: int) -> tuple[float, list[BatchStats]]:
    """Forwards on a thread pinned to `cpu`, until they took MEASURED_SECONDS: their CPU time over their wall time."""
    stats: list[BatchStats] = []

    def forwards() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        torch.set_num_threads(1)  # per thread: this one's parallel regions run alone
        ask = ScoreAsk(query="a query about documents", items=[f"document {i} " * 40 for i in range(32)])
        while sum(batch.device_seconds for batch in stats) < MEASURED_SECONDS:
            scored(score_now(Executor(model), [ask], Limits(max_batch_tokens=1 << 16), on_batch=stats.append))

    thread = threading.Thread(target=forwards)
    thread.start()
    thread.join()
    wall = sum(batch.device_seconds for batch in stats)
    return sum((batch.cpu_share or 0.0) * batch.device_seconds for batch in stats) / wall, stats


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins threads to a CPU: Linux")
def test_a_forward_beside_a_busy_process_on_its_cpu_is_on_it_about_half_the_time(
        tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model("bert-cross"), DType.FLOAT32, "cpu", "bert-cross")
    cpu = min(os.sched_getaffinity(0))
    alone, stats = _share_of_forwards(model, cpu)
    assert all(batch.cpu_share is not None and 0 < batch.cpu_share <= 1 for batch in stats)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        shared, _ = _share_of_forwards(model, cpu)
    finally:
        busy.kill()
        busy.wait()
    assert shared < 0.8, (shared, alone)
