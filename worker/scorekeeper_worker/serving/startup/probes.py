"""The self-check's probe sets (serving/startup/selfcheck.py): deterministic token ids, planned like requests.

Two batches, each run through the real executor:
- the budget batch: sequences of mixed lengths from several simulated requests (one multi-item when the server has
  multi-item scoring on), an item of one token, a sequence across the smallest sliding window, shrunk until the
  whole set fits one batch of `--max-batch-tokens` and split by `--max-items-per-request`;
- the edge batch: a sequence as long as the model's maximum position (up to `LONG_PROBE_LIMIT` tokens) co-batched
  with short ones, sequences just under and over longrope's original maximum, and, with multi-item scoring and a
  delimiter, items whose delimiter lands on the last position and one past it (run alone).
Special tokens sit inside every probe (pad, EOS, separator, ...): an item ends with the pad token, so a classifier
reads before it, and RoBERTa-family positions skip it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from scorekeeper_worker.model.loader import ModelKind, ScoringModel

# (query length, item lengths) before scaling to the limits: lengths in different attention blocks, an item of one
# token, and one request per simulated client.
_SHAPES = ((12, (1, 7, 30)), (3, (18, 5)))
WINDOW_PROBE_LIMIT = 512  # a window up to this long gets a sequence that crosses it on both sides
# The longest edge probe: the model's maximum position when it is at most this (encoders' usual maximum), else this:
# on a large decoder a longer probe costs seconds of CPU at every start; the conformance suite covers longer
# thresholds on tiny models.
LONG_PROBE_LIMIT = 512
_SHORT = 9  # the short sequences co-batched with the long one


@dataclass(frozen=True)
class Probe:
    query: list[int]
    items: list[list[int]]
    multi_item: bool


def smallest_window(model: ScoringModel) -> int | None:
    windows = [w for m in model.model.modules() if isinstance(w := getattr(m, "sliding_window", None), int)]
    return min(windows) if windows and min(windows) <= WINDOW_PROBE_LIMIT else None


def _planned_tokens(model: ScoringModel, probe_set: list[Probe], delimiter: int | None) -> int:
    """Tokens the probe set takes once planned (as planning.planner lays requests out)."""
    total = 0
    for probe in probe_set:
        items = sum(len(item) for item in probe.items)
        if model.kind == ModelKind.EMBEDDING:
            total += len(probe.query) + items
        elif probe.multi_item:
            total += len(probe.query) + items + (len(probe.items) + 1 if delimiter is not None else 0)
        else:
            total += len(probe.query) * len(probe.items) + items
    return total


class _Tokens:
    """Deterministic token ids: plain vocabulary, with the tokenizer's special tokens placed inside."""

    def __init__(self, model: ScoringModel) -> None:
        tokenizer = model.tokenizer
        self.special = sorted(set(tokenizer.all_special_ids))
        self.vocab = [t for t in range(model.model.get_input_embeddings().num_embeddings) if t not in self.special]
        self.pad = tokenizer.pad_token_id
        self.rng = random.Random(12)

    def sequence(self, length: int, specials: bool = True) -> list[int]:
        """`length` ids; with `specials`, from 4 tokens on, a special token inside and (if any) a pad token last."""
        ids = self.rng.choices(self.vocab, k=length)
        if specials and length >= 4 and self.special:
            ids[length // 2] = self.special[length % len(self.special)]
            if self.pad is not None:
                ids[-1] = self.pad
        return ids


def _scaled(model: ScoringModel, tokens: _Tokens, scale: float, max_items: int, multi_item: bool) -> list[Probe]:
    shapes = [(query, list(items)) for query, items in _SHAPES]
    if (window := smallest_window(model)) is not None:
        shapes[1][1].append(2 * window + 2)
    out: list[Probe] = []
    for number, (query_length, item_lengths) in enumerate(shapes):
        query = tokens.sequence(max(1, int(query_length * scale)), specials=False)
        longest = model.max_positions - len(query)
        items = [tokens.sequence(max(1, min(longest, int(length * scale)))) for length in item_lengths]
        for start in range(0, len(items), max_items):  # split like clients limited to max_items would
            out.append(Probe(query, items[start:start + max_items], multi_item and number == 0 and model.is_decoder))
    return out


def probes(model: ScoringModel, budget: int, max_items: int, multi_item: bool, delimiter: int | None) -> list[Probe]:
    """The budget batch, shrunk until the whole set fits one batch of `budget` tokens (at 16 tokens, every sequence
    is one token long)."""
    scale = 1.0
    while True:
        probe_set = _scaled(model, _Tokens(model), scale, max_items, multi_item)
        if _planned_tokens(model, probe_set, delimiter) <= budget or scale < 1e-3:
            return probe_set
        scale /= 2


def edge_probes(model: ScoringModel, multi_item: bool, delimiter: int | None) -> list[Probe]:
    """The edge batch: the longest sequence beside short ones, both sides of longrope's threshold, and the
    multi-item delimiter at the last position (one request per probe, one item per request where it matters)."""
    tokens = _Tokens(model)
    longest = min(model.max_positions, LONG_PROBE_LIMIT)
    query = tokens.sequence(min(12, longest // 2), specials=False)
    lengths = [longest]
    threshold = model.rope.long_after
    if threshold is not None and threshold + 1 <= longest:
        lengths += [threshold, threshold + 1]
    if model.kind == ModelKind.EMBEDDING:  # each sequence alone: the item is the long one
        out = [Probe(tokens.sequence(_SHORT), [tokens.sequence(length)], False) for length in lengths]
    else:
        out = [Probe(query, [tokens.sequence(max(0, length - len(query)))], False) for length in lengths]
    out.append(Probe(tokens.sequence(_SHORT // 2), [tokens.sequence(_SHORT)], False))
    if multi_item and model.is_decoder and delimiter is not None and longest >= len(query) + 2:
        # query + item fill every position (its delimiter would pass the maximum), one less (the delimiter on the
        # last position), and a short item beside them.
        room = longest - len(query)
        out.append(Probe(query, [tokens.sequence(room), tokens.sequence(room - 1), tokens.sequence(3)], True))
    return out
