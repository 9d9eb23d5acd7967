"""Request bodies for the load benchmark: shapes, presets, and seeded bodies with exact token counts.

Token counts are exact in both input forms: token ids are drawn from the tokenizer's vocabulary (above its first
`FIRST_PLAIN_ID` ids, where the special tokens live); texts are made of words that are each one token with their
leading space (" word" → one id in a byte-level BPE whose pre-tokenizer splits at spaces), so a text of k such words,
each with its space, is k tokens. Every text of the pool is checked against the tokenizer when it is built.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FIRST_PLAIN_ID = 256


@dataclass(frozen=True)
class Shape:
    query_tokens: int
    items: int
    item_tokens: int

    def tokens(self, mis: bool) -> int:
        """Tokens through the model: the query once (MIS) or once per item, before special tokens."""
        query = self.query_tokens * (1 if mis else self.items)
        return query + self.items * self.item_tokens


@dataclass(frozen=True)
class Mix:
    """Request shapes and their weights (shares of requests)."""

    name: str
    shapes: tuple[tuple[float, Shape], ...]

    def mean_tokens(self, mis: bool) -> float:
        total = sum(weight for weight, _ in self.shapes)
        return sum(weight * shape.tokens(mis) for weight, shape in self.shapes) / total

    def token_ratio(self) -> float:
        """Tokens without MIS over tokens with MIS: MIS's speed-up if time were proportional to tokens."""
        return self.mean_tokens(mis=False) / self.mean_tokens(mis=True)


PRESETS = {
    # SGLang PR #10979 and its benchmark (benchmark/score/bench_score.py): a 120-token query and 10 items of 180
    # tokens, i.e. 300-token prompts, Yes/No label tokens.
    "sglang-mis": Mix("sglang-mis", ((1.0, Shape(120, 10, 180)),)),
    # Mostly small requests, a few with hundreds of items (ranking traffic with a long tail).
    "long-tail": Mix("long-tail", ((0.80, Shape(64, 4, 32)), (0.15, Shape(128, 32, 48)), (0.05, Shape(256, 256, 32)))),
}


def one_token_words(tokenizer: PreTrainedTokenizerBase, limit: int = 4000) -> list[str]:
    """Lower-case alphabetic words that are exactly one token with a leading space (" word")."""
    words: list[str] = []
    for token_id in range(FIRST_PLAIN_ID, len(tokenizer)):
        text = tokenizer.decode([token_id])
        word = text[1:]
        if text.startswith(" ") and word.isascii() and word.isalpha() and word.islower() and len(word) > 2 \
                and tokenizer(text, add_special_tokens=False)["input_ids"] == [token_id]:
            words.append(word)
            if len(words) >= limit:
                break
    if len(words) < 100:
        raise ValueError(f"{tokenizer.name_or_path}: only {len(words)} one-token words; use token-id inputs")
    return words


class BodyPool:
    """`size` request bodies per mix, seeded; `body(i, mis)` cycles through them (JSON bytes, cached)."""

    def __init__(self, mix: Mix, tokenizer: PreTrainedTokenizerBase, labels: list[int], text: bool,
                 size: int, seed: int) -> None:
        rng = random.Random(f"{seed}-{mix.name}")
        weights = [weight for weight, _ in mix.shapes]
        self.shapes = rng.choices([shape for _, shape in mix.shapes], weights, k=size)
        words = one_token_words(tokenizer) if text else []
        vocab = len(tokenizer)

        def sequence(k: int) -> str | list[int]:
            if text:
                return "".join(" " + rng.choice(words) for _ in range(k))
            return [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(k)]

        self.requests = [{"query": sequence(s.query_tokens), "items": [sequence(s.item_tokens) for _ in range(s.items)],
                          "label_token_ids": labels, "apply_softmax": True} for s in self.shapes]
        if text:
            self._check(tokenizer)
        self._bytes: dict[tuple[int, bool], bytes] = {}

    def _check(self, tokenizer: PreTrainedTokenizerBase) -> None:
        for shape, request in zip(self.shapes, self.requests, strict=True):
            texts = [request["query"], *request["items"]]
            lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
            if lengths != [shape.query_tokens] + [shape.item_tokens] * shape.items:
                raise AssertionError(f"text token counts {lengths[:4]}… differ from {shape}")

    def body(self, index: int, mis: bool) -> tuple[bytes, int]:
        """The JSON body of request `index` (cycling the pool) with multi_item_scoring = `mis`, and its items."""
        slot = index % len(self.requests)
        key = (slot, mis)
        if key not in self._bytes:
            self._bytes[key] = json.dumps({**self.requests[slot], "multi_item_scoring": mis}).encode()
        return self._bytes[key], self.shapes[slot].items


def label_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of " yes" and " no", each one token (the label tokens every preset scores)."""
    ids = [tokenizer(word, add_special_tokens=False)["input_ids"] for word in (" yes", " no")]
    if any(len(i) != 1 for i in ids):
        raise ValueError(f"label words are not single tokens: {ids}")
    return [ids[0][0], ids[1][0]]
