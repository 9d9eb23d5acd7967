"""Conformance through the real engine: for every variant (tests/conformance/support/variants.py, the
sentence-transformers directories included), hypothesis generates batches of co-tenant requests (text with special, pad,
EOS and SEP tokens inside, token ids, lengths up to and past the maximum, pairs, multi-item scoring with and without a
delimiter, prompt templates, truncation; /v1/embeddings bodies with or without a prompt_name beside /v1/score ones for
embedding models), plans them as the server does and runs all of them as ONE packed batch; every score and vector must
equal the reference (transformers, one sequence per forward, its text-classification pipeline, or sentence-transformers)
to 1e-4 relative, and every refusal must be one the reference predicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import strategies
from compare import check
from engine_runs import outcomes, request_for
from expected import expected
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_profile import conformance
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.support import supported_architectures
from subjects import subject
from tiny_models import SPECS
from variants import SENTENCE_VARIANTS, VARIANTS, SentenceVariant, Variant


def test_every_supported_architecture_has_a_variant() -> None:
    assert {SPECS[v.base].architecture for v in VARIANTS} == set(supported_architectures())


@pytest.mark.parametrize("variant", [*VARIANTS, *SENTENCE_VARIANTS], ids=lambda v: v.name)
@conformance(ci_examples=3, long_examples=150)
@given(data=st.data())
def test_co_tenant_batches_match_the_reference(variant: Variant | SentenceVariant, variants_dir: Path,
                                               data: st.DataObject) -> None:
    tested = subject(variant, variants_dir)
    bodies: list[dict[str, Any]] = data.draw(strategies.batches(tested), label="bodies")
    delimiter = data.draw(strategies.delimiters(tested), label="delimiter") if variant.decoder else None
    budget = data.draw(st.sampled_from([48, 160, 1 << 20]), label="max_batch_tokens")
    served = outcomes(tested.engine, [request_for(body) for body in bodies], delimiter=delimiter,
                      max_batch_tokens=budget)
    for body, result in zip(bodies, served, strict=True):
        refusal = str(result) if isinstance(result, Invalid) else None
        check(body, None if refusal else result, refusal, expected(tested, body))  # type: ignore[arg-type]
