"""Validated request → the token sequences to score (pure, CPU): texts tokenized, specials placed where the tokenizer
puts them, and long inputs cut or split by the request's rules (spec "Long inputs").

Query and items are tokenized separately and joined at token level (spec "Score semantics"), which is what makes
multi-item scores equal single-item scores. Long inputs are cut on the plain tokens, before the specials are
placed, so a special token is never cut: an item is cut to `max_tokens_per_item`, then, if query + item + specials
still exceed the model's maximum, cut to fit (`truncate`) or split into consecutive windows that each fit beside
the query (`chunk`, /v1/rerank); the query is cut only when it alone cannot fit. Decoders with a prompt template
render and tokenize whole prompts instead (planning/template_encoding.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.model.templates.special_tokens import BARE_PAIR, PairLayout
from scorekeeper_worker.planning.bounded_tokens import Clipped, bounded_ids


class Direction(StrEnum):
    LEFT = "left"
    RIGHT = "right"


@dataclass(frozen=True)
class LengthRules:
    """How a request's long inputs are handled; `field` names its items in messages ("items", "documents")."""

    truncate: bool = False
    direction: Direction = Direction.RIGHT
    max_item_tokens: int | None = None
    chunk: bool = False
    max_chunks: int = 8
    field: str = "items"


@dataclass
class Tokenized:
    """Decoders: `query` holds the tokens every item follows (specials, template prefix), `items` the rest of each
    sequence. Embedding models: each sequence whole. Cross-encoders: plain tokens, joined by `pair`. `rows_of[r]` is
    the request item behind `items[r]` (a chunked document has one row per window)."""

    query: list[int]
    items: list[list[int]]
    rows_of: list[int]
    field: str = "items"
    pair: PairLayout | None = None
    pool_from: int = 0  # embedding models: the leading tokens pooling skips (a prompt with include_prompt false)


def cut(ids: list[int], keep: int, direction: Direction) -> list[int]:
    if len(ids) <= keep:
        return ids
    return ids[:keep] if direction == Direction.RIGHT else ids[len(ids) - keep:]


def window_bounds(length: int, size: int, max_windows: int, direction: Direction) -> list[tuple[int, int]]:
    """Consecutive windows of `size` covering `length` tokens, at most `max_windows`, in document order: from the
    start (right: the end is dropped when there are more) or aligned to the end (left: the start is dropped)."""
    if direction == Direction.RIGHT:
        return [(start, min(start + size, length)) for start in range(0, length, size)][:max_windows]
    ends = list(range(length, 0, -size))[:max_windows]
    return [(max(0, end - size), end) for end in reversed(ends)]


def too_long(where: str, length: int, limit: int, hint: str = "", clipped: bool = False) -> Invalid:
    """`clipped`: the text was tokenized only up to a bound (planning/bounded_tokens.py), `length` is a lower bound."""
    return Invalid(where, f"sequence of {'more than ' if clipped else ''}{length} tokens exceeds the model's "
                      f"maximum of {limit}{hint}")


TRUNCATE_HINT = " (send \"truncate\": true to cut it to fit)"


def fit_query(query: list[int], overhead: int, limit: int, rules: LengthRules, clipped: bool = False) -> list[int]:
    """The query with `overhead` tokens around it: cut only if it alone cannot fit."""
    if len(query) + overhead <= limit:
        return query
    if not rules.truncate:
        raise too_long("query", len(query) + overhead - clipped, limit, TRUNCATE_HINT, clipped)
    return cut(query, max(0, limit - overhead), rules.direction)


def fit_item(ids: list[int], room: int, limit: int, rules: LengthRules, where: str,
             clipped: bool = False, keep_first: int = 0) -> list[list[int]]:
    """One item's tokens as the rows to score: itself, cut, or its windows; `room` is what fits beside the rest.
    `keep_first`: leading tokens (an embedding model's prompt) that `max_item_tokens` does not count or cut, and that
    begin every window."""
    head, text = ids[:keep_first], ids[keep_first:]
    if rules.max_item_tokens is not None:
        text = cut(text, rules.max_item_tokens, rules.direction)
    ids = head + text
    if len(ids) <= room:
        return [ids]
    if rules.chunk:
        width = room - len(head)
        if width < 1:
            what = "the model's prompt leaves" if head else "the query leaves"
            raise Invalid(where, f"{what} no room for a window of it within the model's maximum of {limit} "
                             "tokens")
        return [head + text[a:b] for a, b in window_bounds(len(text), width, rules.max_chunks, rules.direction)]
    if rules.truncate:
        return [cut(ids, room, rules.direction)]
    raise too_long(where, len(ids) + limit - room - clipped, limit, TRUNCATE_HINT, clipped)


def check_token_ids(model: ScoringModel, sequences: list[list[int]], field_name: str) -> None:
    """Token-id inputs against the embedding rows (the OpenAPI document bounds them the same way)."""
    size = model.model.get_input_embeddings().num_embeddings
    for seq in sequences:
        for token in seq:
            if not 0 <= token < size:
                raise Invalid(field_name, f"token id {token} is out of range [0, {size})")


