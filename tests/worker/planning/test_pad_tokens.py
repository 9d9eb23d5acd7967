"""Pad tokens inside a sequence are read exactly as transformers reads them (issue 22, defects 2 and 5).

- Decoder classifiers and reward models (`*ForSequenceClassification`) read the last token that is not
  `pad_token_id`: with pad = EOS (the usual TRL recipe) the token before an appended EOS, and before any pad token a
  text ends with. In single-item and multi-item mode, and through /v1/rerank.
- XLM-R / RoBERTa number positions from the ids (`create_position_ids_from_input_ids`): a pad token inside the
  text gets `padding_idx` and does not advance the positions after it; cross-encoders and embedding models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import reference
import torch
from engine_runs import one_batch, variant
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import load_model
from serving import RunningServer

RTOL, ATOL = 1e-4, 1e-5
QUERY = "What is the capital of France?"
# The tiny decoders' pad token is <|endoftext|> (id 0) and their EOS <|im_end|> (id 2).
DECODER_ITEMS = [" Paris is the capital.<|endoftext|>", " Berlin<|endoftext|><|endoftext|>", "<|endoftext|>",
                 " a dog<|endoftext|> runs", " no pad at all", ""]


@pytest.fixture(scope="module")
def pad_is_eos(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The EOS-appending tiny Llama classifier with pad_token_id = EOS: every sequence ends with a pad token."""
    return variant(tiny_model("llama-eos-cls3"), tmp_path_factory.mktemp("pad") / "llama-pad-eos", pad_token_id=2)


def _own_forward(path: Path, items: list[str], query: str = QUERY, softmax: bool = False) -> list[list[float]]:
    """transformers' own forward of each joined sequence (its pooling: the last token that is not pad_token_id)."""
    model, tok, _ = reference.load_model(path)
    rows = []
    for item in items:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([reference.encode_decoder(tok, query, item, False)])).logits[0]
        rows.append((torch.softmax(logits.double(), -1) if softmax else logits.double()).tolist())
    return rows


@pytest.mark.parametrize("name", ["qwen2-reward", "qwen3-cls3", "llama-eos-cls3", "gemma2-reward", "pad-is-eos"])
@pytest.mark.parametrize("multi_item", [False, True])
def test_decoder_classifiers_read_the_last_token_that_is_not_pad(name: str, multi_item: bool, pad_is_eos: Path,
                                                                 tiny_model: Callable[[str], Path]) -> None:
    path = pad_is_eos if name == "pad-is-eos" else tiny_model(name)
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    request = ScoreRequest(query=QUERY, items=DECODER_ITEMS)
    other = ScoreRequest(query="Sort a list", items=["<|endoftext|> in Python", " with sorted()"])
    rows, other_rows = one_batch(model, [request, other], multi_item=multi_item, delimiter=3 if multi_item else None)
    np.testing.assert_allclose(rows, _own_forward(path, DECODER_ITEMS), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(other_rows, _own_forward(path, other.item_list, "Sort a list"),  # type: ignore[arg-type]
                               rtol=RTOL, atol=ATOL)


def test_only_pad_tokens_read_token_zero(tiny_model: Callable[[str], Path]) -> None:
    """No token that is not pad: transformers reads position 0 (the arg-max of an all-zero mask)."""
    path = tiny_model("qwen2-reward")
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    request = ScoreRequest(query=[0, 0], items=[[0], [0, 0, 0], [5, 0]])
    hf, _, _ = reference.load_model(path)
    expected = [reference.classifier_scores(hf, [0, 0, *item], None, False) for item in request.items]  # type: ignore[misc]
    for multi_item in (False, True):
        np.testing.assert_allclose(one_batch(model, [request], multi_item=multi_item)[0], expected, rtol=RTOL,
                                   atol=ATOL)


def test_pad_is_eos_over_http_score_and_rerank(pad_is_eos: Path, server_for: Callable[..., RunningServer]) -> None:
    server = server_for(pad_is_eos, multi_item_scoring=True)
    items = DECODER_ITEMS[:3]
    expected = _own_forward(pad_is_eos, items, softmax=True)
    for multi_item in (False, True):
        response = server.score(query=QUERY, items=items, apply_softmax=True, multi_item_scoring=multi_item)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["scores"], expected, rtol=RTOL, atol=ATOL)
    import httpx

    reranked = httpx.post(server.url + "/v1/rerank", json={"query": QUERY, "documents": items}, timeout=60)
    assert reranked.status_code == 200, reranked.text
    relevance = {r["index"]: r["relevance_score"] for r in reranked.json()["results"]}
    np.testing.assert_allclose([relevance[i] for i in range(len(items))], [row[-1] for row in expected], rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("name", ["xlmr-cross", "roberta-cross"])
def test_roberta_cross_encoders_number_positions_around_pad_tokens(name: str,
                                                                   tiny_model: Callable[[str], Path]) -> None:
    path = tiny_model(name)
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    hf, tok, _ = reference.load_model(path)
    query, items = "the <pad> capital of the state", ["a city <pad><pad> in it", "<pad>", "no pad here"]
    rows = one_batch(model, [ScoreRequest(query=query, items=items), ScoreRequest(query="x", items=["y <pad> z"])])
    expected = [reference.classifier_scores(hf, *reference.encode_pair(tok, query, item, False), False)
                for item in items]
    np.testing.assert_allclose(rows[0], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["xlmr-embed", "roberta-embed"])
def test_roberta_embeddings_number_positions_around_pad_tokens(name: str, tiny_model: Callable[[str], Path]) -> None:
    path = tiny_model(name)
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    hf, tok, _ = reference.load_model(path)
    query, items = "the <pad> capital of the state", ["a city <pad><pad> in it", "no pad here"]
    rows = one_batch(model, [ScoreRequest(query=query, items=items)])[0]
    pooling = reference.sentence_pooling(path)
    expected = [reference.embedding_scores(hf, reference.encode_single(tok, query), reference.encode_single(tok, item),
                                           pooling) for item in items]
    np.testing.assert_allclose(rows, expected, rtol=RTOL, atol=ATOL)
