"""hypothesis strategies: request bodies for one variant (/v1/score; /v1/embeddings for embedding models, with a
`prompt_name` among the model's prompts or not; /v1/rerank), and batches of them (co-tenants of one packed batch).

Text is drawn from the tokenizers' corpus words with every special token of the tokenizer mixed in (pad, EOS, BOS,
SEP, CLS, ChatML, added tokens), joined with or without spaces (so the tokenizer merges across words), or a few of
them repeated (long texts for little data); token ids from the whole vocabulary. Lengths run up to and past the
model's maximum, so windows are crossed, RoPE thresholds passed, and truncation (or a 400) is due."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from subjects import Subject


def _text(subject: Subject, max_words: int) -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(subject.words), st.sampled_from(subject.specials))
    if subject.unembedded:  # tokens past the embedding rows: often enough that a few examples meet one
        pieces = st.one_of(pieces, st.sampled_from(subject.unembedded))
    separator = st.sampled_from([" ", " ", ""])
    words = st.lists(pieces, max_size=max_words)
    repeated = st.tuples(st.lists(pieces, min_size=1, max_size=3), st.integers(1, max(1, 2 * max_words))).map(
        lambda drawn: drawn[0] * drawn[1])
    return st.tuples(st.one_of(words, words, repeated), separator).map(lambda drawn: drawn[1].join(drawn[0]))


def _ids(subject: Subject, max_length: int) -> st.SearchStrategy[list[int]]:
    return st.integers(0, max_length).flatmap(
        lambda n: st.lists(st.integers(0, subject.vocab_size - 1), min_size=n, max_size=n))


@st.composite
def score_body(draw: st.DrawFn, subject: Subject, multi_item: bool = True, text_only: bool = False) -> dict[str, Any]:
    """One request body; `multi_item`: whether it may ask for multi-item scoring (decoders); `text_only`: no token
    ids."""
    limit, variant = subject.max_positions, subject.variant
    text = subject.template is not None or text_only or draw(st.booleans())
    count = draw(st.integers(1, 5))
    if text:
        query = draw(_text(subject, subject.room // 3))
        items = draw(st.lists(_text(subject, subject.room // 2), min_size=count, max_size=count))
    else:
        query = draw(_ids(subject, limit // 2))
        items = draw(st.lists(_ids(subject, limit), min_size=count, max_size=count))
    body: dict[str, Any] = {"query": query, "items": items}
    if subject.template is not None:
        if draw(st.booleans()):
            body["instruct"] = draw(_text(subject, 6))
    elif variant.kind != "embedding" and draw(st.booleans()):
        body["item_first"] = True
    if draw(st.booleans()):  # behind a prompt template too: texts cut between their own tokens
        body["truncate"] = True
        body["truncation_direction"] = draw(st.sampled_from(["left", "right"]))
    if draw(st.integers(0, 3)) == 0:
        body["max_tokens_per_item"] = draw(st.integers(1, limit))
    if variant.kind != "embedding" and draw(st.integers(0, 3)) == 0:  # a causal LM's is refused (docs/api.md)
        body["return_pooled_hidden_states"] = True
    if variant.kind != "embedding" and draw(st.booleans()):
        body["apply_softmax"] = True
        body["temperature"] = draw(st.sampled_from([1.0, 0.5, 3.0]))
    if variant.kind == "causal_lm" and (subject.engine.default_labels is None or draw(st.booleans())):
        body["label_token_ids"] = draw(st.lists(st.integers(0, subject.logit_size - 1), min_size=1, max_size=4,
                                                unique=True))
    if variant.decoder and multi_item:
        body["multi_item_scoring"] = draw(st.booleans())
    return body


@st.composite
def embedding_body(draw: st.DrawFn, subject: Subject) -> dict[str, Any]:
    """A /v1/embeddings body: texts or token ids, one of the model's prompts (or a name it does not have)."""
    count = draw(st.integers(1, 4))
    if draw(st.booleans()):
        inputs: list[Any] = draw(st.lists(_text(subject, subject.room // 2), min_size=count, max_size=count))
    else:
        inputs = draw(st.lists(_ids(subject, subject.max_positions), min_size=count, max_size=count))
    body: dict[str, Any] = {"input": inputs if count > 1 or draw(st.booleans()) else inputs[0]}
    if draw(st.booleans()):
        body["prompt_name"] = draw(st.sampled_from([*sorted(subject.sentence_transformer.prompts), "search"]))
    if draw(st.booleans()):
        body["truncate"] = True
        body["truncation_direction"] = draw(st.sampled_from(["left", "right"]))
    return body


def request_body(subject: Subject) -> st.SearchStrategy[dict[str, Any]]:
    """A /v1/score body, or for an embedding model also a /v1/embeddings body."""
    if subject.kind != "embedding":
        return score_body(subject)
    return st.one_of(score_body(subject), embedding_body(subject))


@st.composite
def rerank_body(draw: st.DrawFn, subject: Subject) -> dict[str, Any]:
    """A /v1/rerank body: texts (documents as strings or {"text", "id"} objects), top_n, long documents cut by
    max_tokens_per_doc and truncate, or refused."""
    score = draw(score_body(subject, multi_item=False, text_only=True))
    documents = [text if draw(st.booleans()) else {"text": text, "id": f"doc-{i}"}
                 for i, text in enumerate(score["items"])]
    body: dict[str, Any] = {"query": score["query"], "documents": documents}
    for key, renamed in [("truncate", "truncate"), ("truncation_direction", "truncation_direction"),
                         ("max_tokens_per_item", "max_tokens_per_doc")]:
        if key in score:
            body[renamed] = score[key]
    if draw(st.booleans()):
        body["top_n"] = draw(st.integers(1, len(documents) + 1))
    if draw(st.booleans()):
        body["return_documents"] = True
    return body


def batches(subject: Subject, min_size: int = 1) -> st.SearchStrategy[list[dict[str, Any]]]:
    """`min_size` to four requests scored in one packed batch."""
    return st.lists(request_body(subject), min_size=min_size, max_size=4)


def delimiters(subject: Subject) -> st.SearchStrategy[int | None]:
    """--multi-item-scoring-delimiter: none, a special token, or any token."""
    specials = sorted(subject.tokenizer.all_special_ids)
    return st.one_of(st.none(), st.sampled_from(specials), st.integers(0, subject.vocab_size - 1))
