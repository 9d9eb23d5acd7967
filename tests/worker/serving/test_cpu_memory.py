"""serving/startup/cpu_memory.py: with the thresholds set, forwards' worth of large blocks (of the sizes batches of
different token counts allocate) come back from the heap, where glibc's adaptive defaults map and trim them again.
Each case runs in a fresh interpreter: the setting is process-wide, and other tests' allocations would move the
heap's top."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROUNDS = """
import resource, sys, torch
from scorekeeper_worker.serving.startup.cpu_memory import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
SIZES = [2, 12, 6, 24, 4, 16]  # MiB per block: activations of batches of different token counts
def faults(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for r in range(rounds):
        blocks = [torch.empty(SIZES[r % len(SIZES)] << 18) for _ in range(4)]  # 4 alive at once
        for block in blocks:
            block.fill_(1.0)  # touch every page
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults(18)  # warm-up: the heap reaches its working size
print(faults(18))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and minor-fault counts: Linux")
def test_reused_blocks_fault_less_than_with_the_defaults() -> None:
    def faults(setting: str) -> int:
        return int(subprocess.run([sys.executable, "-c", ROUNDS, setting], capture_output=True, text=True,
                                  check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout)

    pages = 3 * 4 * sum([2, 12, 6, 24, 4, 16]) * (1 << 20) // os.sysconf("SC_PAGE_SIZE")  # touched in 18 rounds
    default, tuned = faults("default"), faults("tuned")
    assert default > pages // 10  # glibc's defaults fault a share of them in again, round after round
    assert tuned * 3 < default
