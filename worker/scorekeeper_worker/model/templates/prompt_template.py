"""Prompt templates and label tokens for LLM rerankers (`--prompt-template`, `--label-tokens`).

A template is text with three placeholders: `{instruct}` and `{query}` (at most once / exactly once, both before
`{item}`) and `{item}` (exactly once). Everything before `{item}` is the request's shared prefix; everything from
`{item}` on is per item. Any other brace is literal text, and the values are never parsed again, so a query that
contains "{item}" is just text. How a rendered prompt becomes tokens: planning/template_encoding.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI checks templates before anything heavy is imported
    from transformers import PreTrainedTokenizerBase

INSTRUCT, QUERY, ITEM = "{instruct}", "{query}", "{item}"
_PLACEHOLDER = re.compile(r"(\{(?:instruct|query|item)\})")

# Qwen3-Reranker's published prompt (model card, and Qwen's own transformers example): its system prompt, the
# user turn with <Instruct>/<Query>/<Document>, and the assistant turn opened with an empty <think> block, after
# which the model answers "yes" or "no". The default instruction is the card's.
QWEN3_RERANKER = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruct}\n<Query>: {query}\n<Document>: {item}<|im_end|>\n<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n")
QWEN3_DEFAULT_INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"


class TemplateError(ValueError):
    """A template or label-token setting that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class PromptTemplate:
    name: str  # the built-in name, or the file's path
    head: tuple[str, ...]  # literal text and placeholders before {item}, in order
    tail: str  # the text after {item} (no placeholders)
    default_instruct: str = ""
    label_tokens: tuple[str, ...] = ()  # a built-in's labels, the default of --label-tokens

    @property
    def has_instruct(self) -> bool:
        return INSTRUCT in self.head

    def _fill(self, parts: tuple[str, ...], query: str, instruct: str | None) -> str:
        values = {QUERY: query, INSTRUCT: self.default_instruct if instruct is None else instruct}
        return "".join(values.get(part, part) for part in parts)

    def prefix(self, query: str, instruct: str | None) -> str:
        """The shared text before the item."""
        return self._fill(self.head, query, instruct)

    def around_query(self, instruct: str | None) -> tuple[str, str]:
        """The prompt before and after the query, the item empty."""
        at = self.head.index(QUERY)
        return self._fill(self.head[:at], "", instruct), self._fill(self.head[at + 1:], "", instruct) + self.tail

    def render(self, query: str, item: str, instruct: str | None) -> str:
        """The whole prompt for one (query, item) pair: what a plain transformers user would tokenize."""
        return self.prefix(query, instruct) + item + self.tail


def parse_template(text: str, name: str, default_instruct: str = "",
                   label_tokens: tuple[str, ...] = ()) -> PromptTemplate:
    parts = [part for part in _PLACEHOLDER.split(text) if part]
    counts = {p: parts.count(p) for p in (INSTRUCT, QUERY, ITEM)}
    if counts[ITEM] != 1 or counts[QUERY] != 1 or counts[INSTRUCT] > 1:
        raise TemplateError(f"--prompt-template {name}: a template holds {ITEM} and {QUERY} exactly once and "
                            f"{INSTRUCT} at most once (found {counts})")
    at = parts.index(ITEM)
    if QUERY in parts[at:] or INSTRUCT in parts[at:]:
        raise TemplateError(f"--prompt-template {name}: {QUERY} and {INSTRUCT} must come before {ITEM} (the text "
                            f"before {ITEM} is what the items of a request share)")
    return PromptTemplate(name, tuple(parts[:at]), "".join(parts[at + 1:]), default_instruct, label_tokens)


BUILTIN: dict[str, PromptTemplate] = {
    "qwen3-reranker": parse_template(QWEN3_RERANKER, "qwen3-reranker", QWEN3_DEFAULT_INSTRUCT, ("yes", "no")),
}


def load_template(spec: str) -> PromptTemplate:
    """A built-in name, or a UTF-8 text file used byte for byte (mind an editor's final newline)."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateError(f"--prompt-template {spec}: neither a built-in template ({', '.join(BUILTIN)}) nor a "
                            f"readable UTF-8 file ({type(error).__name__}: {error})") from None
    return parse_template(text, str(path))


def resolve_label_tokens(tokenizer: PreTrainedTokenizerBase, labels: tuple[str, ...], source: str,
                         logit_size: int) -> list[int]:
    """Each label as the tokenizer encodes that text alone, which must be exactly one token of the model's logits."""
    ids: list[int] = []
    for label in labels:
        tokens = list(tokenizer(label, add_special_tokens=False)["input_ids"])
        if len(tokens) != 1:
            pieces = tokenizer.convert_ids_to_tokens(tokens)
            raise TemplateError(f"{source}: {label!r} is {len(tokens)} tokens in this model's tokenizer ({tokens} "
                                f"= {pieces}); each label must be exactly one token")
        if not 0 <= tokens[0] < logit_size:
            raise TemplateError(f"{source}: {label!r} is token {tokens[0]}, outside the model's {logit_size} logits")
        ids.append(tokens[0])
    return ids
