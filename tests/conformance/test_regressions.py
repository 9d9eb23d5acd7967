"""Failing examples the conformance suite found, kept as plain tests (each through the same engine run and reference
as the suite: tests/conformance/test_conformance_engine.py). Found on the engine before issue 22's fixes:
- a pad token as the whole item of an XLM-R embedding model: positions numbered from the ids;
- a Qwen3 classifier's sequence of pad tokens but one: read at the last token that is not pad;
- a longrope reward model's long sequence co-batched with a short one: the table of each sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conformance.compare import check
from conformance.expected import expected
from conformance.subjects import subject
from conformance.variants import VARIANTS
from engine_runs import outcomes
from scorekeeper_worker.contract.errors import BadRequest
from scorekeeper_worker.contract.schemas import ScoreRequest

REGRESSIONS: list[tuple[str, list[dict[str, Any]], int | None]] = [
    ("xlmr-embed-plain", [{"query": "", "items": ["<pad>"]}], None),
    ("qwen3-cls3-longrope-useslidingwindow-slidingwindow-maxwindowlayers-layertypes",
     [{"query": [], "items": [[]]}, {"query": [], "items": [[0] * 42 + [1, 0]]}], None),
    ("qwen2-reward-longrope", [{"query": [7, 8, 9], "items": [[10] * 20]}, {"query": [11], "items": [[12] * 70]}],
     None),
]


@pytest.mark.parametrize(("name", "bodies", "delimiter"), REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_found_by_the_conformance_suite(name: str, bodies: list[dict[str, Any]], delimiter: int | None,
                                        variants_dir: Path) -> None:
    tested = subject(next(v for v in VARIANTS if v.name == name), variants_dir)
    served = outcomes(tested.engine, [ScoreRequest(**body) for body in bodies], delimiter=delimiter,
                      max_batch_tokens=48)
    for body, result in zip(bodies, served, strict=True):
        refusal = str(result) if isinstance(result, BadRequest) else None
        check(body, None if refusal else result, refusal, expected(tested, body))  # type: ignore[arg-type]
