"""Long inputs (spec "Long inputs"): `truncate`, `truncation_direction`, `max_tokens_per_item` / `max_tokens_per_doc`
and /v1/rerank's `long_document_strategy: "chunk"`. References are independent of the server: the tokenizer's own
truncation (`truncation="only_second"`, `truncation_side`) for cross-encoders and embedding models, ids assembled
by hand for decoders, the documented text cut for prompt templates; each sequence then through plain transformers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
from scorekeeper_worker.model.templates.prompt_template import BUILTIN
from serving import RunningServer
from tiny_models import SPECS, TinyModel

QUERY = "what is the capital of france?"
SENTENCE = " the capital is Paris and the dog likes to run in the park."
SHORT = " Paris is the capital of France."
ENCODER_LIMIT, DECODER_LIMIT = 512, 2048
DIRECTIONS = ["right", "left"]


def _post(server: RunningServer, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = httpx.post(server.url + path, json=body, timeout=300)
    assert response.status_code == status, response.text
    return response.json()


def _cut(ids: list[int], keep: int, direction: str) -> list[int]:
    return ids[:keep] if direction == "right" else ids[len(ids) - keep:]


def _pair_scores(model: Any, tok: Any, items: list[str], direction: str, max_length: int | None) -> list[float]:
    """The tokenizer's own pair truncation: only the item (second segment) is cut."""
    tok.truncation_side = direction
    try:
        rows = []
        for item in items:
            encoded = tok([QUERY], [item], truncation="only_second" if max_length else False, max_length=max_length)
            rows.append(reference.classifier_scores(model, encoded["input_ids"][0], encoded["token_type_ids"][0],
                                                    apply_softmax=True))
        return rows
    finally:
        tok.truncation_side = "right"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_cross_encoder_pairs_keep_the_query_and_cut_the_item(cross: tuple[RunningServer, Any, Any],
                                                             direction: str) -> None:
    server, model, tok = cross
    items = [SENTENCE * 45, SHORT, SENTENCE * 20]  # 630 tokens, a few, 280
    assert len(tok(items[0])["input_ids"]) > ENCODER_LIMIT
    got = server.score(query=QUERY, items=items, apply_softmax=True, truncate=True, truncation_direction=direction)
    assert got.status_code == 200, got.text
    np.testing.assert_allclose(got.json()["scores"], _pair_scores(model, tok, items, direction, ENCODER_LIMIT),
                               rtol=1e-4, atol=1e-6)
    assert got.json()["usage"]["prompt_tokens"] == ENCODER_LIMIT + sum(
        len(tok([QUERY], [item])["input_ids"][0]) for item in items[1:])
    query_tokens = len(tok(QUERY, add_special_tokens=False)["input_ids"])
    capped = server.score(query=QUERY, items=items, apply_softmax=True, max_tokens_per_item=50,
                          truncation_direction=direction)  # no `truncate` needed: the cap makes every pair fit
    assert capped.status_code == 200, capped.text
    np.testing.assert_allclose(capped.json()["scores"],
                               _pair_scores(model, tok, items, direction, 3 + query_tokens + 50), rtol=1e-4, atol=1e-6)


def test_without_truncate_a_long_item_is_a_400_naming_it(cross: tuple[RunningServer, Any, Any]) -> None:
    server, _, _ = cross
    error = _post(server, "/v1/score", {"query": QUERY, "items": [SHORT, SENTENCE * 45]}, 400)
    assert error["message"].startswith("items[1]: sequence of ") and "maximum of 512" in error["message"]
    assert '"truncate": true' in error["message"]
    error = _post(server, "/v1/rerank", {"query": QUERY, "documents": [SENTENCE * 45]}, 400)
    assert error["message"].startswith("documents[0]: sequence of ")


