"""Special tokens sit where the tokenizer puts them for the JOINED query + item sequence: BOS before the query and,
for tokenizers that append one, EOS after the item, where the score is read (spec "Score semantics", SGLang)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import reference
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.model.templates.special_tokens import special_tokens
from scorekeeper_worker.planning.planner import tokenize
from serving import RunningServer
from transformers import AutoTokenizer

EOS_MODEL = "llama-eos-cls3"
QUERY = "What is the capital of France?"
# Items that start with a space: the joined text splits exactly at the boundary, so `tokenizer(query + item)`, the
# tokenizer's own encoding of the joined string with its specials, is an independent reference.
ITEMS = [" Paris is the capital of France.", " Berlin", " no", " the dog likes to run in the park."]


@pytest.mark.parametrize(("name", "prefix", "suffix"), [
    ("qwen3-cls3", [], []), ("llama-cls3", ["<|begin_of_text|>"], []),
    (EOS_MODEL, ["<|begin_of_text|>"], ["<|im_end|>"]), ("bert-cross", ["[CLS]"], ["[SEP]"]),
])
def test_special_tokens_around_one_sequence(name: str, prefix: list[str], suffix: list[str],
                                            tiny_model: Callable[[str], Path]) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model(name))
    specials = special_tokens(tok)
    assert (specials.prefix, specials.suffix) == (tok.convert_tokens_to_ids(prefix), tok.convert_tokens_to_ids(suffix))


def test_eos_ends_the_joined_sequence(tiny_model: Callable[[str], Path]) -> None:
    """It used to land between query and item, with the score read at the item's last token."""
    model = load_model(tiny_model(EOS_MODEL), DType.FLOAT32, "cpu", "t")
    tok = model.tokenizer
    bos, eos = tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|im_end|>"])
    tokens = tokenize(model, ScoreRequest(query=QUERY, items=ITEMS).ask())
    for item, item_ids in zip(ITEMS, tokens.items, strict=True):
        assert tokens.query + item_ids == tok(QUERY + item)["input_ids"]
        assert tokens.query[0] == bos and tokens.query.count(eos) == 0 and item_ids[-1] == eos
    flipped = tokenize(model, ScoreRequest(query=QUERY, items=ITEMS, item_first=True).ask())  # item + query
    assert flipped.query == tok(QUERY, add_special_tokens=False)["input_ids"] + [eos]
    for item, item_ids in zip(ITEMS, flipped.items, strict=True):
        assert item_ids == [bos] + tok(item, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("multi_item", [False, True], ids=["single-item", "multi-item"])
def test_eos_tokenizer_scores_equal_transformers_on_the_joined_text(
        multi_item: bool, tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> None:
    path = tiny_model(EOS_MODEL)
    model, tok, _ = reference.load_model(path)
    server = server_for(path, multi_item_scoring=True)
    response = server.score(query=QUERY, items=ITEMS, multi_item_scoring=multi_item)
    assert response.status_code == 200, response.text
    expected = [reference.classifier_scores(model, tok(QUERY + item)["input_ids"], None, apply_softmax=False)
                for item in ITEMS]
    np.testing.assert_allclose(response.json()["scores"], expected, rtol=1e-4, atol=1e-6)
    # usage: the query and its BOS once per item (single) or once (multi), and each item with its EOS
    query_tokens, item_tokens = len(tok(QUERY, add_special_tokens=False)["input_ids"]) + 1, [
        len(tok(item, add_special_tokens=False)["input_ids"]) + 1 for item in ITEMS]
    used = query_tokens + sum(item_tokens) if multi_item else sum(query_tokens + n for n in item_tokens)
    assert response.json()["usage"]["prompt_tokens"] == used


def test_empty_item_is_scored_at_the_eos(tiny_model: Callable[[str], Path],
                                         server_for: Callable[..., RunningServer]) -> None:
    """With an EOS-appending tokenizer an empty item still has a token of its own: the EOS after the query."""
    path = tiny_model(EOS_MODEL)
    model, tok, _ = reference.load_model(path)
    server = server_for(path, multi_item_scoring=True)
    for multi_item in (False, True):
        scores = server.score(query=QUERY, items=["", " no"], multi_item_scoring=multi_item).json()["scores"]
        expected = reference.classifier_scores(model, tok(QUERY)["input_ids"], None, apply_softmax=False)
        np.testing.assert_allclose(scores[0], expected, rtol=1e-4, atol=1e-6)
