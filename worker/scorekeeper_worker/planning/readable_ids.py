"""Requests whose tokens the model cannot read: ids past its embedding rows (a tokenizer with tokens added without
resizing the embeddings; model/vocabulary.py) are the request's 400, naming the field and the token, before anything
is queued. Without the check such a row fails its forward (IndexError; on CUDA a device-side assert that poisons the
process). Free for the usual model, whose every id has a row (`Vocabulary.complete`): nothing is checked.

The field is found by the token's text: the request text that holds it (the query, an item, the instruction, a
decision's input or question), since a prompt template or a chat template puts the texts anywhere in the rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.vocabulary import Vocabulary


def first_unreadable(rows: Iterable[Sequence[int]], limit: int) -> tuple[int, int] | None:
    """(row index, id) of the first id at or past `limit`, or None."""
    for at, row in enumerate(rows):
        if row and max(row) >= limit:
            return at, next(token for token in row if token >= limit)
    return None


def refusal(model: ScoringModel, vocab: Vocabulary, where: str, token_id: int, limit: int | None = None) -> Invalid:
    text = model.tokenizer.decode([token_id])
    rows = f"{vocab.input_rows} embedding rows" if limit is None or limit == vocab.input_rows else \
        f"{limit} rows (embedding and output)"
    return Invalid(where, f"the text {text!r} is token {vocab.token(token_id)!r} (id {token_id}), past this model's "
                   f"{rows}: the tokenizer has {vocab.tokenizer_ids} ids (tokens added without resizing the "
                   "embeddings), and the model cannot read it; leave that text out")


def field_of(model: ScoringModel, token_id: int, texts: Sequence[tuple[str, str]], fallback: str) -> str:
    """The first (field, text) whose text holds the token (as the tokenizer spells it, or decoded); else `fallback`."""
    spellings = {model.tokenizer.decode([token_id]), str(model.tokenizer.convert_ids_to_tokens(token_id))} - {""}
    for where, text in texts:
        if any(spelling in text for spelling in spellings):
            return where
    return fallback


def check_rows(model: ScoringModel, rows: Sequence[Sequence[int]], row_fields: Sequence[str],
               texts: Sequence[tuple[str, str]], limit: int | None = None) -> None:
    """400 when any row holds an id past the model's rows (`limit`: fewer, e.g. the output rows too)."""
    vocab = model.vocabulary
    if vocab is None:
        return
    bound = vocab.input_rows if limit is None else min(limit, vocab.input_rows)
    if vocab.tokenizer_ids <= bound:  # every id the tokenizer produces has its rows: the usual model, no work
        return
    found = first_unreadable(rows, bound)
    if found is not None:
        at, token_id = found
        raise refusal(model, vocab, field_of(model, token_id, texts, row_fields[at]), token_id, bound)
