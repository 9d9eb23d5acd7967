"""Checkpoint variants and engine runs for exactness tests: a tiny model copied with config edits, and requests
planned as the server plans them (/v1/score bodies, and /v1/embeddings bodies as api/routes/embeddings.py hands them to
the service), all of their units run as ONE packed batch through the real executor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from scorekeeper_worker.api.wire.compat import EmbeddingRequest
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.serving.direct import score_now
from scorekeeper_worker.serving.prepare import Limits

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


def outcomes(model: ScoringModel, requests: list[ScoreRequest] | list[ScoreRequest | EmbeddingRequest],
             multi_item: bool = False, delimiter: int | None = None,
             max_batch_tokens: int = 1 << 20) -> list[Rows | Invalid]:
    """Every request planned like the server plans it (multi-item for decoders when `multi_item`, or as the request
    asks), the units of all that plan in one executor batch: each request's score rows (an embedding request's
    vectors; with return_pooled_hidden_states, each row followed by its pooled state), or the 400 it got."""
    limits = Limits(max_batch_tokens=max_batch_tokens, multi_item=multi_item, delimiter=delimiter)
    results: list[Rows | Invalid] = []
    for job in score_now(Executor(model), [request.ask() for request in requests], limits):
        if isinstance(job, Invalid):
            results.append(job)
        else:
            assert job.remaining == 0
            rows = [list(row or []) for row in (job.pooled if job.embed else job.scores)]
            if job.want_pooled and not job.embed:  # return_pooled_hidden_states: each row, then its pooled state
                rows = [row + list(pooled or []) for row, pooled in zip(rows, job.pooled, strict=True)]
            results.append(rows)
    return results


def one_batch(model: ScoringModel, requests: list[ScoreRequest], multi_item: bool = False,
              delimiter: int | None = None, max_batch_tokens: int = 1 << 20) -> list[Rows]:
    """`outcomes` of requests that must all be scored."""
    results = outcomes(model, requests, multi_item, delimiter, max_batch_tokens)
    assert not any(isinstance(result, Invalid) for result in results), results
    return results  # type: ignore[return-value]
