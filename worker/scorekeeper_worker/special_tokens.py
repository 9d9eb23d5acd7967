"""Where a tokenizer puts its special tokens around one sequence, so decoder inputs can be joined at token level with
the specials exactly where the tokenizer would put them for the joined text (spec "Score semantics"):
`prefix + query + item + suffix`, e.g. BOS before the query and, for tokenizers that append one, EOS after the item."""

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


def _around(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], list[int]]:
    full = list(tokenizer(text)["input_ids"])
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    raise ValueError(f"the tokenizer's special-token template is not `prefix + text + suffix` (for {text!r}: "
                     f"{full} with specials, {plain} without)")


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> SpecialTokens:
    """The single-sequence template's specials; a tokenizer whose specials depend on the text is refused."""
    first, *others = [_around(tokenizer, text) for text in _PROBES]
    if any(other != first for other in others):
        raise ValueError(f"the tokenizer's special tokens depend on the text ({first} vs {others}); not supported")
    return SpecialTokens(*first)