@dataclass
class Inputs:
    """A request's query and items as plain tokens, before any special token or cut."""

    query: list[int]
    items: list[list[int]]
    verbatim: bool  # token-id inputs: no special tokens are added
    item_first: bool = False
    clipped: frozenset[int] = frozenset()  # texts tokenized only up to their bound: -1 the query, else item indices
    keep_first: int = 0  # leading tokens of every item, max_item_tokens leaves alone, in every window (a prompt's)


def _needs(limit: int, rules: LengthRules, keep_first: int) -> tuple[int, int]:
    """Tokens of the query and of an item that a request can ever use, plus one to tell that a text is longer: the
    model's maximum (per window when chunking), or `max_item_tokens` if fewer; with either of those, the item's
    first `keep_first` on top (never cut, and in every window), so that a left cut's tail holds `keep_first` more
    tokens than it keeps (the prompt can fill most of the maximum: its tokens do not count against the text's)."""
    item = limit * (rules.max_chunks if rules.chunk else 1)
    if rules.max_item_tokens is not None:
        item = min(item, rules.max_item_tokens)
    return limit + 1, item + (keep_first if _heads_apart(rules) else 0) + 1


def _heads_apart(rules: LengthRules) -> bool:
    """Whether an item's leading `keep_first` tokens are kept apart from the rest: they are when max_item_tokens
    cuts the rest, or chunking windows it."""
    return rules.max_item_tokens is not None or rules.chunk


def _with_heads(model: ScoringModel, texts: list[str], tails: list[Clipped], keep_first: int) -> list[Clipped]:
    """Texts clipped to their last tokens (a left cut) whose first `keep_first` tokens must stay: those, then the
    tail beyond them (the tail holds `keep_first` more tokens than needed, so the two never overlap)."""
    clipped = [i for i, tail in enumerate(tails) if tail.clipped]
    heads = bounded_ids(model.tokenizer, [texts[i] for i in clipped], [keep_first] * len(clipped), from_end=False)
    out = list(tails)
    for i, head in zip(clipped, heads, strict=True):
        out[i] = Clipped(head.ids + tails[i].ids[keep_first:], True)
    return out


def plain_tokens(model: ScoringModel, query: str | list[int], items: list[str] | list[list[int]],
                 rules: LengthRules, keep_first: int = 0) -> Inputs:
    """`keep_first`: the items' leading tokens that max_item_tokens does not count (their embedding prompt's)."""
    if isinstance(query, list):  # token ids are used verbatim
        token_items = [list(item) for item in items]  # type: ignore[arg-type]
        check_token_ids(model, [query], "query")
        check_token_ids(model, token_items, rules.field)
        return Inputs(list(query), token_items, verbatim=True)
    texts: list[str] = [query, *items]  # type: ignore[list-item]
    query_need, item_need = _needs(model.max_positions, rules, keep_first)
    from_end = rules.direction == Direction.LEFT
    encoded = bounded_ids(model.tokenizer, texts, [query_need] + [item_need] * len(items), from_end=from_end)
    if from_end and keep_first and _heads_apart(rules):
        encoded[1:] = _with_heads(model, texts[1:], encoded[1:], keep_first)
    clipped = frozenset(i - 1 for i, tokens in enumerate(encoded) if tokens.clipped)
    return Inputs(encoded[0].ids, [tokens.ids for tokens in encoded[1:]], verbatim=False, clipped=clipped,
                  keep_first=keep_first)


def encode(model: ScoringModel, inputs: Inputs, rules: LengthRules) -> Tokenized:
    """Cut and join plain tokens by the model kind's layout (see Tokenized)."""
    limit, where = model.max_positions, rules.field
    specials = model.specials
    prefix, suffix = ([], []) if inputs.verbatim else (specials.prefix, specials.suffix)
    rows: list[list[int]] = []
    rows_of: list[int] = []

    def add(index: int, room: int) -> None:
        for window in fit_item(inputs.items[index], room, limit, rules, f"{where}[{index}]", index in inputs.clipped,
                               inputs.keep_first):
            rows.append(window)
            rows_of.append(index)

    if model.kind == ModelKind.EMBEDDING:  # every sequence alone
        overhead = len(prefix) + len(suffix)
        query = fit_query(inputs.query, overhead, limit, rules, -1 in inputs.clipped)
        for index in range(len(inputs.items)):
            add(index, limit - overhead)
        return Tokenized(prefix + query + suffix, [prefix + row + suffix for row in rows], rows_of, where)
    pair = (BARE_PAIR if inputs.verbatim else model.pair) if model.kind == ModelKind.CROSS_ENCODER else None
    overhead = pair.overhead if pair is not None else len(prefix) + len(suffix)
    query = fit_query(inputs.query, overhead, limit, rules, -1 in inputs.clipped)
    for index in range(len(inputs.items)):
        add(index, limit - overhead - len(query))
    if pair is not None:
        return Tokenized(query, rows, rows_of, where, pair)
    if inputs.item_first:  # item + query: the query closes every sequence
        return Tokenized(query + suffix, [prefix + row for row in rows], rows_of, where)
    return Tokenized(prefix + query, [row + suffix for row in rows], rows_of, where)
