"""Checkpoint variants and engine runs for exactness tests: a tiny model copied with config edits, and requests
planned as the server plans them (/v1/score bodies, and /v1/embeddings bodies as api/routes/embeddings.py hands them to
the service), all of their units run as ONE packed batch through the real executor."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from scorekeeper_worker.api.wire.compat import EmbeddingRequest
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.queue.jobs import ScoreJob
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.planning.encoding import Direction, LengthRules
from scorekeeper_worker.planning.planner import plan, tokenize
from scorekeeper_worker.serving.service import label_lists

Rows = list[list[float]]


def variant(source: Path, target: Path, **config: Any) -> Path:
    """A copy of the model directory `source` at `target` with `config.json` keys replaced (weights unchanged)."""
    if not (target / "config.json").is_file():
        shutil.copytree(source, target)
        settings = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(settings | config))
    return target


def request_for(body: dict[str, Any]) -> ScoreRequest | EmbeddingRequest:
    """The validated request of a /v1/embeddings body (it has `input`) or a /v1/score body."""
    return EmbeddingRequest(**body) if "input" in body else ScoreRequest(**body)


def _as_score(request: ScoreRequest | EmbeddingRequest) -> tuple[ScoreRequest, LengthRules | None, str | None, bool]:
    """A request as the service runs it: its ScoreRequest, length rules, prompt name, and whether it embeds."""
    if isinstance(request, ScoreRequest):
        return request, None, None, False
    rules = LengthRules(truncate=request.truncate, direction=Direction(request.truncation_direction), field="input")
    return ScoreRequest(items=request.inputs), rules, request.prompt_name, True


def outcomes(model: ScoringModel, requests: list[ScoreRequest] | list[ScoreRequest | EmbeddingRequest],
             multi_item: bool = False, delimiter: int | None = None,
             max_batch_tokens: int = 1 << 20) -> list[Rows | Invalid]:
    """Every request planned like the server plans it (multi-item for decoders when `multi_item`, or as the request
    asks), the units of all that plan in one executor batch: each request's score rows (an embedding request's
    vectors), or the 400 it got."""
    loop = asyncio.new_event_loop()
    try:
        jobs: list[ScoreJob | Invalid] = []
        units = []
        for original in requests:
            request, rules, prompt_name, embed = _as_score(original)
            mis = request.multi_item_scoring if request.multi_item_scoring is not None else multi_item
            try:
                per_item = label_lists(model, request, len(request.item_list))  # refused as the server refuses
                tokens = tokenize(model, request, rules, prompt_name, query_row=not embed)
                labels = None if per_item is None else [per_item[item] for item in tokens.rows_of]
                job = ScoreJob(num_items=len(tokens.items), apply_softmax=request.apply_softmax,
                               temperature=request.temperature, labels=labels,
                               want_pooled=embed, prompt_tokens=0, multi_item=False, future=loop.create_future(),
                               loop=loop, embed=embed)
                job_plan = plan(model, request, tokens, job, mis and model.is_decoder, max_batch_tokens, delimiter,
                                query_row=not embed)
            except Invalid as refused:
                jobs.append(refused)
                continue
            job.remaining = sum(len(unit.pools) for unit in job_plan.units)
            jobs.append(job)
            units += job_plan.units
        if units:
            Executor(model).run(units)
    finally:
        loop.close()
    results: list[Rows | Invalid] = []
    for job in jobs:
        if isinstance(job, Invalid):
            results.append(job)
        else:
            assert job.remaining == 0
            results.append([list(row or []) for row in (job.pooled if job.embed else job.scores)])
    return results


def one_batch(model: ScoringModel, requests: list[ScoreRequest], multi_item: bool = False,
              delimiter: int | None = None, max_batch_tokens: int = 1 << 20) -> list[Rows]:
    """`outcomes` of requests that must all be scored."""
    results = outcomes(model, requests, multi_item, delimiter, max_batch_tokens)
    assert not any(isinstance(result, Invalid) for result in results), results
    return results  # type: ignore[return-value]
