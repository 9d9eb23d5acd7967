"""Failing examples the conformance suite found, kept as plain tests (each through the same engine run and reference
as the suite: tests/conformance/test_conformance_engine.py). Found on the engine before issue 22's fixes:
- a pad token as the whole item of an XLM-R embedding model: positions numbered from the ids;
- a Qwen3 classifier's sequence of pad tokens but one: read at the last token that is not pad;
- a longrope reward model's long sequence co-batched with a short one: the table of each sequence.
Found on the sentence-transformers variants:
- `max_tokens_per_item` under an embedding model's prompt cut the prompt with the text (an item of the prompt alone,
  "nothing left to pool", or a 200 for an item over the maximum): it cuts the text's own tokens;
- then, with a prompt that fills most of the maximum and a left cut, the text's tail was read with the maximum's
  bound alone, too short to hold the prompt's tokens too: the text was lost, the item scored as its prompt alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compare import check
from engine_runs import outcomes, request_for
from expected import expected
from scorekeeper_worker.base.errors import Invalid
from subjects import subject
from variants import SENTENCE_VARIANTS, VARIANTS

REGRESSIONS: list[tuple[str, list[dict[str, Any]], int | None]] = [
    ("xlmr-embed-plain", [{"query": "", "items": ["<pad>"]}], None),
    ("qwen3-cls3-longrope-useslidingwindow-slidingwindow-maxwindowlayers-layertypes",
     [{"query": [], "items": [[]]}, {"query": [], "items": [[0] * 42 + [1, 0]]}], None),
    ("qwen2-reward-longrope", [{"query": [7, 8, 9], "items": [[10] * 20]}, {"query": [11], "items": [[12] * 70]}],
     None),
    ("bert-prompt-excluded", [{"query": "", "items": [""], "max_tokens_per_item": 1}], None),
    ("bert-prompt-excluded", [{"query": [], "items": [[]]}, {"query": "", "items": ["*"], "max_tokens_per_item": 10}],
     None),
    ("bert-prompt-excluded", [{"query": "", "items": ["* " * 60, "", "", ""], "max_tokens_per_item": 58}], None),
    ("qwen3-embedding-causal-weights", [{"query": "a", "items": ["the dog runs in the park " * 3],
                                         "max_tokens_per_item": 3, "truncate": True, "truncation_direction": "left"}],
     None),
    ("qwen3-embedding-default-prompt", [{"query": "", "items": ["*"], "max_tokens_per_item": 1, "truncate": True,
                                         "truncation_direction": "left"}], None),
]


@pytest.mark.parametrize(("name", "bodies", "delimiter"), REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_found_by_the_conformance_suite(name: str, bodies: list[dict[str, Any]], delimiter: int | None,
                                        variants_dir: Path) -> None:
    tested = subject(next(v for v in [*VARIANTS, *SENTENCE_VARIANTS] if v.name == name), variants_dir)
    served = outcomes(tested.engine, [request_for(body) for body in bodies], delimiter=delimiter,
                      max_batch_tokens=48)
    for body, result in zip(bodies, served, strict=True):
        refusal = str(result) if isinstance(result, Invalid) else None
        check(body, None if refusal else result, refusal, expected(tested, body))  # type: ignore[arg-type]
