"""The test process's loads of tied models stay tied when they overlap (tests/support/transformers_loads.py): without
the serialization, two threads loading at once leave `PreTrainedModel.tie_weights` a no-op for the rest of the test run
(seen as a CI failure far from its cause)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path


def test_overlapping_loads_leave_tying_intact(tiny_model: Callable[[str], Path]) -> None:
    from transformers import AutoModelForCausalLM, PreTrainedModel

    path = tiny_model("qwen3-causal")  # tie_word_embeddings: lm_head is the input embedding
    tie_weights = PreTrainedModel.tie_weights
    loaded: list[object] = []

    def load() -> None:
        for _ in range(5):
            loaded.append(AutoModelForCausalLM.from_pretrained(path))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert PreTrainedModel.tie_weights is tie_weights
    assert len(loaded) == 10
    assert all(model.lm_head.weight is model.get_input_embeddings().weight for model in loaded)  # type: ignore[attr-defined]
    after = AutoModelForCausalLM.from_pretrained(path)
    assert after.lm_head.weight is after.get_input_embeddings().weight
