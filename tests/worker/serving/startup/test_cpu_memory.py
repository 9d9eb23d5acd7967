"""serving/startup/cpu_memory.py: with the thresholds set, forwards' worth of large blocks (of the sizes batches of
different token counts allocate) come back from the heap, where glibc's adaptive defaults map and trim them again.
Each case runs in a fresh interpreter: the setting is process-wide, and other tests' allocations would move the
heap's top."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    tuned = faults("tuned")
    assert tuned < pages // 10, (tuned, pages)  # the blocks come back from the heap, round after round
    # glibc's defaults fault a share of them in again where its adaptive thresholds keep being crossed (here: 4 to 5
    # times the pages); a CI machine measured as few faults with the defaults as tuned (other kernel or glibc), so
    # the comparison is asserted only where the defaults clearly fault. Both counts carry background noise (up to
    # ~17,000 faults in one CI run, with transparent huge pages "always"), hence a quarter of the pages, not a tenth.
    default = faults("default")
    if default > pages // 4:
        assert tuned * 3 < default, (tuned, default)


MIXED_SHAPES = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
from bench.http.bench_memory import heap_mib, mixed_requests, run_requests
from scorekeeper_worker.library import DType, fuse_linears, keep_freed_memory, load_model, minilm_path
torch.set_num_threads(2)
keep_freed_memory()
model = load_model(minilm_path(), DType.FLOAT32, "cpu", "memory")
fuse_linears(model.trunk)
with torch.inference_mode():
    run_requests(mixed_requests(10, 1, max_items=24), model, 8192)
    before = heap_mib()["used"]
    run_requests(mixed_requests(int(sys.argv[2]), 2, max_items=24), model, 8192)
print(heap_mib()["used"] - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_mixed_shapes_do_not_grow_the_heap_with_the_worker_s_cache_bounds() -> None:
    """Requests of varied shapes through the real MiniLM with fused oneDNN linears: with the bounds the command line
    sets (cli.CACHE_BOUNDS), the heap in use stays within the bound's size; with ideep's default (1024 entries) it
    grows by about 300 KiB per new shape (issue 37's +400 MB). Runs under whatever instruction set the suite runs
    (capped to AVX2 too). Heap bytes in use (mallinfo2), not RSS: the allocator's kept memory and timing do not
    enter."""
    from scorekeeper_worker.cli import CACHE_BOUNDS

    repo = str(Path(__file__).resolve().parents[4])

    def growth(ideep: int) -> float:
        env = {**os.environ, **{k: str(v) for k, v in CACHE_BOUNDS.items()}, "LRU_CACHE_CAPACITY": str(ideep),
               "PYTHONPATH": os.pathsep.join(sys.path)}
        return float(subprocess.run([sys.executable, "-c", MIXED_SHAPES, repo, "80"], capture_output=True,
                                    text=True, check=True, env=env).stdout.split()[-1])

    bounded, unbounded = growth(CACHE_BOUNDS["LRU_CACHE_CAPACITY"]), growth(1024)
    # MiB: 128 entries of ≈ 300 KiB at most (measured 28 with the bound, 56 without, on AVX-512 and capped to AVX2)
    assert bounded < 48, bounded
    assert unbounded > 1.5 * bounded, (bounded, unbounded)
