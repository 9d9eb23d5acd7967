"""The only code that runs the model: pack units → one forward on the packed batch → pooled rows → job scores."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scorekeeper_worker.attention import LayoutKind
from scorekeeper_worker.jobs import CopyStats, ScoreJob
from scorekeeper_worker.loader import ScoringModel
from scorekeeper_worker.packing import ForwardInputs, PackUnit, build_inputs

if TYPE_CHECKING:
    from scorekeeper_worker.cuda_graphs import GraphRunner


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


def padded_hidden(trunk: torch.nn.Module, inputs: ForwardInputs) -> torch.Tensor:
    """Models whose attention does not go through transformers' AttentionInterface (support matrix: padded): each
    block of similar-length sequences runs as an ordinary right-padded batch with an attention mask, so the model's
    own attention keeps sequences apart. Returns the packed hidden states [T, H], as the packed path does."""
    ids, types = inputs.input_ids[0], inputs.token_type_ids
    hidden: torch.Tensor | None = None
    for block in inputs.layout.context_blocks:
        mask = torch.arange(block.token_index.shape[1], device=ids.device)[None, :] < block.lengths[:, None]
        extra = {} if types is None else {"token_type_ids": types[0][block.token_index]}
        out = trunk(input_ids=ids[block.token_index], attention_mask=mask.long(), position_ids=block.positions,
                    **extra).last_hidden_state
        if hidden is None:
            hidden = out.new_empty(inputs.num_tokens + 1, out.shape[-1])  # the last row takes padding
        hidden.index_copy_(0, block.write_index, out.reshape(-1, out.shape[-1]))
    assert hidden is not None, "a batch has at least one sequence"
    return hidden[:-1]


def pooled_rows(model: ScoringModel, inputs: ForwardInputs) -> torch.Tensor:
    """Forward the packed batch and pool it: [P, H] float32, one row per Pool of the units (graph-shaped inputs:
    one row per slot of the bucket, the live ones first). Reads no device value on the host, so it can be captured."""
    inputs.layout.reset()  # masks are rebuilt from the tensors' current values in every pass
    if model.packed:
        extra = {} if inputs.token_type_ids is None else {"token_type_ids": inputs.token_type_ids}
        output = model.trunk(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                             scorekeeper_layout=inputs.layout, use_cache=False, **extra)
        hidden = output.last_hidden_state[0]
    else:
        hidden = padded_hidden(model.trunk, inputs)
    contributions = hidden[inputs.pool_token_index].float() * inputs.pool_weight[:, None]
    pooled = torch.zeros(inputs.pool_rows or len(inputs.owners), hidden.shape[-1], dtype=torch.float32,
                         device=hidden.device)
    return pooled.index_add_(0, inputs.pool_slot, contributions)


class Executor:
    def __init__(self, model: ScoringModel, backend: str = "sdpa", graphs: GraphRunner | None = None) -> None:
        self.model = model
        # Padded models run on the row blocks of the BLOCKS layout (executor.padded_hidden).
        self.eager_kind = LayoutKind.FLEX if backend == "flex" and model.packed else LayoutKind.BLOCKS
        self.graphs = graphs

    @torch.inference_mode()
    def run(self, units: list[PackUnit]) -> tuple[list[ScoreJob], BatchStats]:
        """Score a batch; returns the jobs that got rows in it (the caller finishes the complete ones)."""
        started = time.perf_counter()
        bucket = self.graphs.select(units) if self.graphs is not None else None
        if bucket is None:
            inputs = build_inputs(units, self.model.device, self.eager_kind)
            packed = time.perf_counter()
            pooled = pooled_rows(self.model, inputs)
            path, label = "eager", "none"
        else:
            assert self.graphs is not None
            inputs = self.graphs.load(bucket, units)
            packed = time.perf_counter()
            pooled = self.graphs.forward(bucket)
            path, label = ("graph" if bucket.graph is not None else "padded"), str(bucket.shape.tokens)
        if pooled.is_cuda:
            torch.cuda.synchronize()
        forwarded = time.perf_counter()
        by_job: dict[int, tuple[ScoreJob, list[int], list[int]]] = {}
        for row, (job, slot) in enumerate(inputs.owners):
            entry = by_job.setdefault(id(job), (job, [], []))
            entry[1].append(slot)
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
        )
        return [job for job, _, _ in by_job.values()], stats
