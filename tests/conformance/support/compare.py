"""One comparison rule for every conformance check: exact to 1e-4 relative in float32 (1e-5 absolute floor), or
refused with a 400 exactly when the reference says the request cannot be scored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import event
from hypothesis.control import currently_in_test_context

RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Refused:
    """The reference's verdict that a request cannot be served: it must get a 400."""

    why: str


Outcome = list[list[float]] | Refused  # score rows (or vectors), or refused


def served_as_expected(body: dict[str, Any], refusal: str | None, want: object, verb: str) -> bool:
    """The refusal rule shared by every check: a 400 exactly when the reference refuses. True when there is a result
    left to compare (`verb`: what the server does with the request, for the statistics and messages)."""
    if currently_in_test_context():  # counted by --hypothesis-show-statistics
        event("refused" if isinstance(want, Refused) else verb)
    if isinstance(want, Refused):
        assert refusal is not None, f"{verb} a request that must be refused ({want.why}): {body}"
        return False
    assert refusal is None, f"refused a request the reference does not refuse ({refusal}): {body}"
    return True


def check(body: dict[str, Any], served: list[list[float]] | None, refusal: str | None, want: Outcome) -> None:
    """`served`: the score rows of a 200; `refusal`: the message of a 400 (one of them is None)."""
    if not served_as_expected(body, refusal, want, "scored"):
        return
    assert served is not None and not isinstance(want, Refused)
    assert [len(row) for row in served] == [len(row) for row in want], body
    np.testing.assert_allclose(np.array(served, dtype=float), np.array(want, dtype=float), rtol=RTOL, atol=ATOL,
                               err_msg=str(body))
