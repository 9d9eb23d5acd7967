"""/v1/score over a real uvicorn server equals plain transformers forwards on the same token ids (float32)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference
from serving import RunningServer
from tiny_models import SPECS, TinyModel

QUERY = "what is the capital of the state"
ITEMS = ["the capital is a city", "bananas are yellow", "", "a much longer item about rivers, mountains and cities"]
RTOL, ATOL = 1e-4, 1e-6


@cache
def _reference(path: Path) -> tuple[Any, Any, str]:
    return reference.load_model(path)


def _expected(path: Path, name: TinyModel, query: str, items: list[str], **options: Any) -> list[list[float]]:
    model, tok, kind = _reference(path)
    return reference.expected_scores(model, tok, kind, query, items, **options)


def _assert_close(actual: list[list[float]], expected: list[list[float]]) -> None:
    np.testing.assert_allclose(np.array(actual), np.array(expected), rtol=RTOL, atol=ATOL)


@pytest.fixture(params=list(TinyModel), ids=str)
def served(request: pytest.FixtureRequest, tiny_model: Callable[[str], Path],
           server_for: Callable[..., RunningServer]) -> tuple[TinyModel, Path, RunningServer]:
    path = tiny_model(request.param)
    return request.param, path, server_for(path)


def _labels(name: TinyModel) -> dict[str, Any]:
    return {"label_token_ids": [5, 17, 42]} if SPECS[name].kind == "causal_lm" else {}


@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize("item_first", [False, True])
def test_text_inputs_match_transformers(served: tuple[TinyModel, Path, RunningServer], apply_softmax: bool,
                                        item_first: bool) -> None:
    name, path, server = served
    items = ITEMS if not item_first or SPECS[name].kind != "embedding" else ITEMS[:2]
    response = server.score(query=QUERY, items=items, apply_softmax=apply_softmax, item_first=item_first,
                            **_labels(name))
    assert response.status_code == 200, response.text
    labels = _labels(name).get("label_token_ids")
    _assert_close(response.json()["scores"], _expected(path, name, QUERY, items, item_first=item_first,
                                                       apply_softmax=apply_softmax, labels=labels))


def test_token_id_inputs_match_transformers(served: tuple[TinyModel, Path, RunningServer]) -> None:
    """Token ids are used verbatim: the expected sequence is exactly query_ids + item_ids."""
    name, path, server = served
    model, _, _ = _reference(path)
    query, items = [7, 8, 9, 10], [[11, 12], [13], [14, 15, 16, 17, 18]]
    response = server.score(query=query, items=items, apply_softmax=True, temperature=0.7, **_labels(name))
    assert response.status_code == 200, response.text
    spec = SPECS[name]
    expected = []
    for item in items:
        if spec.kind == "causal_lm":
            expected.append(reference.causal_lm_scores(model, query + item, [5, 17, 42], True, 0.7))
        elif spec.kind == "embedding":
            expected.append(reference.embedding_scores(model, query, item, reference.sentence_pooling(path)))
        else:
            types = [0] * len(query) + [1] * len(item) if spec.token_types else None
            expected.append(reference.classifier_scores(model, query + item, types, True, 0.7))
    _assert_close(response.json()["scores"], expected)


def test_pooled_hidden_states_match_transformers(served: tuple[TinyModel, Path, RunningServer]) -> None:
    name, path, server = served
    response = server.score(query=QUERY, items=ITEMS, return_pooled_hidden_states=True, **_labels(name))
    if SPECS[name].kind == "causal_lm":
        assert response.status_code == 400
        assert "return_pooled_hidden_states" in response.json()["message"]
        return
    assert response.status_code == 200, response.text
    body = response.json()
    _assert_close(body["pooled_hidden_states"], _expected(path, name, QUERY, ITEMS, pooled=True))
    # Asking for the vectors changes nothing else.
    _assert_close(body["scores"], _expected(path, name, QUERY, ITEMS))


def test_usage_counts_the_tokens_run(served: tuple[TinyModel, Path, RunningServer]) -> None:
    name, path, server = served
    _, tok, _ = _reference(path)
    body = server.score(query=QUERY, items=ITEMS[:2], **_labels(name)).json()
    spec = SPECS[name]
    if spec.kind == "embedding":
        expected = sum(len(reference.encode_single(tok, t)) for t in [QUERY, *ITEMS[:2]])
    elif spec.encoder:
        expected = sum(len(reference.encode_pair(tok, QUERY, t, False)[0]) for t in ITEMS[:2])
    else:
        expected = sum(len(reference.encode_decoder(tok, QUERY, t, False)) for t in ITEMS[:2])
    assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected, "completion_tokens": 0}
