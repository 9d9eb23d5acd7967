"""What a /v1/score body must return, computed without the engine: the sequences by the documented rules
(docs/api.md "How the model input is built", "Long inputs") with the tokenizer's own `tokenizers` objects, scored by
plain transformers one sequence per forward (class probabilities by transformers' text-classification pipeline), or
by sentence-transformers for an embedding model (expected_sentence.py).

Returns the score rows, or a `Refused` (the body must get a 400)."""

from __future__ import annotations

from typing import Any

import reference
import torch
from conformance import expected_sentence
from conformance.compare import Outcome, Refused
from conformance.subjects import Subject
from tokenizers import Encoding

Sequence = tuple[list[int], list[int] | None]  # ids, token types


class _TooLong(Exception):
    pass


def _query_keep(body: dict[str, Any], length: int, overhead: int, limit: int) -> int:
    """Query tokens kept: all, or (truncate) what fits beside the specials; the query alone too long is a 400."""
    if length + overhead <= limit:
        return length
    if not body.get("truncate"):
        raise _TooLong("query")
    return max(0, limit - overhead)


def _item_keep(body: dict[str, Any], length: int, room: int) -> int:
    """Item tokens kept: cut to max_tokens_per_item first, then to the room beside the rest (truncate) or a 400."""
    cap = body.get("max_tokens_per_item")
    length = min(length, cap) if cap is not None else length
    if length > room and not body.get("truncate"):
        raise _TooLong("item")
    return min(length, max(0, room))


def _cut(ids: list[int], keep: int, direction: str) -> list[int]:
    return ids[:keep] if direction == "right" else ids[len(ids) - keep:]


def _cut_encoding(encoding: Encoding, keep: int, direction: str) -> Encoding:
    if len(encoding.ids) > keep:
        encoding.truncate(keep, direction=direction)
    return encoding


def _token_ids(subject: Subject, body: dict[str, Any]) -> list[Sequence]:
    """Token ids are verbatim: no specials, cut at token level."""
    query, items, direction = body["query"], body["items"], body.get("truncation_direction", "right")
    limit = subject.max_positions
    query = _cut(query, _query_keep(body, len(query), 0, limit), direction)
    out: list[Sequence] = []
    for item in items:
        item = _cut(item, _item_keep(body, len(item), limit - len(query)), direction)
        first, second = (item, query) if body.get("item_first") else (query, item)
        types = [0] * len(first) + [1] * len(second) if _token_types(subject) else None
        out.append((first + second, types))
    return out


def _text(subject: Subject, body: dict[str, Any]) -> list[Sequence]:
    query, items, direction = body["query"], body["items"], body.get("truncation_direction", "right")
    limit, backend = subject.max_positions, subject.tokenizer.backend_tokenizer
    processor = backend.post_processor
    pair = subject.variant.cross_encoder

    def special(*encodings: Encoding) -> Encoding:
        return processor.process(*encodings) if processor is not None else Encoding.merge(list(encodings))

    overhead = processor.num_special_tokens_to_add(pair) if processor is not None else 0
    query_encoding = backend.encode(query, add_special_tokens=False)
    query_encoding = _cut_encoding(query_encoding, _query_keep(body, len(query_encoding.ids), overhead, limit),
                                   direction)
    room = limit - overhead - len(query_encoding.ids)
    out: list[Sequence] = []
    for item in items:
        encoding = backend.encode(item, add_special_tokens=False)
        encoding = _cut_encoding(encoding, _item_keep(body, len(encoding.ids), room), direction)
        first, second = (encoding, query_encoding) if body.get("item_first") else (query_encoding, encoding)
        if pair:
            joined = special(first, second)
            out.append((joined.ids, joined.type_ids if _token_types(subject) else None))
        else:  # decoders: the single-sequence template around the joined tokens
            out.append((special(Encoding.merge([first, second])).ids, None))
    return out


def _template(subject: Subject, body: dict[str, Any]) -> list[Sequence]:
    """Whole prompts, tokenized whole."""
    assert subject.template is not None
    rows = [list(subject.tokenizer(subject.template.render(body["query"], item, body.get("instruct")))["input_ids"])
            for item in body["items"]]
    if any(len(row) > subject.max_positions for row in rows):
        raise _TooLong("prompt")
    return [(row, None) for row in rows]


def _token_types(subject: Subject) -> bool:
    return subject.variant.cross_encoder and getattr(subject.hf.config, "type_vocab_size", 0) > 1


def _probabilities(subject: Subject, logits: list[float], temperature: float) -> list[float]:
    """transformers' text-classification pipeline on logits / temperature: softmax over classes, or a sigmoid per
    class for a single logit and for multi_label_classification; in the model's label order."""
    pipeline = subject.pipeline
    scores = pipeline.postprocess({"logits": torch.tensor([logits]) / temperature}, top_k=None)
    by_label = {score["label"]: score["score"] for score in scores}
    return [by_label[pipeline.model.config.id2label[i]] for i in range(len(logits))]


def expected(subject: Subject, body: dict[str, Any]) -> Outcome:
    """A /v1/score body's rows, or a /v1/embeddings body's vectors (it has `input`)."""
    if "input" in body:
        return expected_sentence.embeddings(subject, body)
    if subject.kind == "embedding":
        return expected_sentence.similarity_rows(subject, body)
    try:
        if isinstance(body["query"], list):
            sequences = _token_ids(subject, body)
        elif subject.template is not None:
            sequences = _template(subject, body)
        else:
            sequences = _text(subject, body)
    except _TooLong as error:
        return Refused(f"too long: {error}")
    if any(not ids for ids, _ in sequences):
        return Refused("empty sequence")
    if any(token >= subject.vocab_size for ids, _ in sequences for token in ids):  # transformers cannot read it
        return Refused("a token past the embedding rows")
    softmax, temperature = body.get("apply_softmax", False), body.get("temperature", 1.0)
    if subject.kind == "causal_lm":
        if body.get("return_pooled_hidden_states"):
            return Refused("return_pooled_hidden_states on a causal LM")
        labels = body.get("label_token_ids") or subject.engine.default_labels
        if softmax and len(labels) == 1:  # every item would score 1.0: docs/api.md says this is refused
            return Refused("a single label token under apply_softmax")
        return [reference.causal_lm_scores(subject.hf, ids, labels, softmax, temperature) for ids, _ in sequences]
    logits = [reference.classifier_scores(subject.hf, ids, types, False) for ids, types in sequences]
    rows = [_probabilities(subject, row, temperature) for row in logits] if softmax else logits
    if body.get("return_pooled_hidden_states"):  # each row, then the hidden state the head read
        rows = [row + reference.classifier_pooled(subject.hf, ids, types)
                for row, (ids, types) in zip(rows, sequences, strict=True)]
    return rows
