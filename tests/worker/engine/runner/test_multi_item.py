"""Multi-item scoring gives single-item answers: same server, same token ids, one flag flipped per request."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.loader import load_model
from serving import RunningServer

DECODERS = ["qwen3-cls3", "qwen3-reward", "qwen3-causal", "qwen2-cls3", "qwen2-reward", "qwen2-causal", "llama-cls3",
            "llama-reward", "llama-causal", "llama-eos-cls3", "gemma2-cls3", "gemma2-reward", "gemma2-causal",
            "mistral-cls3", "mistral-causal"]
LABELS = [5, 17, 42]
DELIMITER = 3  # a real token id of every tiny vocabulary
MAX_BATCH_TOKENS = 512  # small, so 300 items cross the chunking boundary several times


def _items(rng: random.Random, count: int, lengths: tuple[int, int]) -> list[list[int]]:
    return [[rng.randrange(10, 250) for _ in range(rng.randint(*lengths))] for _ in range(count)]


def _cases() -> list[tuple[str, list[int], list[list[int]]]]:
    rng = random.Random(7)
    return [
        ("one", [20, 21, 22], [[30, 31]]),
        ("two", _items(rng, 1, (5, 9))[0], _items(rng, 2, (1, 6))),
        ("seven-with-empty-and-one-token", _items(rng, 1, (12, 12))[0], [[], [40], *_items(rng, 5, (1, 20))]),
        ("empty-query", [], _items(rng, 7, (1, 9))),
        ("three-hundred", _items(rng, 1, (30, 30))[0], _items(rng, 300, (1, 12))),
        ("short-and-long", _items(rng, 1, (8, 8))[0], [[50], *_items(rng, 2, (300, 400)), [51, 52], []]),
    ]


def _score(server: RunningServer, query: list[int], items: list[list[int]], mis: bool, **extra: Any) -> dict[str, Any]:
    response = server.score(query=query, items=items, label_token_ids=LABELS, multi_item_scoring=mis, **extra)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("delimiter", [None, DELIMITER], ids=["no-delimiter", "delimiter"])
@pytest.mark.parametrize("name", DECODERS)
def test_multi_item_equals_single_item(name: str, delimiter: int | None, tiny_model: Callable[[str], Path],
                                       server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model(name), multi_item_scoring_delimiter=delimiter, max_batch_tokens=MAX_BATCH_TOKENS)
    for case, query, items in _cases():
        if not query and [] in items:
            continue  # nothing to score: a 400, tested elsewhere
        single = _score(server, query, items, mis=False)
        multi = _score(server, query, items, mis=True)
        np.testing.assert_allclose(multi["scores"], single["scores"], rtol=1e-4, atol=1e-5, err_msg=case)
        # Usage counts what ran: the query once per chunk (plus delimiters) instead of once per item.
        per_chunk = len(query) + (delimiter is not None)
        item_tokens = sum(len(i) + (delimiter is not None) for i in items)
        assert (multi["usage"]["prompt_tokens"] - item_tokens) % per_chunk == 0 if per_chunk else True
        assert single["usage"]["prompt_tokens"] == sum(len(query) + len(i) for i in items)


@pytest.mark.parametrize("name", ["qwen3-cls3", "llama-reward", "gemma2-cls3"])
def test_pooled_hidden_states_multi_item_equal_single_item(name: str, tiny_model: Callable[[str], Path],
                                                           server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model(name), multi_item_scoring=True)
    _, query, items = _cases()[2]
    single = _score(server, query, items, mis=False, return_pooled_hidden_states=True)
    multi = _score(server, query, items, mis=True, return_pooled_hidden_states=True)
    np.testing.assert_allclose(multi["pooled_hidden_states"], single["pooled_hidden_states"], rtol=1e-4, atol=1e-5)


def test_encoders_and_item_first_fall_back_to_single_item(tiny_model: Callable[[str], Path],
                                                          server_for: Callable[..., RunningServer]) -> None:
    encoder = server_for(tiny_model("bert-cross"), multi_item_scoring=True)
    assert encoder.score(query="a question", items=["one", "two"]).status_code == 200
    decoder = server_for(tiny_model("qwen3-cls3"), multi_item_scoring=True)
    query, items = [20, 21], [[30], [31, 32]]
    flipped = decoder.score(query=query, items=items, item_first=True).json()
    plain = decoder.score(query=[], items=[i + query for i in items], multi_item_scoring=False).json()
    np.testing.assert_allclose(flipped["scores"], plain["scores"], rtol=1e-5)


def test_bfloat16_multi_item_within_documented_bound(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer]) -> None:
    """bfloat16 reorders roundings between the two layouts; docs/multi-item-scoring.md states this bound."""
    server = server_for(tiny_model("qwen3-cls3"), dtype="bfloat16", max_batch_tokens=MAX_BATCH_TOKENS)
    _, query, items = _cases()[4]
    single = np.array(_score(server, query, items, mis=False)["scores"])
    multi = np.array(_score(server, query, items, mis=True)["scores"])
    assert np.max(np.abs(multi - single)) <= 0.05 * max(1.0, float(np.max(np.abs(single))))


def test_delimiter_outside_vocabulary_is_refused_at_start(tiny_model: Callable[[str], Path]) -> None:
    from scorekeeper_worker.base.config import WorkerConfig
    from scorekeeper_worker.base.metrics import WorkerMetrics
    from scorekeeper_worker.serving.startup.load import load

    config = WorkerConfig(model=tiny_model("qwen3-cls3"), multi_item_scoring_delimiter=10**6)
    with pytest.raises(ValueError, match="multi-item-scoring-delimiter"):
        load(config, WorkerMetrics())


def test_attention_work_grows_with_items_not_packed_length_squared(tiny_model: Callable[[str], Path]) -> None:
    """Count attention scores the layout asks for: N·I·(Q+I) + Q², never (Q+N·I)²."""
    model = load_model(tiny_model("qwen3-cls3"), DType.FLOAT32, "cpu", "t")
    query_len, item_len, count = 512, 16, 100
    unit = PackUnit(list(range(query_len)), visible_prefix=query_len,
                    items=[[1] * item_len for _ in range(count)], pools=[Pool(range(1), 0)])
    layout = build_inputs([unit], model.device).layout
    scores = sum(b.token_index.numel() * b.token_index.shape[1] for b in layout.context_blocks)
    scores += sum(b.token_index.numel() * (b.token_index.shape[1] + layout.item_contexts.token_index.shape[1])
                  for b in layout.item_blocks)
    assert scores <= count * item_len * (query_len + item_len) + query_len**2
    assert scores < (query_len + count * item_len) ** 2 / 4


def test_packed_batch_equals_sequences_one_by_one(tiny_model: Callable[[str], Path]) -> None:
    from scorekeeper_worker.engine.runner.forward import pooled_rows

    model = load_model(tiny_model("llama-cls3"), DType.FLOAT32, "cpu", "t")
    rng = random.Random(3)
    sequences = _items(rng, 12, (1, 90))
    units = [PackUnit(s, pools=[Pool(range(len(s) - 1, len(s)), i)]) for i, s in enumerate(sequences)]
    with torch.inference_mode():
        packed = pooled_rows(model, build_inputs(units, model.device))
        alone = torch.cat([pooled_rows(model, build_inputs([u], model.device)) for u in units])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
