"""The only code that runs the model: pack units → one forward on the packed batch → pooled rows → job scores."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from scorekeeper_worker.jobs import CopyStats, ScoreJob
from scorekeeper_worker.loader import ScoringModel
from scorekeeper_worker.packing import ForwardInputs, PackUnit, build_inputs


@dataclass
class BatchStats:
    sequences: int
    tokens: int
    padding_tokens: int
    inputs_seconds: float
    forward_seconds: float
    scoring_seconds: float
    copies: CopyStats


def pooled_rows(model: ScoringModel, inputs: ForwardInputs) -> torch.Tensor:
    """Forward the packed batch and pool it: [P, H] float32, one row per Pool of the units."""
    extra = {} if inputs.token_type_ids is None else {"token_type_ids": inputs.token_type_ids}
    output = model.trunk(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                         scorekeeper_layout=inputs.layout, **extra)
    hidden = output.last_hidden_state[0]
    contributions = hidden[inputs.pool_token_index].float() * inputs.pool_weight[:, None]
    pooled = torch.zeros(len(inputs.owners), hidden.shape[-1], dtype=torch.float32, device=hidden.device)
    return pooled.index_add_(0, inputs.pool_slot, contributions)


class Executor:
    def __init__(self, model: ScoringModel) -> None:
        self.model = model

    @torch.inference_mode()
    def run(self, units: list[PackUnit]) -> tuple[list[ScoreJob], BatchStats]:
        """Score a batch; returns the jobs that got rows in it (the caller finishes the complete ones)."""
        started = time.perf_counter()
        inputs = build_inputs(units, self.model.device)
        packed = time.perf_counter()
        pooled = pooled_rows(self.model, inputs)
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
        )
        return [job for job, _, _ in by_job.values()], stats
