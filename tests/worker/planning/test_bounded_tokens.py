"""Truncation-aware tokenization (planning/bounded_tokens.py): a long text tokenized only as far as a request can use
gives exactly the ids of tokenizing the whole text and then cutting, in both directions, for WordPiece, byte-level BPE
and SentencePiece (Unigram and byte-fallback BPE) tokenizers, tiny and real; and it reads a bounded part of the text.
Through the server: a 400,000-character document scores as the tokenizer's own truncation of it, and without
`truncate` it is refused as too long."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import reference
import tiny_tokenizers
from scorekeeper_worker.planning.bounded_tokens import bounded_ids
from serving import RunningServer

DOCUMENT_CHARS = 500_000
NEEDS = [1, 17, 513, 4097]


def _document(seed: int, chars: int = DOCUMENT_CHARS) -> str:
    """Everyday text from the zoo's corpus with what makes tokenizers differ: newlines, runs of spaces, accents,
    emoji, digits, punctuation, and words of 300 letters with no space."""
    rng = random.Random(seed)
    lines = tiny_tokenizers.corpus()
    parts: list[str] = []
    size = 0
    while size < chars:
        choice = rng.random()
        part = rng.choice(lines) if choice < 0.9 else "x" * 300 if choice < 0.92 else rng.choice(["\n\n", "   ", "\t"])
        parts.append(part + rng.choice([" ", " ", "\n", ""]))
        size += len(parts[-1])
    return "".join(parts)[:chars]


def _real_minilm() -> Any:
    from scorekeeper_worker.model.files import minilm_path
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


def _real_smollm2() -> Any:
    from scorekeeper_worker.model.files import fix_gguf_tokenizer, gguf_tokenizer_metadata, smollm2_gguf_path
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return fix_gguf_tokenizer(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
                              gguf_tokenizer_metadata(path))


TOKENIZERS: dict[str, Callable[[], Any]] = {
    "wordpiece-bert": lambda: tiny_tokenizers.wordpiece(roberta_style=False),
    "wordpiece-minilm-real": _real_minilm,
    "bpe-bytelevel-qwen": lambda: tiny_tokenizers.byte_bpe(None),
    "bpe-bytelevel-modernbert": tiny_tokenizers.modernbert_bpe,
    "bpe-smollm2-real": _real_smollm2,
    "sentencepiece-unigram": lambda: tiny_tokenizers.sentencepiece("unigram"),
    "sentencepiece-bpe-llama": lambda: tiny_tokenizers.sentencepiece("bpe"),
}


@functools.cache
def _tokenizer(name: str) -> Any:
    return TOKENIZERS[name]()


@functools.cache
def _whole(name: str, text: str) -> list[int]:
    return list(_tokenizer(name)(text, add_special_tokens=False)["input_ids"])


def _cut(ids: list[int], need: int, from_end: bool) -> list[int]:
    return ids[len(ids) - need:] if from_end and len(ids) > need else ids[:need]


@pytest.mark.parametrize("from_end", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_bounded_ids_equal_the_whole_text_cut(name: str, from_end: bool) -> None:
    tokenizer = _tokenizer(name)
    texts = [_document(1), _document(2, 9_000), _document(3, 40)]
    # A text whose kept end is one 20,000-letter word: no whitespace near it, so the window must grow to the whole.
    texts.append("y" * 20_000 + " " + _document(4, 30_000) if from_end else _document(4, 30_000) + " " + "y" * 20_000)
    texts.append(texts[-1][::-1])
    for need in NEEDS:
        got = bounded_ids(tokenizer, texts, [need] * len(texts), from_end)
        for text, clipped in zip(texts, got, strict=True):
            whole = _whole(name, text)
            assert clipped.ids == _cut(whole, need, from_end), (len(text), need)
            assert clipped.clipped == (len(whole) > need)


class _Counting:
    """A tokenizer that counts the characters it is given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.chars = tokenizer, 0

    def __call__(self, texts: str | list[str], **kwargs: Any) -> Any:
        self.chars += len(texts) if isinstance(texts, str) else sum(len(t) for t in texts)
        return self.tokenizer(texts, **kwargs)


@pytest.mark.parametrize("from_end", [False, True], ids=["right", "left"])
def test_a_long_document_is_read_only_near_the_end_it_keeps(from_end: bool) -> None:
    counting = _Counting(_tokenizer("wordpiece-minilm-real"))
    got = bounded_ids(counting, [_document(1)], [513], from_end)  # type: ignore[arg-type]
    assert got[0].clipped and len(got[0].ids) == 513
    assert counting.chars < 20_000  # of 500,000 (the first window and the longer one that must agree)


LONG_DOCUMENT = _document(5, 400_000)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_huge_document_scores_as_the_tokenizers_own_truncation(cross: tuple[RunningServer, Any, Any],
                                                                  direction: str) -> None:
    server, model, tok = cross
    query = "what is the capital of france?"
    got = server.score(query=query, items=[LONG_DOCUMENT, "Paris."], truncate=True, truncation_direction=direction,
                       apply_softmax=True)
    assert got.status_code == 200, got.text
    tok.truncation_side = direction
    try:
        encoded = [tok([query], [item], truncation="only_second", max_length=512)
                   for item in (LONG_DOCUMENT, "Paris.")]
    finally:
        tok.truncation_side = "right"
    expected = [reference.classifier_scores(model, e["input_ids"][0], e["token_type_ids"][0], apply_softmax=True)
                for e in encoded]
    np.testing.assert_allclose(got.json()["scores"], expected, rtol=1e-4, atol=1e-6)
    assert got.json()["usage"]["prompt_tokens"] == 512 + len(encoded[1]["input_ids"][0])


def test_a_huge_document_without_truncate_is_refused_as_too_long(cross: tuple[RunningServer, Any, Any]) -> None:
    server, _, _ = cross
    response = httpx.post(server.url + "/v1/rerank", json={"query": "capital", "documents": ["Paris.", LONG_DOCUMENT]},
                          timeout=120)
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert message.startswith("documents[1]: sequence of more than ") and "maximum of 512" in message, message


def test_embedding_inputs_are_bounded_too(tiny_model: Callable[[str], Path],
                                          server_for: Callable[..., RunningServer]) -> None:
    path = tiny_model("bert-embed")
    server = server_for(path)
    response = httpx.post(server.url + "/v1/embeddings", json={"input": [LONG_DOCUMENT], "model": "m"}, timeout=120)
    assert response.status_code == 400, response.text
    assert response.json()["message"].startswith("input[0]: sequence of more than ")


def test_a_huge_item_is_counted_with_a_bound_before_the_request_limit(cross: tuple[RunningServer, Any, Any]) -> None:
    """The early --max-request-tokens count (planning/planner.refuse_early) reads a 2 MB item no further than the
    bounded tokenizer does, and the item is refused for what it is: longer than the model's maximum."""
    server, _, _ = cross
    model = server.app.state.service.model
    counting = _Counting(model.tokenizer)
    model.tokenizer = counting
    try:
        response = server.score(query="capital", items=[_document(6, 2_000_000)])
        assert response.status_code == 400, response.text
        assert response.json()["message"].startswith("items[0]: sequence of more than ")
        assert counting.chars < 100_000
    finally:
        model.tokenizer = counting.tokenizer
