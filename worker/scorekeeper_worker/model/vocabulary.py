"""The tokenizer's ids against the model's rows, compared once at load.

A tokenizer can produce ids the model has no row for: a token added to the tokenizer without
`resize_token_embeddings` (a common mistake in fine-tuned checkpoints). transformers cannot score such an input either
(an IndexError on CPU, a device-side assert that poisons the process on CUDA). The worker serves such a checkpoint:
start-up finds every id past the embedding rows (`Vocabulary.unreadable`) and logs them, and a request whose ids
reach one of them gets a 400 naming the field and the token (planning/readable_ids.py). It refuses the checkpoint
only where every request would fail: when a special token the worker itself puts around every text (BOS, CLS, SEP,
EOS, a cross-encoder's pair template) is past the rows."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from scorekeeper_worker.model.templates.special_tokens import PairLayout, SpecialTokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vocabulary:
    input_rows: int  # rows of the input embedding: the ids the model can read
    tokenizer_ids: int  # 1 + the largest id the tokenizer can produce (its vocabulary and added tokens)
    unreadable: dict[int, str] = field(default_factory=dict)  # id ≥ input_rows → the token, as the tokenizer spells it

    @property
    def complete(self) -> bool:
        """Every id the tokenizer produces has a row: no request needs checking."""
        return self.tokenizer_ids <= self.input_rows

    def token(self, token_id: int) -> str:
        return self.unreadable.get(token_id, f"<id {token_id}>")


def vocabulary(tokenizer: PreTrainedTokenizerBase, input_rows: int) -> Vocabulary:
    ids = tokenizer.get_vocab()  # the base vocabulary and the added tokens
    size = max(len(tokenizer), max(ids.values(), default=-1) + 1)
    unreadable = {token_id: token for token, token_id in ids.items() if token_id >= input_rows}
    vocab = Vocabulary(input_rows, size, dict(sorted(unreadable.items())))
    if not vocab.complete:
        shown = ", ".join(f"{token!r} (id {token_id})" for token_id, token in list(vocab.unreadable.items())[:8])
        log.warning("the tokenizer produces %d ids but the model has %d embedding rows: %d token(s) past them (%s%s) "
                    "were added without resizing the embeddings; requests whose text produces one get a 400",
                    size, input_rows, len(unreadable), shown, ", ..." if len(unreadable) > 8 else "")
    return vocab


def check_specials(vocab: Vocabulary, specials: SpecialTokens, pair: PairLayout | None) -> None:
    """Refuse the model when a special token that every request carries has no embedding row."""
    fixed = [*specials.prefix, *specials.suffix]
    if pair is not None:
        fixed += [token for token, _ in (*pair.prefix, *pair.middle, *pair.suffix)]
    for token_id in fixed:
        if token_id >= vocab.input_rows:
            raise ValueError(f"the tokenizer's special token {vocab.token(token_id)!r} (id {token_id}) is past the "
                             f"model's {vocab.input_rows} embedding rows (the tokenizer has {vocab.tokenizer_ids} "
                             "ids): every request would carry it; resize the embeddings (resize_token_embeddings) "
                             "or fix the tokenizer")
