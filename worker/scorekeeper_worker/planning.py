"""Validated request → tokenized sequences → the pack units that score it (pure, CPU).

Query and items are tokenized separately and joined at token level (spec: "Score semantics"), which is what makes
multi-item scores equal single-item scores of the same token sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekeeper_worker.loader import ModelKind, Pooling, ScoringModel
from scorekeeper_worker.packing import PackUnit, Pool
from scorekeeper_worker.schemas import BadRequest, RequestTooLarge, ScoreRequest

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


def _admit(planned: int, limit: int | None, how: str) -> None:
    """The `--max-request-tokens` check, on the planned count, before any unit is built (so a request over it costs
    a pass over its lengths, never the tokens it would plan)."""
    if limit is not None and planned > limit:
        raise RequestTooLarge(f"items: the request would run {planned} tokens through the model ({how}), over this "
                              f"server's limit of {limit} (--max-request-tokens); split it into smaller requests")


def admit_pairs(model: ScoringModel, request: ScoreRequest, max_request_tokens: int | None) -> None:
    """Cross-encoders encode every (query, item) pair during tokenization, i.e. items × query tokens before `plan`
    can check anything: refuse a request whose query alone, repeated per item, is already over the limit (one
    pass over the query)."""
    items = request.item_list
    if model.kind != ModelKind.CROSS_ENCODER or not items or max_request_tokens is None:
        return
    query = request.query if isinstance(request.query, list) else \
        model.tokenizer(request.query, add_special_tokens=False)["input_ids"]
    _admit(len(items) * len(query or []), max_request_tokens, "the query is repeated for every item")


def _mis_chunks(context: int, rows: list[int], max_batch_tokens: int) -> list[range]:
    """Items per multi-item chunk: the context (query + delimiter) and as many item rows as fit the batch budget,
    at least one."""
    chunks: list[range] = []
    first, size = 0, context
    for i, row in enumerate(rows):
        if i > first and size + row > max_batch_tokens:
            chunks.append(range(first, i))
            first, size = i, context
        size += row
    if rows:
        chunks.append(range(first, len(rows)))
    return chunks


def plan(model: ScoringModel, request: ScoreRequest, tokens: Tokenized, job: object, multi_item: bool,
         max_batch_tokens: int, delimiter: int | None, max_request_tokens: int | None = None) -> ScorePlan:
    """Pack units for one request; `job` is stored in each Pool's owner as (job, item index). Lengths are checked
    and the planned tokens admitted (`max_request_tokens`) before any unit is built."""
    start = model.position_start
    if model.kind == ModelKind.CROSS_ENCODER:
        for i, (ids, _) in enumerate(tokens.pairs):
            _too_long(model, len(ids), f"items[{i}]")
        planned = sum(len(ids) for ids, _ in tokens.pairs)
        _admit(planned, max_request_tokens, "the query is repeated for every item")
        units = [PackUnit(ids, token_types=types if model.uses_token_types else None, position_start=start,
                          pools=[Pool(_pooled(model.pooling, len(ids)), (job, i))])
                 for i, (ids, types) in enumerate(tokens.pairs)]
        return ScorePlan(units, planned, False)
    if model.kind == ModelKind.EMBEDDING:
        sequences = [(QUERY_SLOT, tokens.query), *enumerate(tokens.items)]
        for slot, ids in sequences:
            _too_long(model, len(ids), "query" if slot == QUERY_SLOT else f"items[{slot}]")
        planned = sum(len(ids) for _, ids in sequences)
        _admit(planned, max_request_tokens, "the query and every item once")
        units = [PackUnit(ids, position_start=start, pools=[Pool(_pooled(model.pooling, len(ids)), (job, slot))])
                 for slot, ids in sequences]
        return ScorePlan(units, planned, False)
    query = tokens.query
    for i, item in enumerate(tokens.items):
        _too_long(model, len(query) + len(item), f"items[{i}]")
    if multi_item and not request.item_first:
        return _plan_multi_item(model, tokens, job, max_batch_tokens, delimiter, max_request_tokens)
    planned = len(tokens.items) * len(query) + sum(len(item) for item in tokens.items)
    _admit(planned, max_request_tokens, "the query is repeated for every item")
    units = []
    for i, item in enumerate(tokens.items):
        ids = item + query if request.item_first else query + item
        units.append(PackUnit(ids, position_start=start, pools=[Pool(range(len(ids) - 1, len(ids)), (job, i))]))
    return ScorePlan(units, planned, False)


def _plan_multi_item(model: ScoringModel, tokens: Tokenized, job: object, max_batch_tokens: int,
                     delimiter: int | None, max_request_tokens: int | None) -> ScorePlan:
    """`query [D] item1 [D] item2 [D] …` split into chunks that fit the batch budget; every chunk repeats the query.
    Each delimiter closes the row before it, so only the delimiter itself could ever attend to it."""
    query = tokens.query
    tail = [] if delimiter is None else [delimiter]
    context = query + tail
    rows = [len(item) + len(tail) for item in tokens.items]
    chunks = _mis_chunks(len(context), rows, max_batch_tokens)
    planned = len(chunks) * len(context) + sum(rows)
    _admit(planned, max_request_tokens, f"the query is repeated in each of {len(chunks)} multi-item chunks")
    units: list[PackUnit] = []
    for chunk in chunks:
        unit = PackUnit(list(context), visible_prefix=len(query), position_start=model.position_start)
        for i in chunk:
            item = tokens.items[i]
            # An empty item is scored at the query's last token (SGLang's semantics for "").
            offset = unit.num_tokens + len(item) - 1 if item else len(query) - 1
            unit.items.append(item + tail)
            unit.pools.append(Pool(range(offset, offset + 1), (job, i)))
        units.append(unit)
    return ScorePlan(units, planned, True)
