"""CUDA graphs by total-token bucket, multi-item scoring included.

One graph per bucket of `--cuda-graph-token-buckets`, each over static buffers of the bucket's fixed shapes
(`packing.GraphShape`): packed ids, positions, token types, the per-token attention metadata (segment, query segment,
offset in row, visible prefix: where sequences and items start and end) and the pool buffers (token, slot, weight), all
views of one device buffer per slot. A batch takes the smallest bucket it fits, is packed on the host by the same token
packer as eager batches (`token_packing`) with padding up to the bucket, staged in one pinned buffer and copied in one
copy, replayed; the caller reads only its live pooled rows. On CUDA each bucket has two slots (double buffering): batch
N+1 is copied into one, on a copy stream, while batch N replays from the other. Nothing baked into a graph is a live
value: shapes are bucket bounds, every boundary is in a buffer, masks are computed inside the graph.

Multi-item scoring stays on: boundaries are computed on the host from token counts, never by finding delimiter
tokens in device tensors, so padding (whatever its token id) cannot create a false item boundary (the reason SGLang
turns graphs off under MIS).

Without CUDA the same buffers, padding and bucket choice run eagerly ("padded" path), which is how the CPU tests
prove padded batches give the scores of unpadded ones. A failed capture (or a captured graph that disagrees with
eager on a probe batch) leaves its bucket to the eager path, with a log line and a metric.

With a `CompiledTrunk` (`--compile`), each bucket's layers are compiled for its static shapes during the warm-up
passes and the capture records the compiled kernels; a bucket whose compile or compiled capture fails is captured
again with the plain layers (the compiler logs and counts it), and only if that fails too does it run eager.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from scorekeeper_worker.engine.runner import token_packing
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.compiled_trunk import CompiledTrunk, compile_mode
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import ForwardInputs, GraphShape, PackUnit, Pool, fits
from scorekeeper_worker.engine.runner.token_packing import Staging, TokenArrays
from scorekeeper_worker.model.kernels import mis_attention
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import Pooling, ScoringModel

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # before capture: lazy initialisation, cuBLAS workspaces, Triton compilation


@dataclass
class Slot:
    """One set of a bucket's static buffers and the graph captured on it."""

    buffer: torch.Tensor  # the device bytes a batch is copied into (token_packing.Staging's layout)
    static: ForwardInputs  # the tensors a forward reads: views of `buffer`
    graph: torch.cuda.CUDAGraph | None = None
    output: torch.Tensor | None = None  # [sequences + 1, H] pooled rows written by the graph
    loaded: Any = None  # CUDA event: this slot's batch is on the device (copy stream)
    released: Any = None  # CUDA event: the last replay that read this slot has run


@dataclass
class Bucket:
    """A token bucket: one slot, or two with double buffering (batch N+1 is copied into the other slot, on a copy
    stream, while batch N replays from this one). `static`, `graph` and `output` are the current slot's."""

    shape: GraphShape
    staging: Staging
    slots: list[Slot]
    current: int = 0
    disabled: bool = False  # capture failed: its batches run eager

    @property
    def tokens(self) -> int:
        return self.shape.tokens

    @property
    def static(self) -> ForwardInputs:
        return self.slots[self.current].static

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return self.slots[self.current].graph

    @graph.setter
    def graph(self, graph: torch.cuda.CUDAGraph | None) -> None:
        self.slots[self.current].graph = graph

    @property
    def output(self) -> torch.Tensor | None:
        return self.slots[self.current].output

    @output.setter
    def output(self, output: torch.Tensor | None) -> None:
        self.slots[self.current].output = output


