"""What a /v1/score body must return, computed without the engine: the sequences by the documented rules
(docs/api.md "How the model input is built", "Long inputs") with the tokenizer's own `tokenizers` objects, scored by
plain transformers one sequence per forward (class probabilities by transformers' text-classification pipeline), or
by sentence-transformers for an embedding model (expected_sentence.py).

Returns the score rows, or a `Refused` (the body must get a 400)."""

from __future__ import annotations

from typing import Any

import expected_sentence
import reference
import torch
from compare import Outcome, Refused
from subjects import Subject
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


def _cut_text(tokenizer: Any, text: str, keep: int, direction: str) -> str:
    """`text` cut to `keep` of its own tokens, between tokens (docs/api.md "Long inputs"): right, just before the
    first dropped token; left, from the first kept one."""
    starts = [start for start, _ in tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"]]
    if keep >= len(starts):
        return text
    if keep <= 0:
        return ""
    return text[:starts[keep]] if direction == "right" else text[starts[len(starts) - keep]:]


def _shrunk(subject: Subject, text: str, over: int, direction: str, render: Any) -> tuple[list[int], str]:
    """The whole prompt `render(cut text)` and the cut text: cut by as many tokens as the prompt is over the maximum,
    and again while it is still over (the seams tokenize differently), down to no text."""
    tokenizer, limit = subject.tokenizer, subject.max_positions
    keep = len(tokenizer(text, add_special_tokens=False)["input_ids"]) - over
    while True:
        keep = max(0, keep)
        cut = _cut_text(tokenizer, text, keep, direction)
        prompt = list(tokenizer(render(cut))["input_ids"])
        if len(prompt) <= limit or keep == 0:
            return prompt, cut
        keep -= len(prompt) - limit


def _template(subject: Subject, body: dict[str, Any]) -> list[Sequence]:
    """Whole prompts, tokenized whole; long texts cut as text between their own tokens, and the prompt rendered and
    tokenized whole again (docs/api.md "Long inputs": decoders with a prompt template). The query is cut only when
    the prompt with an empty item cannot fit."""
    template, tokenizer, limit = subject.template, subject.tokenizer, subject.max_positions
    assert template is not None
    instruct, direction = body.get("instruct"), body.get("truncation_direction", "right")
    cap, truncate = body.get("max_tokens_per_item"), body.get("truncate", False)
    query = body["query"]
    empty = list(tokenizer(template.render(query, "", instruct))["input_ids"])
    if len(empty) > limit:
        if not truncate:
            raise _TooLong("query with the prompt template")
        prompt, query = _shrunk(subject, query, len(empty) - limit, direction,
                                lambda text: template.render(text, "", instruct))
        if len(prompt) > limit:
            raise _TooLong("the prompt template alone")
    rows: list[Sequence] = []
    for item in body["items"]:
        if cap is not None:
            item = _cut_text(tokenizer, item, cap, direction)
        whole = list(tokenizer(template.render(query, item, instruct))["input_ids"])
        if len(whole) > limit:
            if not truncate:
                raise _TooLong("prompt")
            whole, _ = _shrunk(subject, item, len(whole) - limit, direction,
                               lambda text: template.render(query, text, instruct))
        rows.append((whole, None))
    return rows


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
