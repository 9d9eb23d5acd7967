"""Where a tokenizer puts its special tokens around one sequence, or a pair, so that inputs can be joined at token
level with the specials exactly where the tokenizer would put them (spec "Score semantics"): decoders
`prefix + query + item + suffix` (BOS before the query and, for tokenizers that append one, EOS after the item),
embedding models each text alone, cross-encoders the pair template (`[CLS] query [SEP] item [SEP]`, with its token
types). Knowing the specials apart from the texts is what lets items be cut to fit (planning/encoding.py) without ever
cutting a special token."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

# Texts whose plain tokens are looked up inside the tokenizer's full encoding; two, so a template that depended on
# the text would be noticed.
_PROBES = ("Hello world", "1 2 3 x")


@dataclass(frozen=True)
class SpecialTokens:
    prefix: list[int]  # before the first text (BOS, CLS)
    suffix: list[int]  # after the last text (EOS, SEP)


@dataclass(frozen=True)
class PairLayout:
    """`prefix + first + middle + second + suffix`, each special with its token type, and the type of each text."""

    prefix: tuple[tuple[int, int], ...]  # (token, type)
    middle: tuple[tuple[int, int], ...]
    suffix: tuple[tuple[int, int], ...]
    first_type: int = 0
    second_type: int = 1

    @property
    def overhead(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def join(self, first: list[int], second: list[int]) -> tuple[list[int], list[int]]:
        """(ids, token types) of the pair."""
        ids = [t for t, _ in self.prefix] + first + [t for t, _ in self.middle] + second + [t for t, _ in self.suffix]
        types = ([k for _, k in self.prefix] + [self.first_type] * len(first) + [k for _, k in self.middle]
                 + [self.second_type] * len(second) + [k for _, k in self.suffix])
        return ids, types


BARE_PAIR = PairLayout((), (), ())  # token-id inputs: verbatim, types 0 then 1


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    for at in range(start, len(haystack) - len(needle) + 1):
        if haystack[at:at + len(needle)] == needle:
            return at
    return -1


def _around(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], list[int]]:
    full = list(tokenizer(text)["input_ids"])
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    start = _find(full, plain, 0)
    if start < 0:
        raise ValueError(f"the tokenizer's special-token template is not `prefix + text + suffix` (for {text!r}: "
                         f"{full} with specials, {plain} without)")
    return full[:start], full[start + len(plain):]


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> SpecialTokens:
    """The single-sequence template's specials; a tokenizer whose specials depend on the text is refused."""
    first, *others = [_around(tokenizer, text) for text in _PROBES]
    if any(other != first for other in others):
        raise ValueError(f"the tokenizer's special tokens depend on the text ({first} vs {others}); not supported")
    return SpecialTokens(*first)


def _pair(tokenizer: PreTrainedTokenizerBase, a: str, b: str) -> PairLayout:
    encoded = tokenizer([a], [b], return_token_type_ids=True)
    full, types = list(encoded["input_ids"][0]), list(encoded["token_type_ids"][0])
    plain_a, plain_b = (list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (a, b))
    i = _find(full, plain_a, 0)
    j = _find(full, plain_b, i + len(plain_a)) if i >= 0 else -1
    type_a, type_b = set(types[i:i + len(plain_a)]), set(types[j:j + len(plain_b)])
    if j < 0 or len(type_a) != 1 or len(type_b) != 1:
        raise ValueError(f"the tokenizer's pair template is not `prefix + first + middle + second + suffix` (for "
                         f"{a!r}, {b!r}: {full}); not supported")
    tagged = list(zip(full, types, strict=True))
    return PairLayout(tuple(tagged[:i]), tuple(tagged[i + len(plain_a):j]), tuple(tagged[j + len(plain_b):]),
                      type_a.pop(), type_b.pop())


def pair_layout(tokenizer: PreTrainedTokenizerBase) -> PairLayout:
    """The pair template's specials and token types (cross-encoders); refused if they depend on the texts."""
    first, second = _pair(tokenizer, *_PROBES), _pair(tokenizer, *reversed(_PROBES))
    if first != second:
        raise ValueError(f"the tokenizer's pair template depends on the texts ({first} vs {second}); not supported")
    return first
