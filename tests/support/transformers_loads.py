"""One transformers load at a time in the test process.

`from_pretrained` swaps `PreTrainedModel.tie_weights` (and `init_weights`) for no-ops process-wide while it builds a
model, then restores what it saved and ties the new model's weights. Two loads that overlap in one process can each
save the other's no-op (the last to finish restores it for good), or tie while the other has swapped it out: either
way a tied model comes out with its `lm_head` untied and missing, which the worker's loader refuses (`incomplete or
mismatched weights … ['lm_head.weight']`). A worker loads once per process; the test process loads many models,
some in in-process servers' load threads while a test loads a reference, so it takes them one at a time
(tests/models/test_transformers_loads.py overlaps two)."""

from __future__ import annotations

import functools
import threading
from typing import Any

_LOCK = threading.RLock()  # reentrant: a load may load another model (a sub-model) in the same thread


def serialize_loads() -> None:
    from transformers import PreTrainedModel

    load = PreTrainedModel.from_pretrained.__func__  # type: ignore[attr-defined]
    if getattr(load, "serialized", False):
        return

    @functools.wraps(load)
    def one_at_a_time(cls: type[PreTrainedModel], *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return load(cls, *args, **kwargs)

    one_at_a_time.serialized = True  # type: ignore[attr-defined]
    PreTrainedModel.from_pretrained = classmethod(one_at_a_time)  # type: ignore[assignment,method-assign]