def test_the_query_is_cut_only_when_it_alone_cannot_fit(cross: tuple[RunningServer, Any, Any]) -> None:
    server, model, tok = cross
    query = SENTENCE * 45
    query_ids = tok(query, add_special_tokens=False)["input_ids"]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    error = _post(server, "/v1/score", {"query": query, "items": [SHORT]}, 400)
    assert error["message"].startswith("query: sequence of ")
    got = _post(server, "/v1/score", {"query": query, "items": [SHORT], "truncate": True, "apply_softmax": True})
    ids = [cls, *query_ids[:ENCODER_LIMIT - 3], sep, sep]  # no room is left for the item
    expected = reference.classifier_scores(model, ids, [0] * (ENCODER_LIMIT - 1) + [1], apply_softmax=True)
    np.testing.assert_allclose(got["scores"], [expected], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_embedding_models_cut_each_text_alone(tiny_model: Callable[[str], Path],
                                              server_for: Callable[..., RunningServer], direction: str) -> None:
    path = tiny_model("bert-embed")
    model, tok, _ = reference.load_model(path)
    server = server_for(path)
    tok.truncation_side = direction
    query, items = SENTENCE * 40, [SENTENCE * 45, SHORT]
    got = _post(server, "/v1/score", {"query": query, "items": items, "truncate": True,
                                      "truncation_direction": direction})
    ids = [tok(text, truncation=True, max_length=ENCODER_LIMIT)["input_ids"] for text in (query, *items)]
    expected = [reference.embedding_scores(model, ids[0], item_ids) for item_ids in ids[1:]]
    np.testing.assert_allclose(got["scores"], expected, rtol=1e-4, atol=1e-6)


def _decoder_ids(name: str, tok: Any, query: list[int], item: list[int]) -> list[int]:
    spec = SPECS[TinyModel(name)]
    return [tok.bos_token_id] * spec.adds_bos + query + item + [tok.eos_token_id] * spec.adds_eos


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", ["llama-causal", "llama-eos-cls3"])
def test_decoders_cut_the_item_single_and_multi_item(tiny_model: Callable[[str], Path],
                                                     server_for: Callable[..., RunningServer], name: str,
                                                     direction: str) -> None:
    path = tiny_model(name)
    model, tok, kind = reference.load_model(path)
    server = server_for(path, max_batch_tokens=4096)
    items = [SENTENCE * 80, SHORT, SENTENCE * 10]  # ~2300 tokens: over the 2048 positions
    query_ids = tok(QUERY, add_special_tokens=False)["input_ids"]
    item_ids = [tok(item, add_special_tokens=False)["input_ids"] for item in items]
    specials = SPECS[TinyModel(name)].adds_bos + SPECS[TinyModel(name)].adds_eos
    labels = [5, 17]
    for cap in (None, 40):
        room = cap if cap is not None else DECODER_LIMIT - specials - len(query_ids)
        sequences = [_decoder_ids(name, tok, query_ids, _cut(ids, room, direction)) for ids in item_ids]
        if kind == "causal_lm":
            expected = [reference.causal_lm_scores(model, ids, labels, True) for ids in sequences]
        else:
            expected = [reference.classifier_scores(model, ids, None, True) for ids in sequences]
        for multi_item in (False, True):
            body = {"query": QUERY, "items": items, "label_token_ids": labels, "apply_softmax": True,
                    "truncate": cap is None, "max_tokens_per_item": cap, "truncation_direction": direction,
                    "multi_item_scoring": multi_item}
            got = _post(server, "/v1/score", body)
            np.testing.assert_allclose(got["scores"], expected, rtol=1e-4, atol=1e-6, err_msg=f"{cap} {multi_item}")
            if not multi_item:
                assert got["usage"]["prompt_tokens"] == sum(len(ids) for ids in sequences)


@pytest.fixture(scope="module")
def reranker(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> tuple[RunningServer,
                                                                                                  Any, Any]:
    path = tiny_model("qwen3-reranker")
    model, tok, _ = reference.load_model(path)
    return server_for(path, prompt_template="qwen3-reranker", multi_item_scoring=True, max_batch_tokens=4096), \
        model, tok


def _relevance(model: Any, tok: Any, item_text: str) -> float:
    prompt = tok(BUILTIN["qwen3-reranker"].render(QUERY, item_text, None))["input_ids"]
    assert len(prompt) <= DECODER_LIMIT
    return reference.causal_lm_scores(model, prompt, tok.convert_tokens_to_ids(["yes", "no"]), True)[0]


def _text_cut(tok: Any, text: str, start: int, end: int) -> str:
    """The documented rule: the text from the start of token `start` to the start of token `end`."""
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    begin = 0 if start == 0 else offsets[start][0]
    return text[begin:offsets[end][0] if end < len(offsets) else len(text)]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_template_items_are_cut_as_text_and_the_prompt_tokenized_whole(reranker: tuple[RunningServer, Any, Any],
                                                                       direction: str) -> None:
    server, model, tok = reranker
    document = "Paris" + SENTENCE * 150  # ~2100 tokens
    n = len(tok(document, add_special_tokens=False)["input_ids"])
    keep = 37
    start, end = (0, keep) if direction == "right" else (n - keep, n)
    capped = _post(server, "/v1/rerank", {"query": QUERY, "documents": [document, SHORT], "max_tokens_per_doc": keep,
                                          "truncation_direction": direction})
    scores = {r["index"]: r["relevance_score"] for r in capped["results"]}
    np.testing.assert_allclose([scores[0], scores[1]],
                               [_relevance(model, tok, _text_cut(tok, document, start, end)),
                                _relevance(model, tok, SHORT)], rtol=1e-4)
    fitted = _post(server, "/v1/rerank", {"query": QUERY, "documents": [document], "truncate": True,
                                          "truncation_direction": direction})
    fits = next(k for k in range(n, 0, -1) if len(tok(BUILTIN["qwen3-reranker"].render(QUERY, _text_cut(
        tok, document, *((0, k) if direction == "right" else (n - k, n))), None))["input_ids"]) <= DECODER_LIMIT)
    cut = _text_cut(tok, document, *((0, fits) if direction == "right" else (n - fits, n)))
    np.testing.assert_allclose(fitted["results"][0]["relevance_score"], _relevance(model, tok, cut), rtol=1e-4)
    assert fitted["usage"]["prompt_tokens"] <= DECODER_LIMIT


def _windows(n: int, size: int, count: int, direction: str) -> list[tuple[int, int]]:
    if direction == "right":
        return [(a, min(a + size, n)) for a in range(0, n, size)][:count]
    return [(max(0, b - size), b) for b in range(n, 0, -size)][:count][::-1]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_chunked_documents_score_their_best_window(cross: tuple[RunningServer, Any, Any], direction: str) -> None:
    """Cross-encoder: the windows fit beside the query; relevance is the maximum of the windows scored by hand."""
    server, model, tok = cross
    documents = [SENTENCE * 80 + " paris is the capital of france", SHORT]  # ~1130 tokens: 3 windows
    query_ids = tok(QUERY, add_special_tokens=False)["input_ids"]
    room = ENCODER_LIMIT - 3 - len(query_ids)
    for max_chunks in (8, 2):
        got = _post(server, "/v1/rerank", {"query": QUERY, "documents": documents, "truncation_direction": direction,
                                           "long_document_strategy": "chunk", "max_chunks_per_doc": max_chunks})
        ids = tok(documents[0], add_special_tokens=False)["input_ids"]
        windows = [ids[a:b] for a, b in _windows(len(ids), room, max_chunks, direction)]
        assert len(windows) == min(3, max_chunks)
        by_hand = [reference.classifier_scores(
            model, [tok.cls_token_id, *query_ids, tok.sep_token_id, *w, tok.sep_token_id],
            [0] * (len(query_ids) + 2) + [1] * (len(w) + 1), apply_softmax=True)[0] for w in windows]
        scores = {r["index"]: r["relevance_score"] for r in got["results"]}
        np.testing.assert_allclose(scores[0], max(by_hand), rtol=1e-4)
        short = len(tok([QUERY], [SHORT])["input_ids"][0])
        assert got["usage"]["prompt_tokens"] == sum(len(query_ids) + 3 + len(w) for w in windows) + short


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_chunked_template_documents_single_and_multi_item(reranker: tuple[RunningServer, Any, Any],
                                                          tiny_model: Callable[[str], Path],
                                                          server_for: Callable[..., RunningServer],
                                                          direction: str) -> None:
    server, model, tok = reranker
    single = server_for(tiny_model("qwen3-reranker"), prompt_template="qwen3-reranker", max_batch_tokens=4096)
    document = "Paris" + SENTENCE * 300  # ~4200 tokens: 3 windows
    n = len(tok(document, add_special_tokens=False)["input_ids"])
    size = DECODER_LIMIT - len(tok(BUILTIN["qwen3-reranker"].render(QUERY, "", None))["input_ids"])
    windows = _windows(n, size, 2, direction)
    by_hand = max(_relevance(model, tok, _text_cut(tok, document, a, b)) for a, b in windows)
    body = {"query": QUERY, "documents": [SHORT, document], "long_document_strategy": "chunk",
            "max_chunks_per_doc": 2, "truncation_direction": direction}
    for mode in (server, single):  # multi-item (the windows share the prompt's prefix) and single-item
        got = _post(mode, "/v1/rerank", body)
        scores = {r["index"]: r["relevance_score"] for r in got["results"]}
        np.testing.assert_allclose([scores[1], scores[0]], [by_hand, _relevance(model, tok, SHORT)], rtol=1e-4)


def test_admission_counts_every_window(tiny_model: Callable[[str], Path],
                                       server_for: Callable[..., RunningServer]) -> None:
    server = server_for(tiny_model("bert-cross"), max_request_tokens=1200)
    document = SENTENCE * 90  # ~1260 tokens: cut to one 512-token pair it fits the limit, its 3 windows do not
    body = {"query": QUERY, "documents": [document], "truncate": True}
    assert _post(server, "/v1/rerank", body)["usage"]["prompt_tokens"] == ENCODER_LIMIT
    error = _post(server, "/v1/rerank", {**body, "long_document_strategy": "chunk"}, 413)
    assert error["message"].startswith("documents: the request would run ") and "--max-request-tokens" in \
        error["message"]