def probe_units(shape: GraphShape, vocab: int, position_start: int, seed: int = 0) -> list[PackUnit]:
    """A deterministic batch of about half a bucket: plain sequences and one multi-item unit, random token ids. It
    differs from the all-padding capture batch, so a value baked into a graph shows up as a mismatch."""
    rng = random.Random(seed + shape.tokens)

    def ids(count: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(count)]

    budget, slots = max(1, shape.tokens // 2), shape.sequences
    units: list[PackUnit] = []
    if budget >= 8 and slots >= 3:
        query, items = ids(budget // 4), [ids(max(1, budget // 12)) for _ in range(3)]
        unit = PackUnit(query, items=items, visible_prefix=len(query), position_start=position_start)
        end = len(query)
        for i, item in enumerate(items):
            end += len(item)
            unit.pools.append(Pool(range(end - 1, end), i))
        units.append(unit)
        budget -= unit.num_tokens
        slots -= 3
    while budget > 0 and slots > 0:
        length = min(budget, rng.randint(1, max(1, shape.tokens // 8)))
        units.append(PackUnit(ids(length), position_start=position_start,
                              pools=[Pool(range(length - 1, length), len(units))]))
        budget -= length
        slots -= 1
    return units


class GraphRunner:
    """The buckets of one model: selection, static buffers, capture (CUDA), replay and fallback."""

    def __init__(self, model: ScoringModel, kind: LayoutKind, buckets: Sequence[int], max_tokens: int,
                 max_seqs: int, capture: bool | None = None, pad_token: int = 0,
                 on_capture_failure: Callable[[], None] | None = None,
                 compiler: CompiledTrunk | None = None, double_buffer: bool | None = None) -> None:
        if kind == LayoutKind.BLOCKS:
            raise ValueError("graph buckets need a token layout (dense or flex)")
        self.model = model
        self.kind = kind
        self.eager_kind = LayoutKind.BLOCKS if kind == LayoutKind.DENSE else kind
        self.max_tokens = max_tokens
        self.capture_enabled = (model.device.type == "cuda" and torch.cuda.is_available()) if capture is None \
            else capture
        self.on_capture_failure = on_capture_failure
        self.compiler = compiler
        # Last-token and first-token pooling read one row per slot: the pool gathers only those.
        pooled_tokens = None if model.pooling == Pooling.MEAN else max_seqs
        work_block = mis_attention.BLOCK_M if kind == LayoutKind.TRITON else 0
        shapes = [GraphShape(tokens, max_seqs, model.uses_token_types, pad_token, pooled_tokens, work_block)
                  for tokens in sorted(set(buckets)) if tokens <= max_tokens]
        on_cuda = model.device.type == "cuda" and torch.cuda.is_available()
        # With CUDA: host batches are staged in pinned memory and copied on their own stream, so the copy of batch
        # N+1 runs while batch N replays, and the host is free as soon as the copy is queued.
        self.copy_stream = torch.cuda.Stream() if on_cuda else None
        slots = 2 if (double_buffer if double_buffer is not None else on_cuda) else 1
        self.buckets = [self._bucket(shape, slots) for shape in shapes]

    def _bucket(self, shape: GraphShape, slots: int) -> Bucket:
        """A bucket's slots, each holding an empty batch (all padding) until the first load."""
        staging = Staging.for_shape(shape)
        empty = token_packing.pack([], shape)
        bucket = Bucket(shape, staging, [])
        # Inference tensors, like every eager batch: compiled kernels (flex) guard on the tensors' dispatch keys, so
        # plain tensors here would compile every variant a second time.
        with torch.inference_mode():
            for _ in range(slots):
                buffer = staging.buffer(self.model.device)
                slot = Slot(buffer, staging.views(buffer, self.kind, static=True))
                self._write(bucket, slot, empty)
                token_packing.describe(slot.static, empty)
                bucket.slots.append(slot)
        return bucket

    def select(self, units: list[PackUnit]) -> Bucket | None:
        """The smallest usable bucket the batch fits, or None (run eager)."""
        if sum(u.num_tokens for u in units) > self.max_tokens:
            return None
        return next((b for b in self.buckets if not b.disabled and fits(units, b.shape)), None)

    def load(self, bucket: Bucket, units: list[PackUnit]) -> ForwardInputs:
        """Pack the batch (on the host) and copy it into the bucket's next slot: `copy_in(pack(...))`."""
        return self.copy_in(bucket, self.pack(bucket, units))

    def pack(self, bucket: Bucket, units: list[PackUnit]) -> TokenArrays:
        """The batch packed on the host, padded to the bucket."""
        return token_packing.pack(units, bucket.shape)

    def copy_in(self, bucket: Bucket, arrays: TokenArrays) -> ForwardInputs:
        """Copy a packed batch into the bucket's next slot, which becomes current; returns the slot's inputs, which
        describe the batch (readouts, live token counts) until the slot is loaded again."""
        bucket.current = (bucket.current + 1) % len(bucket.slots)
        slot = bucket.slots[bucket.current]
        self._write(bucket, slot, arrays)
        token_packing.describe(slot.static, arrays)
        return slot.static

    def _write(self, bucket: Bucket, slot: Slot, arrays: TokenArrays) -> None:
        if self.copy_stream is None:  # the buffer is on the host: write into it
            bucket.staging.write(arrays, slot.buffer)
            return
        staged = bucket.staging.buffer(torch.device("cpu"), pinned=True)  # caching host allocator: reused once copied
        bucket.staging.write(arrays, staged)
        with torch.cuda.stream(self.copy_stream):
            if slot.released is not None:  # never overwrite buffers a queued replay still reads
                self.copy_stream.wait_event(slot.released)
            slot.buffer.copy_(staged, non_blocking=True)
            slot.loaded = torch.cuda.Event()
            slot.loaded.record(self.copy_stream)

    def forward(self, bucket: Bucket) -> torch.Tensor:
        """Pooled rows of the loaded batch: [sequences + 1, H], the live rows first. Valid until the next replay."""
        slot = bucket.slots[bucket.current]
        if slot.loaded is not None:
            torch.cuda.current_stream().wait_event(slot.loaded)
        if slot.graph is not None:
            slot.graph.replay()
            if self.copy_stream is not None:
                slot.released = torch.cuda.Event()
                slot.released.record(torch.cuda.current_stream())
            assert slot.output is not None
            return slot.output
        return self._pass(bucket)

    def _pass(self, bucket: Bucket) -> torch.Tensor:
        """One forward on the bucket's buffers, with the bucket's compiled layers when there are any."""
        if self.compiler is None:
            return pooled_rows(self.model, bucket.static)
        return self.compiler.run(_key(bucket), True, lambda: pooled_rows(self.model, bucket.static))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, into one memory pool (smaller graphs reuse the larger ones' memory;
        replays never overlap). Without CUDA: say once that the padded path runs without capture."""
        sizes = ",".join(str(b.tokens) for b in self.buckets)
        if not self.capture_enabled:
            log.info("CUDA graphs: no CUDA device, so batches run the padded, bucketed path (buckets %s) without "
                     "capture", sizes)
            return
        pool = None
        for bucket in reversed(self.buckets):
            try:
                for index in range(len(bucket.slots)):
                    bucket.current = index
                    pool = pool or torch.cuda.graph_pool_handle()
                    try:
                        self._capture(bucket, pool)
                        self._check(bucket)
                    except Exception as error:
                        if self.compiler is None or self.compiler.mode_for(_key(bucket), True) is None:
                            raise
                        self.compiler.disable(_key(bucket), error)  # log line, counter; then the plain layers
                        bucket.graph, bucket.output, pool = None, None, torch.cuda.graph_pool_handle()
                        self._capture(bucket, pool)
                        self._check(bucket)
            except Exception as error:  # one bad bucket must never stop the worker: it runs eager
                for slot in bucket.slots:
                    slot.graph, slot.output = None, None
                bucket.disabled = True
                # A pool lives as long as a graph holds it, and a failed capture can leave it inconsistent: the next
                # bucket starts a new one (reusing it failed every later capture with an allocator assert on an H200).
                pool = None
                log.error("CUDA graph capture of the %d-token bucket failed, its batches run eager: %s: %s",
                          bucket.tokens, type(error).__name__, error)
                if self.on_capture_failure is not None:
                    self.on_capture_failure()
        captured = [str(b.tokens) for b in self.buckets if b.graph is not None]
        log.info("CUDA graphs captured for token buckets %s (configured %s)", ",".join(captured) or "none", sizes)

    def _capture(self, bucket: Bucket, pool: tuple[int, int]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):  # the first one compiles the bucket's layers (with a compiler)
                self._pass(bucket)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        mode = None if self.compiler is None else self.compiler.mode_for(_key(bucket), True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), compile_mode(mode):
            output = pooled_rows(self.model, bucket.static)
        torch.cuda.synchronize()
        bucket.graph, bucket.output = graph, output

    def _check(self, bucket: Bucket) -> None:
        """Replay on a probe batch unlike the capture data and compare with eager: a graph that baked in a value
        (or a kernel that misbehaves under capture) is caught here, before serving."""
        model = self.model
        units = probe_units(bucket.shape, model.model.get_input_embeddings().num_embeddings, model.position_start)
        arrays = token_packing.pack(units, bucket.shape)
        self._write(bucket, bucket.slots[bucket.current], arrays)  # the slot being checked, not the next one
        replayed = self.forward(bucket)[: len(arrays.pools.readouts)].float()
        expected = pooled_rows(model, build_inputs(units, model.device, self.eager_kind)).float()
        tolerance = (1e-3 if model.dtype == torch.float32 else 5e-2) * max(1.0, expected.abs().max().item())
        error = (replayed - expected).abs().max().item()
        if not error <= tolerance:
            raise RuntimeError(f"replay differs from eager by {error:.3g} (tolerance {tolerance:.3g})")


def _key(bucket: Bucket) -> str:
    return f"the {bucket.tokens}-token bucket"
