"""Tokenize only as much of a long text as can ever be used: the first `need` tokens (right truncation) or the last
`need` (left), the same ids as tokenizing the whole text and then cutting, at a cost set by `need`, not by the text.

A request never uses more of a text than the model's maximum (once more per window when long documents are chunked),
or `max_tokens_per_item`; one token beyond that is enough to know the text is too long (a 400 without `truncate`).
Tokenizing a 500,000-character document whole to keep 512 of its tokens costs ~100 ms; the window below costs ~1 ms.

Why a window gives the whole text's ids: the tokenizers we serve (WordPiece, byte-level BPE, SentencePiece BPE and
Unigram) split text at whitespace before their model runs (or, SentencePiece, never build a piece across a word
boundary), so a token depends only on the word it belongs to. A window's first `need` tokens (right; left: last) are
therefore the whole text's when whitespace separates them from the window's cut, where the window may have split a
word. Besides that, a window is trusted only with `need` tokens plus a margin and when a longer window (a second cut,
a quarter further on) agrees on them; otherwise the window doubles, up to the whole text (a text with no whitespace
near the end it keeps, e.g. a long CJK run under a byte-level BPE, is tokenized whole)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

MARGIN_TOKENS = 16  # tokens kept away from a window's cut before its tokens are trusted
FIRST_WINDOW_CHARS_PER_TOKEN = 6  # a first guess (English averages ~4-5 characters per token)
MIN_WINDOW_CHARS = 1024
WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True)
class Clipped:
    """A text's tokens: all of them, or (`clipped`) only the `need` tokens at the kept end of a longer text."""

    ids: list[int]
    clipped: bool


def _ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _window_ids(tokenizer: PreTrainedTokenizerBase, window: str, need: int, from_end: bool) -> list[int] | None:
    """The kept `need` tokens of a window, or None when they may differ from the whole text's."""
    encoded = tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    if len(ids) < need + MARGIN_TOKENS:
        return None
    gap = window[:offsets[len(ids) - need][0]] if from_end else window[offsets[need - 1][1]:]
    return _kept(ids, need, from_end) if WHITESPACE.search(gap) else None


def _kept(ids: list[int], need: int, from_end: bool) -> list[int]:
    return ids[len(ids) - need:] if from_end else ids[:need]


def _window(text: str, chars: int, from_end: bool) -> str:
    return text[len(text) - chars:] if from_end else text[:chars]


def _first_window(need: int) -> int:
    return max(MIN_WINDOW_CHARS, FIRST_WINDOW_CHARS_PER_TOKEN * (need + MARGIN_TOKENS))


def _check_window(chars: int) -> int:
    """The longer window that must agree: another cut, a quarter further on."""
    return chars + chars // 4


def _long(tokenizer: PreTrainedTokenizerBase, text: str, need: int, from_end: bool) -> Clipped:
    chars = _first_window(need)
    while _check_window(chars) < len(text):
        kept = _window_ids(tokenizer, _window(text, chars, from_end), need, from_end)
        longer = _window(text, _check_window(chars), from_end)
        if kept is not None and kept == _window_ids(tokenizer, longer, need, from_end):
            return Clipped(kept, True)
        chars *= 2
    return _cut(_ids(tokenizer, [text])[0], need, from_end)


def _cut(ids: list[int], need: int, from_end: bool) -> Clipped:
    return Clipped(ids, False) if len(ids) <= need else Clipped(_kept(ids, need, from_end), True)


def bounded_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str], needs: list[int],
                from_end: bool) -> list[Clipped]:
    """Each text's tokens (without special tokens), at most `needs[i]` of them, the first ones or (`from_end`, left
    truncation) the last ones: identical to `tokenizer(text, add_special_tokens=False)` cut to that many. Short
    texts go through the tokenizer together, in one batch; a text long enough to hold more than its need is
    tokenized by windows."""
    out: list[Clipped | None] = [None] * len(texts)
    short = [i for i, (text, need) in enumerate(zip(texts, needs, strict=True))
             if len(text) <= _check_window(_first_window(need))]
    for i, ids in zip(short, _ids(tokenizer, [texts[i] for i in short]) if short else [], strict=True):
        out[i] = _cut(ids, needs[i], from_end)
    for i, text in enumerate(texts):
        if out[i] is None:
            out[i] = _long(tokenizer, text, needs[i], from_end)
    return [clipped for clipped in out if clipped is not None]
