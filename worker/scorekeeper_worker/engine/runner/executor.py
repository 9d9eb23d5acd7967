"""The only code that runs the model: pack units → one forward on the packed batch → the heads of its pooled rows →
each job's results.

A batch goes through in two calls, so that the next batch is packed and enqueued while this one runs on the device:
`launch` packs the units on the host, copies them to the device, enqueues the forward, the heads and the copies of
their results back, and returns (at once on a GPU: nothing waits for the device); `finish` waits for this batch's
completion (never the whole device) and hands each job the results of its rows. `run` is the two in a row. On CPU
the forward runs inside `launch`. The runner never keeps jobs: a batch arrives as (job, unit) pairs from the queue."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from scorekeeper_worker.engine.runner import heads, row_blocks, token_packing
from scorekeeper_worker.engine.runner.compiled_trunk import EAGER_KEY, CompiledTrunk
from scorekeeper_worker.engine.runner.cuda_graphs import Bucket, GraphRunner
from scorekeeper_worker.engine.runner.device_stream import Completion, DeviceStream, stream_for
from scorekeeper_worker.engine.runner.forward import PaddedTrunk, pooled_rows
from scorekeeper_worker.engine.runner.heads import CopyStats, RowHead, RowResult
from scorekeeper_worker.engine.runner.packing import ForwardInputs, PackUnit, Readout, to_device
from scorekeeper_worker.model.kernels import mis_attention
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import ScoringModel


class Job(Protocol):
    """What the runner needs of a request's job: the head of each of its pooled rows (slot = the pool's slot), and
    to take their results."""

    def head(self, slot: int) -> RowHead: ...

    def absorb(self, slots: list[int], rows: list[RowResult]) -> None: ...


@dataclass
class BatchStats:
    """One batch, as the metrics see it. Host steps: pack, copy_in (to the device buffers), heads (enqueueing them),
    copy_out (the results to Python floats); device: the forward's device time (CUDA events; the simulated time; on
    CPU its wall time)."""

    sequences: int
    tokens: int
    padding_tokens: int
    pack_seconds: float = 0.0
    copy_in_seconds: float = 0.0
    device_seconds: float = 0.0
    heads_seconds: float = 0.0
    copy_out_seconds: float = 0.0
    copies: CopyStats = field(default_factory=CopyStats)
    graph_path: str = "eager"  # "graph" (replayed), "padded" (bucket shapes, run eagerly: no CUDA) or "eager"
    graph_bucket: str = "none"  # the token bucket, for graph and padded batches
    # On CPU: the model thread's CPU time over the forward's wall time. Near 1 alone on its cores; about 0.5 with two
    # threads beside an equal-share neighbour, which takes half the cores (docs/operations.md#cpu-threads).
    cpu_share: float | None = None


@dataclass
class Launched:
    """A batch on its way through the device: what `finish` needs."""

    batch: list[tuple[Job, PackUnit]]
    readouts: list[Readout]
    pending: heads.Pending
    completion: Completion
    stats: BatchStats
    forward_tokens: int  # the forward's tokens: a bucket's, or an eager batch's live ones

    def done(self) -> bool:
        return self.completion.done()


@dataclass
class Loaded:
    """A batch on the device's side of the copy: its inputs, the forward to run on them (over `tokens` tokens, into
    `rows` pooled rows), when packing ended, and its path for the metrics."""

    inputs: ForwardInputs
    run: Callable[[], torch.Tensor]
    tokens: int
    rows: int
    packed: float
    path: str  # "graph" (replayed), "padded" (bucket shapes, run eagerly: no CUDA) or "eager"
    bucket: str  # the token bucket, for graph and padded batches


# A test hook: sees every batch just before it is packed; what it raises is the forward's error (tests make one
# request's forward fail, or inject a device error, without a model that fails by itself; or hold the model thread).
FaultHook = Callable[[list[tuple[Job, PackUnit]]], None]


class Executor:
    def __init__(self, model: ScoringModel, backend: str = "sdpa", graphs: GraphRunner | None = None,
                 trunk: PaddedTrunk | None = None, compiler: CompiledTrunk | None = None,
                 stream: DeviceStream | None = None) -> None:
        self.model = model
        # Padded models and other trunk backends run on the row blocks of the BLOCKS layout (forward.padded_hidden).
        token_kinds = {"flex": LayoutKind.FLEX, "triton": LayoutKind.TRITON}
        self.eager_kind = token_kinds.get(backend, LayoutKind.BLOCKS) if model.packed and trunk is None \
            else LayoutKind.BLOCKS
        self.graphs = graphs
        self.trunk = trunk
        self.compiler = compiler if trunk is None else None  # another trunk backend has no layers of ours
        self.stream = stream or stream_for(model.device)
        self.fault: FaultHook | None = None

    @torch.inference_mode()
    def launch(self, batch: list[tuple[Job, PackUnit]]) -> Launched:
        """Pack, copy in, enqueue the forward and the heads (on CPU: run them)."""
        started = time.perf_counter()
        if self.fault is not None:
            self.fault(batch)
        units = [unit for _, unit in batch]
        bucket = self.graphs.select(units) if self.graphs is not None else None
        loaded = self._eager(units) if bucket is None else self._bucket(bucket, units)
        copied, cpu_started = time.perf_counter(), time.thread_time()
        pooled = self.stream.forward(loaded.run, loaded.tokens, loaded.rows)
        forwarded = time.perf_counter()
        cpu_share = None
        if pooled.device.type == "cpu" and not self.stream.simulated:
            cpu_share = min(1.0, (time.thread_time() - cpu_started) / max(forwarded - copied, 1e-9))
        inputs = loaded.inputs
        readouts = list(inputs.readouts)
        plan = heads.plan([batch[readout.unit][0].head(readout.slot) for readout in readouts])
        pending = heads.launch(self.model, pooled, plan)
        stats = BatchStats(sequences=len(units), tokens=inputs.num_tokens, padding_tokens=inputs.padding_tokens,
                           pack_seconds=loaded.packed - started, copy_in_seconds=copied - loaded.packed,
                           heads_seconds=time.perf_counter() - forwarded, graph_path=loaded.path,
                           graph_bucket=loaded.bucket, cpu_share=cpu_share)
        return Launched(batch, readouts, pending, self.stream.completion(), stats, loaded.tokens)

    def _eager(self, units: list[PackUnit]) -> Loaded:
        """An eager batch, packed on the host and then on the model's device (a token layout in one copy)."""
        if self.eager_kind == LayoutKind.BLOCKS:
            host = row_blocks.build(units)
            packed = time.perf_counter()
            inputs = to_device(host, self.model.device)
        else:
            block = mis_attention.BLOCK_M if self.eager_kind == LayoutKind.TRITON else 0
            arrays = token_packing.pack(units, work_block=block)
            packed = time.perf_counter()
            inputs = token_packing.inputs(arrays, self.eager_kind, False, self.model.device)
        compiler = self.compiler

        def run() -> torch.Tensor:
            if compiler is not None:
                return compiler.run(EAGER_KEY, False, lambda: pooled_rows(self.model, inputs))
            return pooled_rows(self.model, inputs, self.trunk)

        return Loaded(inputs, run, inputs.num_tokens, len(inputs.readouts), packed, "eager", "none")

    def _bucket(self, bucket: Bucket, units: list[PackUnit]) -> Loaded:
        """A batch packed into a graph bucket's shapes and copied into its next slot."""
        assert self.graphs is not None
        graphs, arrays = self.graphs, self.graphs.pack(bucket, units)
        packed = time.perf_counter()
        inputs = graphs.copy_in(bucket, arrays)
        path = "graph" if bucket.graph is not None else "padded"
        return Loaded(inputs, lambda: graphs.forward(bucket), bucket.tokens, bucket.shape.sequences + 1, packed,
                      path, str(bucket.tokens))

    def finish(self, launched: Launched) -> BatchStats:
        """Wait for the batch (this batch only) and hand every job the results of its rows."""
        launched.completion.wait()
        started = time.perf_counter()
        stats = launched.stats
        stats.device_seconds = launched.completion.device_seconds()
        results = heads.collect(launched.pending, stats.copies)
        by_job: dict[int, tuple[Job, list[int], list[RowResult]]] = {}
        for readout, result in zip(launched.readouts, results, strict=True):
            job = launched.batch[readout.unit][0]
            entry = by_job.setdefault(id(job), (job, [], []))
            entry[1].append(readout.slot)
            entry[2].append(result)
        for job, slots, rows in by_job.values():
            job.absorb(slots, rows)
        stats.copy_out_seconds = time.perf_counter() - started
        return stats

    def run(self, batch: list[tuple[Job, PackUnit]]) -> BatchStats:
        """Score a batch now: every job absorbs the rows of its units (the caller finishes the complete ones)."""
        return self.finish(self.launch(batch))
