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


def check(body: dict[str, Any], served: list[list[float]] | None, refusal: str | None, want: Outcome) -> None:
    """`served`: the score rows of a 200; `refusal`: the message of a 400 (one of them is None)."""
    if currently_in_test_context():  # counted by --hypothesis-show-statistics
        event("refused" if isinstance(want, Refused) else "scored")
    if isinstance(want, Refused):
        assert refusal is not None, f"scored a request that must be refused ({want.why}): {body}"
        return
    assert refusal is None, f"refused a request the reference scores ({refusal}): {body}"
    assert served is not None
    assert [len(row) for row in served] == [len(row) for row in want], body
    np.testing.assert_allclose(np.array(served, dtype=float), np.array(want, dtype=float), rtol=RTOL, atol=ATOL,
                               err_msg=str(body))
