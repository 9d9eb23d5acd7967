"""The only code that runs the model: pack units → one forward on the packed batch → pooled rows → job scores.

The runner never keeps jobs: a batch arrives as (job, unit) pairs from the queue, and each job absorbs the pooled
rows of its own units."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from scorekeeper_worker.engine.runner.compiled_trunk import EAGER_KEY, CompiledTrunk
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.device_copy import CopyStats
from scorekeeper_worker.engine.runner.forward import PaddedTrunk, pooled_rows
from scorekeeper_worker.engine.runner.packing import PackUnit, build_inputs
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import ScoringModel


class Job(Protocol):
    """What the runner needs of a request's job: it takes the scores of its pooled rows (slot = the pool's slot)."""

    def absorb(self, model: ScoringModel, slots: list[int], rows: torch.Tensor, copies: CopyStats) -> None: ...


@dataclass
class BatchStats:
    sequences: int
    tokens: int
    padding_tokens: int
    inputs_seconds: float
    forward_seconds: float
    scoring_seconds: float
    copies: CopyStats
    graph_path: str = "eager"  # "graph" (replayed), "padded" (bucket shapes, run eagerly: no CUDA) or "eager"
    graph_bucket: str = "none"  # the token bucket, for graph and padded batches
    # On CPU: the model thread's CPU time over the forward's wall time. Near 1 alone on its cores; about 0.5 with two
    # threads beside an equal-share neighbour, which takes half the cores (docs/operations.md#cpu-threads).
    cpu_share: float | None = None


# A test hook: sees every batch just before its forward; what it raises is the forward's error (tests make one
# request's forward fail, or inject a device error, without a model that fails by itself).
FaultHook = Callable[[list[tuple[Job, PackUnit]]], None]


class Executor:
    def __init__(self, model: ScoringModel, backend: str = "sdpa", graphs: GraphRunner | None = None,
                 trunk: PaddedTrunk | None = None, compiler: CompiledTrunk | None = None) -> None:
        self.model = model
        # Padded models and other trunk backends run on the row blocks of the BLOCKS layout (forward.padded_hidden).
        self.eager_kind = LayoutKind.FLEX if backend == "flex" and model.packed and trunk is None else LayoutKind.BLOCKS
        self.graphs = graphs
        self.trunk = trunk
        self.compiler = compiler if trunk is None else None  # another trunk backend has no layers of ours
        self.fault: FaultHook | None = None

    @torch.inference_mode()
    def run(self, batch: list[tuple[Job, PackUnit]]) -> BatchStats:
        """Score a batch: every job absorbs the rows of its units (the caller finishes the complete ones)."""
        started = time.perf_counter()
        if self.fault is not None:
            self.fault(batch)
        units = [unit for _, unit in batch]
        bucket = self.graphs.select(units) if self.graphs is not None else None
        if bucket is None:
            inputs = build_inputs(units, self.model.device, self.eager_kind)
            packed, cpu_started = time.perf_counter(), time.thread_time()
            if self.compiler is not None:
                pooled = self.compiler.run(EAGER_KEY, False, lambda: pooled_rows(self.model, inputs))
            else:
                pooled = pooled_rows(self.model, inputs, self.trunk)
            path, label = "eager", "none"
        else:
            assert self.graphs is not None
            inputs = self.graphs.load(bucket, units)
            packed, cpu_started = time.perf_counter(), time.thread_time()
            pooled = self.graphs.forward(bucket)
            path, label = ("graph" if bucket.graph is not None else "padded"), str(bucket.shape.tokens)
        if pooled.is_cuda:
            torch.cuda.synchronize()
        forwarded = time.perf_counter()
        cpu_share = None
        if pooled.device.type == "cpu":
            cpu_share = min(1.0, (time.thread_time() - cpu_started) / max(forwarded - packed, 1e-9))
        by_job: dict[int, tuple[Job, list[int], list[int]]] = {}
        for row, readout in enumerate(inputs.readouts):
            job = batch[readout.unit][0]
            entry = by_job.setdefault(id(job), (job, [], []))
            entry[1].append(readout.slot)
            entry[2].append(row)
        copies = CopyStats()
        for job, slots, rows in by_job.values():
            job.absorb(self.model, slots, pooled[rows], copies)
        scored = time.perf_counter()
        stats = BatchStats(
            sequences=len(units),
            tokens=inputs.num_tokens,
            padding_tokens=inputs.padding_tokens,
            inputs_seconds=packed - started,
            forward_seconds=forwarded - packed,
            scoring_seconds=scored - forwarded,
            copies=copies,
            graph_path=path,
            graph_bucket=label,
            cpu_share=cpu_share,
        )
        return stats
