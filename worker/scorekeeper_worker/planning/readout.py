"""Where a sequence is read and how it is numbered, as the model's own forward on it would do (pure, CPU).

- The token a decoder's head reads: causal LMs the last token; classifiers and reward models
  (`*ForSequenceClassification`) the last token that is not `pad_token_id`, and token 0 when every token is pad
  (transformers' `(arange * (ids != pad)).argmax()`), so with pad = EOS the token before an appended EOS.
- Position ids: from `position_start` on, except in the RoBERTa family, which numbers them from the ids
  (`create_position_ids_from_input_ids`): pad tokens take `padding_idx` and do not advance the count.
- The RoPE table: the one the sequence's own length selects (model/rope.py)."""

from __future__ import annotations

from scorekeeper_worker.model.loader import ScoringModel


def read_index(model: ScoringModel, ids: list[int]) -> int:
    """Index in `ids` (a whole sequence, at least one token) of the token whose output the head reads."""
    pad = model.classifier_pad
    if pad is None:
        return len(ids) - 1
    return next((i for i in range(len(ids) - 1, -1, -1) if ids[i] != pad), 0)


def positions(model: ScoringModel, ids: list[int]) -> list[int] | None:
    """Explicit position ids of a whole sequence, or None where they are `position_start + index`."""
    if not model.support.position_offset:
        return None
    padding_idx = model.position_start - 1
    numbered, count = [], 0
    for token in ids:
        if token == padding_idx:
            numbered.append(padding_idx)
        else:
            count += 1
            numbered.append(padding_idx + count)
    return numbered


def rope_table(model: ScoringModel, length: int) -> int:
    """The RoPE table of a sequence of `length` tokens."""
    return model.rope.table(length)
