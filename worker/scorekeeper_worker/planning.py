"""Validated request → tokenized sequences → the pack units that score it (pure, CPU).

Query and items are tokenized separately and joined at token level (spec: "Score semantics"), which is what makes
multi-item scores equal single-item scores of the same token sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekeeper_worker.loader import ModelKind, Pooling, ScoringModel
from scorekeeper_worker.packing import PackUnit, Pool
from scorekeeper_worker.schemas import BadRequest, ScoreRequest

QUERY_SLOT = -1  # embedding models pool the query once per request into this slot


@dataclass
class Tokenized:
    """Token ids after the spec's special-token rules. For cross-encoders `pairs` holds the full pair encodings."""

    query: list[int]
    items: list[list[int]]
    pairs: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (ids, token types)


@dataclass
class ScorePlan:
    units: list[PackUnit]
    prompt_tokens: int
    multi_item: bool


def _vocab_check(model: ScoringModel, sequences: list[list[int]], field_name: str) -> None:
    size = model.model.get_input_embeddings().num_embeddings
    for seq in sequences:
        for token in seq:
            if not 0 <= token < size:
                raise BadRequest(f"{field_name}: token id {token} is out of range [0, {size})")


def tokenize(model: ScoringModel, request: ScoreRequest) -> Tokenized:
    items = request.item_list
    if isinstance(request.query, list):  # token ids are used verbatim
        token_items = [list(item) for item in items]  # type: ignore[arg-type]
        _vocab_check(model, [request.query], "query")
        _vocab_check(model, token_items, "items")
        pairs = []
        if model.kind == ModelKind.CROSS_ENCODER:
            for item in token_items:
                first, second = (item, request.query) if request.item_first else (request.query, item)
                pairs.append((first + second, [0] * len(first) + [1] * len(second)))
        return Tokenized(list(request.query), token_items, pairs)
    tok = model.tokenizer
    texts: list[str] = list(items)  # type: ignore[arg-type]
    if model.kind == ModelKind.CROSS_ENCODER:
        firsts, seconds = (texts, [request.query] * len(texts)) if request.item_first else (
            [request.query] * len(texts), texts)
        encoded = tok(firsts, seconds, return_token_type_ids=True) if texts else {"input_ids": []}
        types = encoded.get("token_type_ids") or [[0] * len(ids) for ids in encoded["input_ids"]]
        return Tokenized([], [], list(zip(encoded["input_ids"], types, strict=True)))
    if model.kind == ModelKind.EMBEDDING:
        encoded = tok([request.query, *texts])["input_ids"]
        return Tokenized(encoded[0], encoded[1:])
    # Decoders: the tokenizer's specials where it puts them for the joined text (BOS first, EOS last).
    specials = model.specials
    first, second = (texts, [request.query]) if request.item_first else ([request.query], texts)
    lead = [specials.prefix + ids for ids in tok(first, add_special_tokens=False)["input_ids"]] if first else []
    tail = [ids + specials.suffix for ids in tok(second, add_special_tokens=False)["input_ids"]] if second else []
    return Tokenized(tail[0], lead) if request.item_first else Tokenized(lead[0], tail)


def _too_long(model: ScoringModel, length: int, what: str) -> None:
    if length > model.max_positions:
        raise BadRequest(f"{what}: sequence of {length} tokens exceeds the model's maximum of {model.max_positions}")
    if length == 0:
        raise BadRequest(f"{what}: empty sequence (empty query and empty item, no special tokens) cannot be scored")


def _pooled(pooling: Pooling, length: int) -> range:
    """The tokens of a sequence whose outputs are averaged into its pooled row."""
    return {Pooling.CLS: range(1), Pooling.MEAN: range(length), Pooling.LAST: range(length - 1, length)}[pooling]


def plan(model: ScoringModel, request: ScoreRequest, tokens: Tokenized, job: object, multi_item: bool,
         max_batch_tokens: int, delimiter: int | None) -> ScorePlan:
    """Pack units for one request; `job` is stored in each Pool's owner as (job, item index)."""
    start = model.position_start
    if model.kind == ModelKind.CROSS_ENCODER:
        units = []
        for i, (ids, types) in enumerate(tokens.pairs):
            _too_long(model, len(ids), f"items[{i}]")
            units.append(PackUnit(ids, token_types=types if model.uses_token_types else None,
                                  position_start=start, pools=[Pool(_pooled(model.pooling, len(ids)), (job, i))]))
        return ScorePlan(units, sum(u.num_tokens for u in units), False)
    if model.kind == ModelKind.EMBEDDING:
        units = []
        for slot, ids in [(QUERY_SLOT, tokens.query), *enumerate(tokens.items)]:
            _too_long(model, len(ids), "query" if slot == QUERY_SLOT else f"items[{slot}]")
            pool = Pool(_pooled(model.pooling, len(ids)), (job, slot))
            units.append(PackUnit(ids, position_start=start, pools=[pool]))
        return ScorePlan(units, sum(u.num_tokens for u in units), False)
    if multi_item and not request.item_first:
        return _plan_multi_item(model, tokens, job, max_batch_tokens, delimiter)
    units = []
    for i, item in enumerate(tokens.items):
        ids = item + tokens.query if request.item_first else tokens.query + item
        _too_long(model, len(ids), f"items[{i}]")
        units.append(PackUnit(ids, position_start=start, pools=[Pool(range(len(ids) - 1, len(ids)), (job, i))]))
    return ScorePlan(units, sum(u.num_tokens for u in units), False)


def _plan_multi_item(model: ScoringModel, tokens: Tokenized, job: object, max_batch_tokens: int,
                     delimiter: int | None) -> ScorePlan:
    """`query [D] item1 [D] item2 [D] …` split into chunks that fit the batch budget; every chunk repeats the query.
    Each delimiter closes the row before it, so only the delimiter itself could ever attend to it."""
    query = tokens.query
    tail = [] if delimiter is None else [delimiter]
    context = query + tail
    units: list[PackUnit] = []
    for i, item in enumerate(tokens.items):
        _too_long(model, len(query) + len(item), f"items[{i}]")
        row = item + tail
        unit = units[-1] if units else None
        if unit is None or (unit.items and unit.num_tokens + len(row) > max_batch_tokens):
            unit = PackUnit(list(context), visible_prefix=len(query), position_start=model.position_start)
            units.append(unit)
        # An empty item is scored at the query's last token (SGLang's semantics for "").
        offset = unit.num_tokens + len(item) - 1 if item else len(query) - 1
        unit.items.append(row)
        unit.pools.append(Pool(range(offset, offset + 1), (job, i)))
    return ScorePlan(units, sum(u.num_tokens for u in units), True)
