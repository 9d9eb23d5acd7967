"""Half precision keeps the suite's promise of isolation: one tenant's overflow changes no other tenant's answer.

For every packed variant (DeBERTa runs its own attention on padded blocks: tests/worker/engine/runner/
test_poisoned_neighbours.py covers it), in float16, hypothesis draws a batch of co-tenant requests (as the engine
suite does) and an attention backend (row blocks; dense graph buckets; flex; the Triton kernel under its
interpreter). The batch runs twice as ONE packed batch: as drawn, and with the first tenant's keys and values inf and
NaN in every attention call (the first tenant's units are packed first). Every other tenant's answer (scores, pooled
vectors, or its 400) must be the same bit for bit, NaN where it was NaN; the first tenant's must be non-finite (the
service answers it 500). The long profile (SCOREKEEPER_CONFORMANCE=long) draws 60 batches per variant."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
import strategies
from engine_runs import request_for
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis_profile import conformance
from leaky_attention import poisoned_keys
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.runner.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.serving.direct import score_now
from scorekeeper_worker.serving.prepare import Limits, check, prepare
from subjects import half_precision, subject
from tiny_models import SPECS
from variants import VARIANTS, Variant

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
PACKED = [v for v in VARIANTS if SPECS[v.base].family != "deberta-v2"]
BACKENDS = ["row blocks", "dense buckets", "flex", "triton"]
LIMITS = Limits()
Answer = list[list[float]] | str  # a request's rows (scores, then pooled vectors), or its 400


def _executor(engine: ScoringModel, backend: str) -> Executor:
    if backend == "dense buckets":
        return Executor(engine, "sdpa", GraphRunner(engine, LayoutKind.DENSE, (256, 1024), 1024, 64))
    return Executor(engine, {"row blocks": "sdpa", "flex": "flex", "triton": "triton"}[backend])


def _packed_tokens(engine: ScoringModel, body: dict[str, Any]) -> int:
    """The tokens of a request's units (packed first when it is the batch's first request); 0 when refused."""
    loop = asyncio.new_event_loop()
    try:
        ask = request_for(body).ask()
        plan = prepare(engine, ask, check(engine, ask, LIMITS), LIMITS, loop.create_future(), loop).plan
    except Invalid:
        return 0
    finally:
        loop.close()
    return sum(unit.num_tokens for unit in plan.units)


def _answers(executor: Executor, bodies: list[dict[str, Any]]) -> list[Answer]:
    answers: list[Answer] = []
    for job in score_now(executor, [request_for(body).ask() for body in bodies], LIMITS):
        if isinstance(job, Invalid):
            answers.append(str(job))
            continue
        rows = [list(row or []) for row in (job.pooled if job.embed else job.scores)]
        answers.append(rows + ([list(p or []) for p in job.pooled] if job.want_pooled and not job.embed else []))
    return answers


def _same(clean: Answer, dirty: Answer) -> bool:
    """Equal bit for bit, NaN where NaN."""
    if isinstance(clean, str) or isinstance(dirty, str):
        return clean == dirty
    return [[x if x == x else "nan" for x in row] for row in clean] == \
        [[x if x == x else "nan" for x in row] for row in dirty]


@pytest.mark.parametrize("variant", PACKED, ids=lambda v: v.name)
@conformance(ci_examples=1, long_examples=60)
@given(data=st.data())
def test_one_tenant_s_overflow_changes_no_other_answer(variant: Variant, variants_dir: Path,
                                                       data: st.DataObject) -> None:
    tested = subject(variant, variants_dir)
    engine = half_precision(variant, variants_dir)
    bodies: list[dict[str, Any]] = data.draw(strategies.batches(tested, min_size=2), label="bodies")
    tokens = _packed_tokens(engine, bodies[0])
    assume(tokens > 0)  # the first tenant is scored
    backend = data.draw(st.sampled_from(BACKENDS), label="backend")
    poison = data.draw(st.sampled_from([(math.nan, math.inf), (-math.inf, math.nan)]), label="keys, values")
    clean = _answers(_executor(engine, backend), bodies)
    with poisoned_keys(tokens, *poison):
        dirty = _answers(_executor(engine, backend), bodies)
    first = dirty[0]
    assert not isinstance(first, str) and not all(math.isfinite(x) for row in first for x in row), first
    for body, before, after in zip(bodies[1:], clean[1:], dirty[1:], strict=True):
        assert _same(before, after), (body, before, after)
