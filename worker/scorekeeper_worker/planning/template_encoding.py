"""Decoders behind a prompt template (--prompt-template): each (query, item) pair is the fully rendered prompt,
tokenized WHOLE with the tokenizer's own specials, i.e. exactly `tokenizer(prompt)` as a plain transformers user
would run it. Never piecewise: a tokenizer merges text across the seams of a template (`"<Document>: "` + `"The"` is
`[":", " The"]` in the whole prompt, `[":", " "] + ["The"]` in pieces), so pieces would be a different input.

The part every item shares (multi-item scoring's query row) is read off the tokens: the longest common prefix of
the shared text (everything before {item}) tokenized alone and of every item's whole prompt. Each sequence is still
exactly its whole prompt's tokens (shared + rest), so multi-item scores equal single-item scores, and both equal
transformers on the rendered prompt.

Long inputs are cut as text, between the tokens of the text's own tokenization (right: before the first dropped
token; left: from the first kept one; windows: consecutive token ranges), and the prompt rendered and tokenized
whole again; if it is still over the model's maximum (the seams can tokenize differently), as many more tokens are
dropped as it is over, until it fits. The query is cut the same way, only when the prompt with an empty item cannot
fit."""

from __future__ import annotations

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.templates.prompt_template import PromptTemplate
from scorekeeper_worker.planning.encoding import (
    TRUNCATE_HINT,
    Direction,
    LengthRules,
    Tokenized,
    too_long,
    window_bounds,
)


def _prompts(model: ScoringModel, texts: list[str]) -> list[list[int]]:
    """`tokenizer(text)["input_ids"]` of each text: its tokens with the tokenizer's specials around them."""
    specials = model.specials
    return [specials.prefix + list(ids) + specials.suffix
            for ids in model.tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _offsets(model: ScoringModel, text: str) -> list[tuple[int, int]]:
    return [tuple(o) for o in model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"]]  # type: ignore[misc]


def _span(text: str, offsets: list[tuple[int, int]], start: int, end: int) -> str:
    """The text of tokens [start, end) of `text`'s own tokenization, cut between tokens, never inside one."""
    begin = offsets[start][0] if 0 < start < len(offsets) else 0 if start == 0 else len(text)
    finish = offsets[end][0] if end < len(offsets) else len(text)
    return text[begin:max(begin, finish)]


def _shrink(model: ScoringModel, text: str, offsets: list[tuple[int, int]], keep: int, direction: Direction,
            around: tuple[str, str]) -> tuple[list[int], int]:
    """Cut `text` to `keep` of its tokens, then fewer as long as the prompt `around[0] + text + around[1]` is over
    the model's maximum: (the prompt, tokens kept)."""
    n, limit = len(offsets), model.max_positions
    while True:
        keep = max(0, keep)
        start, end = (0, keep) if direction == Direction.RIGHT else (n - keep, n)
        prompt = _prompts(model, [around[0] + _span(text, offsets, start, end) + around[1]])[0]
        over = len(prompt) - limit
        if over <= 0 or keep == 0:
            return prompt, keep
        keep -= over


def _fit_query(model: ScoringModel, template: PromptTemplate, query: str, instruct: str | None,
               rules: LengthRules) -> str:
    limit = model.max_positions
    empty = _prompts(model, [template.render(query, "", instruct)])[0]
    if len(empty) <= limit:
        return query
    if not rules.truncate:
        raise too_long("query", len(empty), limit, " with the prompt template" + TRUNCATE_HINT)
    offsets = _offsets(model, query)
    prompt, kept = _shrink(model, query, offsets, len(offsets) - (len(empty) - limit), rules.direction,
                           template.around_query(instruct))
    if len(prompt) > limit:
        raise Invalid("instruct", f"the prompt template with this instruct alone is {len(prompt)} tokens, over the "
                         f"model's maximum of {limit}")
    start, end = (0, kept) if rules.direction == Direction.RIGHT else (len(offsets) - kept, len(offsets))
    return _span(query, offsets, start, end)


def _fit_item(model: ScoringModel, shared: str, tail: str, item: str, whole: list[int], room: int,
              rules: LengthRules, where: str) -> list[list[int]]:
    """One item's prompts: its whole prompt, cut, or one per window."""
    limit = model.max_positions
    offsets = _offsets(model, item)
    n = len(offsets)
    start, end = 0, n
    if rules.max_item_tokens is not None and n > rules.max_item_tokens:
        keep = rules.max_item_tokens
        start, end = (0, keep) if rules.direction == Direction.RIGHT else (n - keep, n)
        whole = _prompts(model, [shared + _span(item, offsets, start, end) + tail])[0]
    if len(whole) <= limit:
        return [whole]
    if rules.chunk:
        size = room
        while size >= 1:
            bounds = window_bounds(end - start, size, rules.max_chunks, rules.direction)
            windows = _prompts(model, [shared + _span(item, offsets, start + a, start + b) + tail for a, b in bounds])
            over = max(len(w) for w in windows) - limit
            if over <= 0:
                return windows
            size -= over
        raise Invalid(where, f"the query leaves no room for a window of it within the model's maximum of "
                         f"{limit} tokens")
    if not rules.truncate:
        raise too_long(where, len(whole), limit, TRUNCATE_HINT)
    text = _span(item, offsets, start, end)
    text_offsets = _offsets(model, text)
    prompt, _ = _shrink(model, text, text_offsets, len(text_offsets) - (len(whole) - limit), rules.direction,
                        (shared, tail))
    return [prompt]


def common_prefix(first: list[int], others: list[list[int]]) -> int:
    length = len(first)
    for other in others:
        length = min(length, len(other))
        length = next((i for i in range(length) if other[i] != first[i]), length)
    return length


def encode(model: ScoringModel, template: PromptTemplate, query: str, items: list[str], instruct: str | None,
           rules: LengthRules) -> Tokenized:
    query = _fit_query(model, template, query, instruct, rules)
    shared = template.prefix(query, instruct)
    wholes = _prompts(model, [shared + item + template.tail for item in items])
    room = model.max_positions - len(_prompts(model, [shared + template.tail])[0])
    rows: list[list[int]] = []
    rows_of: list[int] = []
    for index, (item, whole) in enumerate(zip(items, wholes, strict=True)):
        if rules.max_item_tokens is None and len(whole) <= model.max_positions:
            fitted = [whole]
        else:
            fitted = _fit_item(model, shared, template.tail, item, whole, room, rules, f"{rules.field}[{index}]")
        rows += fitted
        rows_of += [index] * len(fitted)
    head = model.specials.prefix + list(model.tokenizer(shared, add_special_tokens=False)["input_ids"])
    common = common_prefix(head, rows)
    return Tokenized(head[:common], [row[common:] for row in rows], rows_of, rules.field)
