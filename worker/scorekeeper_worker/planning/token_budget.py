"""--max-request-tokens before a text request is tokenized whole: a request that would run more tokens than the limit
is refused once a count of part of it proves so, not after tokenizing megabytes (0.4 s of CPU per MB).

The count is a lower bound of what the plan would count (planning/planner.py): the query once and every item's own
tokens (cut to `max_tokens_per_item`), which every kind and mode runs at least. It tokenizes slices of the items in
order and stops as soon as the bound passes the limit. Requests it cannot help are not counted: token ids (their
lengths are free), requests whose items could not pass the limit even at one token per byte, and requests that ask
to cut or chunk (their rows can be much shorter than their text) or go through a prompt template.
"""

from __future__ import annotations

from scorekeeper_worker.base.errors import TooLarge
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.planning.bounded_tokens import bounded_ids
from scorekeeper_worker.planning.encoding import LengthRules

SLICE_BYTES = 64 * 1024  # text tokenized per step: a few milliseconds


def refuse_early(model: ScoringModel, query: str | list[int], items: list[str] | list[list[int]],
                 rules: LengthRules, limit: int | None) -> None:
    if limit is None or not isinstance(query, str) or rules.truncate or rules.chunk or model.template is not None:
        return
    # Without an embedding model's prompt: a lower bound still (do_lower_case is in the tokenizer's normalizer).
    texts: list[str] = [query, *items]  # type: ignore[list-item]
    sizes = [len(text.encode("utf-8", "surrogatepass")) for text in texts]
    if sum(sizes) <= limit:  # a token is at least a byte: the bound cannot pass the limit
        return
    cap = rules.max_item_tokens
    counted, start, size = 0, 0, 0
    for end, text_size in enumerate(sizes, start=1):
        size += text_size
        if size < SLICE_BYTES and end < len(texts):
            continue
        # Each text counted up to one token past the model's maximum (planning/bounded_tokens.py): beyond it, the text
        # is refused as too long anyway (400), and its count stays a lower bound.
        slice_ids = bounded_ids(model.tokenizer, texts[start:end], [model.max_positions + 1] * (end - start), False)
        for i, tokens in enumerate(slice_ids, start):
            counted += len(tokens.ids) if i == 0 or cap is None else min(len(tokens.ids), cap)
        if counted > limit:
            raise TooLarge(
                f"{rules.field}: the request would run more than {limit} tokens through the model (counted "
                f"{counted} in its first {end - 1} of {len(texts) - 1} items and the query, each once), over this "
                "server's limit (--max-request-tokens); split it into smaller requests")
        start, size = end, 0
