"""Checkpoint variants and engine runs for exactness tests: a tiny model copied with config edits, and requests
planned as the server plans them, all of their units run as ONE packed batch through the real executor."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from scorekeeper_worker.contract.schemas import ScoreRequest
from scorekeeper_worker.engine.executor import Executor
from scorekeeper_worker.engine.jobs import ScoreJob
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.planning.planner import plan, tokenize


def variant(source: Path, target: Path, **config: Any) -> Path:
    """A copy of the model directory `source` at `target` with `config.json` keys replaced (weights unchanged)."""
    if not (target / "config.json").is_file():
        shutil.copytree(source, target)
        settings = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(settings | config))
    return target


def one_batch(model: ScoringModel, requests: list[ScoreRequest], multi_item: bool = False,
              delimiter: int | None = None, max_batch_tokens: int = 1 << 20) -> list[list[list[float]]]:
    """Every request planned like the server plans it (multi-item for decoders when `multi_item`), all their units
    in one executor batch; the score rows of each request."""
    loop = asyncio.new_event_loop()
    try:
        jobs, units = [], []
        for request in requests:
            labels = request.label_token_ids
            per_item = labels if labels and isinstance(labels[0], list) else [labels] * len(request.item_list)
            tokens = tokenize(model, request)
            job = ScoreJob(num_items=len(tokens.items), apply_softmax=request.apply_softmax,
                           temperature=request.temperature,
                           labels=[per_item[row] for row in tokens.rows_of] if model.kind == ModelKind.CAUSAL_LM
                           else None, want_pooled=False, prompt_tokens=0, multi_item=False,
                           future=loop.create_future(), loop=loop)
            job_plan = plan(model, request, tokens, job, multi_item and model.is_decoder, max_batch_tokens, delimiter)
            job.remaining = sum(len(unit.pools) for unit in job_plan.units)
            jobs.append(job)
            units += job_plan.units
        Executor(model).run(units)
    finally:
        loop.close()
    assert all(job.remaining == 0 for job in jobs)
    return [[list(row or []) for row in job.scores] for job in jobs]
