"""The conformance suite's hypothesis settings: a small, fixed-seed example budget in CI, a longer random search
with SCOREKEEPER_CONFORMANCE=long (docs/architecture.md, "Correctness tests")."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("SCOREKEEPER_CONFORMANCE", "") == "long"


def conformance(ci_examples: int, long_examples: int) -> settings:
    """Fixed seed (derandomized) and `ci_examples` per test in CI; `long_examples`, randomized, in the long profile.
    No example database: a failure is reproduced from its printed example and becomes a plain regression test
    (tests/conformance/test_regressions.py)."""
    return settings(max_examples=long_examples if LONG else ci_examples, derandomize=not LONG, database=None,
                    deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
