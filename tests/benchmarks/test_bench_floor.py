"""bench_cpu.py's floor: the matrix products alone, timed in the benchmark's own rounds (peers.FloorPeer), never
taken for a peer, and the ceiling it reports against the best peer of the same rounds."""

from __future__ import annotations

import pytest
from scorekeeper_worker.model.files import minilm_path

from bench.cpu import bench_cpu, gemm_floor
from bench.cpu.bench_minilm import make_workload
from bench.harness.common import Peer


def record(system: str, times: list[float], scores: list[float] | None = None) -> dict[str, object]:
    return {"task": "embed", "mix": "long", "system": system, "times": times, "scores": scores or [],
            "cpu_after": [0.0] * len(times), "threads": "2", "config": "", "items_per_s": 200 / sorted(times)[1]}


def test_the_ceiling_is_the_best_peer_over_the_floor_round_by_round() -> None:
    best, floor = record("vllm", [3.0, 3.3, 2.9]), record(bench_cpu.FLOOR, [2.0, 2.2, 2.0])
    line = bench_cpu.ceiling(best, floor, record("scorekeeper", [3.2, 3.4, 3.5]))
    assert "= 1.50× (per round 1.45–1.50×)" in line
    assert f"would have {3.0 / 1.15 - 2.0:.3f} s" in line  # the best peer's median at the target, less the floor's
    assert "scorekeeper spends 1.400 s on it" in line


def test_the_floor_is_not_a_peer() -> None:
    scores = [0.1, 0.2, 0.3]
    records = [record("scorekeeper", [3.2, 3.4, 3.5], scores), record("st", [4.0, 4.1, 4.2], scores),
               record("hf", [5.0, 5.0, 5.0], scores), record(bench_cpu.FLOOR, [2.0, 2.2, 2.0])]
    out = bench_cpu.report(records)
    assert "best peer (sentence-transformers (in-process)) = 1.21×" in out
    assert "ceiling: best peer / floor = 2.05×" in out
    floor_row = next(line for line in out.splitlines() if line.startswith("| floor"))
    assert floor_row.rstrip(" |").endswith("n/a")  # no scores, so no accuracy columns
    assert "| 1.0000" in next(line for line in out.splitlines() if line.startswith("| sentence"))
    assert gemm_floor.best_peer(records, "embed", "long", "float32") == ("st", 4.1, 3.4)


@pytest.mark.parametrize("task", ["embed", "rerank"])
def test_the_floor_peer_times_the_request_and_answers_no_scores(task: str) -> None:
    short, long = (make_workload(minilm_path(), mix, 6, 0) for mix in ("short", "long"))
    peer = Peer("floor", minilm_path(), "float32", short, options={"task": task})
    try:
        for workload in (short, long, short):
            seconds, answer = peer.run(workload={key: workload[key] for key in ("query", "items", "lengths")})
            assert seconds > 0
            assert answer["scores"] == []
    finally:
        peer.close()
