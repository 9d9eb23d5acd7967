"""What an embedding model must return, computed by sentence-transformers on the same directory: `/v1/embeddings`
vectors and `/v1/score` rows (`model.similarity(query, item)`), each text `SentenceTransformer.encode`d with the
prompt it gets (the request's `prompt_name`, else the model's default), `max_seq_length` and the cut the request asks
for (`truncate`, `truncation_direction`: the tokenizer's own truncation side).

Where `encode` has no equivalent, the sequence is built by the documented rules (docs/api.md "Long inputs") and run
through the SentenceTransformer's own modules (Transformer, Pooling with its prompt_length, Normalize), then cut to
truncate_dim as `encode` cuts it: token-id inputs (verbatim, no prompt) and `max_tokens_per_item`, which cuts the
text's own tokens, after the prompt's (as many as the prompt alone has without special tokens), never the
prompt."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from compare import Outcome, Refused
from subjects import Subject


@dataclass(frozen=True)
class Cut:
    """The request's rules for one input."""

    truncate: bool = False
    direction: str = "right"
    cap: int | None = None  # max_tokens_per_item (items of /v1/score only)


def _keep(ids: list[int], keep: int, direction: str) -> list[int]:
    return ids[:keep] if direction == "right" else ids[max(0, len(ids) - keep):]


def _specials(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one sequence (its post-processor's mask)."""
    encoding = tokenizer("x", return_special_tokens_mask=True)
    mask, ids = encoding["special_tokens_mask"], encoding["input_ids"]
    first = mask.index(0)
    last = len(mask) - mask[::-1].index(0)
    return ids[:first], ids[last:]


def _prompt_length(tokenizer: Any, prompt: str) -> int:
    """sentence-transformers' prompt_length: the prompt alone with specials, less a trailing special token."""
    ids = tokenizer(prompt)["input_ids"]
    return len(ids) - (bool(ids) and ids[-1] in set(tokenizer.all_special_ids))


def _run(subject: Subject, ids: list[int], prompt_length: int) -> torch.Tensor:
    """The SentenceTransformer's modules on one sequence, then truncate_dim."""
    encoder = subject.sentence_transformer
    features: dict[str, Any] = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids),
                                                                                                dtype=torch.long)}
    if prompt_length:
        features["prompt_length"] = prompt_length
    with torch.no_grad():
        vector = encoder(features)["sentence_embedding"][0]
    return vector[:encoder.truncate_dim] if encoder.truncate_dim else vector


@contextmanager
def _truncation_side(tokenizer: Any, direction: str) -> Iterator[None]:
    saved = tokenizer.truncation_side
    tokenizer.truncation_side = direction
    try:
        yield
    finally:
        tokenizer.truncation_side = saved


def _nothing_to_pool(subject: Subject, length: int, prompt_length: int) -> bool:
    """include_prompt false and no token after the prompt: sentence-transformers would pool nothing (a 400)."""
    return not subject.sentence_transformer[1].include_prompt and prompt_length >= length


def embedding(subject: Subject, text: str | list[int], prompt: str, cut: Cut) -> torch.Tensor | Refused:
    encoder, limit = subject.sentence_transformer, subject.max_positions
    tokenizer = encoder.tokenizer
    if isinstance(text, list):  # token ids, verbatim
        ids = _keep(text, cut.cap, cut.direction) if cut.cap is not None else text
        if len(ids) > limit and not cut.truncate:
            return Refused("too long")
        ids = _keep(ids, limit, cut.direction)
        return _run(subject, ids, 0) if ids else Refused("empty sequence")
    prompt_length = _prompt_length(tokenizer, prompt) if prompt else 0
    plain = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
    if cut.cap is not None:  # the text's own tokens, after the prompt's
        own = len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
        plain = plain[:own] + _keep(plain[own:], cut.cap, cut.direction)
    prefix, suffix = _specials(tokenizer)
    room = limit - len(prefix) - len(suffix)
    if len(plain) > room and not cut.truncate:
        return Refused("too long")
    ids = prefix + _keep(plain, room, cut.direction) + suffix
    if not ids:
        return Refused("empty sequence")
    if _nothing_to_pool(subject, len(ids), prompt_length):
        return Refused("nothing left to pool after the prompt")
    if cut.cap is not None:
        return _run(subject, ids, prompt_length)
    with _truncation_side(tokenizer, cut.direction):
        return encoder.encode(text, prompt=prompt, convert_to_tensor=True)


def _prompt(subject: Subject, name: str | None) -> str | Refused:
    encoder = subject.sentence_transformer
    if name is None:
        return encoder.prompts.get(encoder.default_prompt_name or "", "") or ""
    if name not in encoder.prompts:
        return Refused(f"prompt_name {name!r} unknown")
    return encoder.prompts[name] or ""


def embeddings(subject: Subject, body: dict[str, Any]) -> Outcome:
    """A /v1/embeddings body: one vector per input, or the request refused."""
    prompt = _prompt(subject, body.get("prompt_name"))
    if isinstance(prompt, Refused):
        return prompt
    inputs = body["input"]
    inputs = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else inputs
    cut = Cut(body.get("truncate", False), body.get("truncation_direction", "right"))
    vectors = [embedding(subject, text, prompt, cut) for text in inputs]
    refused = next((v for v in vectors if isinstance(v, Refused)), None)
    return refused or [v.tolist() for v in vectors]  # type: ignore[union-attr]


def similarity_rows(subject: Subject, body: dict[str, Any]) -> Outcome:
    """A /v1/score body: [model.similarity(query, item)] per item, both sides with the default prompt."""
    prompt = _prompt(subject, None)
    assert not isinstance(prompt, Refused)
    truncate, direction = body.get("truncate", False), body.get("truncation_direction", "right")
    query = embedding(subject, body["query"], prompt, Cut(truncate, direction))
    items = [embedding(subject, item, prompt, Cut(truncate, direction, body.get("max_tokens_per_item")))
             for item in body["items"]]
    refused = next((v for v in [query, *items] if isinstance(v, Refused)), None)
    if refused is not None:
        return refused
    scores = subject.sentence_transformer.similarity(query[None], torch.stack(items))[0]  # type: ignore[index,arg-type]
    return [[score] for score in scores.tolist()]
