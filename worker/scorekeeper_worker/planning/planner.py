"""A scoring request as planning reads it (`ScoreAsk`: its own type, never a wire model; the HTTP routes map
/v1/score, /v1/rerank and /v1/embeddings bodies onto it, start-up probes, benchmarks and tests build it directly) →
tokenized sequences (encoding.py, template_encoding.py) → the pack units that score it (pure, CPU), with the planned
tokens admitted (`--max-request-tokens`) before any unit is built.

The early count (`refuse_early`): a text request that would run more tokens than --max-request-tokens is refused
once a count of part of it proves so, not after tokenizing megabytes (0.4 s of CPU per MB). The count is a lower
bound of what the plan would count: the query once and every item's own tokens (cut to `max_tokens_per_item`),
which every kind and mode runs at least. It tokenizes slices of the items in order and stops as soon as the bound
passes the limit. Requests it cannot help are not counted: token ids (their lengths are free), requests whose items
could not pass the limit even at one token per byte, and requests that ask to cut or chunk (their rows can be much
shorter than their text) or go through a prompt template.

Where a sequence is read and how it is numbered, as the model's own forward on it would do:
- The token a decoder's head reads: causal LMs the last token; classifiers and reward models
  (`*ForSequenceClassification`) the last token that is not `pad_token_id`, and token 0 when every token is pad
  (transformers' `(arange * (ids != pad)).argmax()`), so with pad = EOS the token before an appended EOS.
- Position ids: from `position_start` on, except in the RoBERTa family, which numbers them from the ids
  (`create_position_ids_from_input_ids`): pad tokens take `padding_idx` and do not advance the count.
- The RoPE table: the one the sequence's own length selects (model/trunk_patches.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekeeper_worker.base.errors import Invalid, TooLarge
from scorekeeper_worker.engine.queue.jobs import QUERY_SLOT
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.loader import ModelKind, Pooling, ScoringModel
from scorekeeper_worker.model.sentence_transformers import Prompt
from scorekeeper_worker.planning import template_encoding
from scorekeeper_worker.planning.bounded_tokens import bounded_ids
from scorekeeper_worker.planning.encoding import LengthRules, Tokenized, encode, plain_tokens


@dataclass(frozen=True)
class ScoreAsk:
    """One validated scoring request: a query and its items, all text or all token ids."""

    query: str | list[int]
    items: list[str] | list[list[int]]
    label_token_ids: list[int] | list[list[int]] | None = None  # causal LMs: one list, or one list per item
    apply_softmax: bool = False
    temperature: float = 1.0
    item_first: bool = False
    return_pooled_hidden_states: bool = False
    multi_item_scoring: bool | None = None  # None: the server's setting
    instruct: str | None = None  # fills the prompt template's {instruct}
    rules: LengthRules = field(default_factory=LengthRules)  # long inputs, and the field that names the items
    prompt_name: str | None = None  # embedding models: the sentence-transformers prompt instead of the default one
    embed: bool = False  # the items' embeddings alone, as pooled rows (/v1/embeddings): no query row
    model_name: str = "default"  # echoed in the response, so it counts in the response's size

    @property
    def text(self) -> bool:
        return isinstance(self.query, str)


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


@dataclass
class ScorePlan:
    units: list[PackUnit]
    prompt_tokens: int
    multi_item: bool


def _check_prompt(model: ScoringModel, request: ScoreAsk, text: bool) -> None:
    """`instruct` fills the server's prompt template (decoder models only: refused at start-up for others), which
    wraps text pairs only."""
    template = model.template
    if template is not None and text and request.item_first:
        raise Invalid("item_first", "this server's prompt template (--prompt-template) places the item itself")
    if request.instruct is None:
        return
    if template is None:
        raise Invalid("instruct", "this server has no prompt template (--prompt-template) to put it in")
    if not text:
        raise Invalid("instruct", "token-id inputs are used verbatim, without the prompt template; send text")
    if not template.has_instruct:
        raise Invalid("instruct", f"the prompt template {template.name} has no {{instruct}}")


def embedding_prompt(model: ScoringModel, prompt_name: str | None) -> Prompt | None:
    """The sentence-transformers prompt an embedding model's texts get: the named one, else the model's default
    (`SentenceTransformer.encode(prompt_name=...)`); 400 for a name the model does not have."""
    if model.kind != ModelKind.EMBEDDING:
        return None
    try:
        return model.sentence_config.prompt(prompt_name)
    except KeyError:
        names = ", ".join(repr(name) for name in sorted(model.sentence_config.prompts))
        raise Invalid("prompt_name", f"{prompt_name!r} is not one of this model's prompts ({names})") from None


def tokenize(model: ScoringModel, request: ScoreAsk) -> Tokenized:
    """The request's sequences: text pairs of a decoder through the server's prompt template when it has one
    (token ids are always used verbatim), everything else joined at token level. An embedding model's texts come
    after its sentence-transformers prompt (`prompt_name`, else its default one), tokenized with it as
    `SentenceTransformer.encode` does; `embed`: the items alone (/v1/embeddings)."""
    rules, query_row = request.rules, not request.embed
    text = request.text
    _check_prompt(model, request, text)
    if model.template is not None and text:
        return template_encoding.encode(model, model.template, request.query, request.items,  # type: ignore[arg-type]
                                        request.instruct, rules)
    prompt = embedding_prompt(model, request.prompt_name)
    if not text:  # token ids are used verbatim
        prompt = None
    query, items = request.query, request.items
    if prompt is not None:  # the query only when it is embedded (a prompt alone could be over the maximum)
        query = prompt.text + query if query_row else query  # type: ignore[operator]
        items = [prompt.text + item for item in items]  # type: ignore[operator]
    keep_first = prompt.plain if prompt is not None else 0  # max_tokens_per_item cuts the text, not its prompt
    inputs = plain_tokens(model, query, items, rules, keep_first)  # type: ignore[arg-type]
    inputs.item_first = request.item_first
    tokens = encode(model, inputs, rules)
    if prompt is not None and not model.sentence_config.include_prompt:
        tokens.pool_from = prompt.tokens
    return tokens


def _too_long(model: ScoringModel, length: int, what: str) -> None:
    if length > model.max_positions:
        raise Invalid(what, f"sequence of {length} tokens exceeds the model's maximum of {model.max_positions}")
    if length == 0:
        raise Invalid(what, "empty sequence (empty query and empty item, no special tokens) cannot be scored")


def _pooled(pooling: Pooling, length: int, first: int = 0) -> range:
    """The tokens of a sequence whose outputs are averaged into its pooled row; `first`: tokens before it are not
    pooled (sentence-transformers' include_prompt false)."""
    return {Pooling.CLS: range(first, first + 1), Pooling.MEAN: range(first, length),
            Pooling.LAST: range(length - 1, length)}[pooling]


SLICE_BYTES = 64 * 1024  # text tokenized per step: a few milliseconds


def refuse_early(model: ScoringModel, query: str | list[int], items: list[str] | list[list[int]],
                 rules: LengthRules, limit: int | None) -> None:
    if limit is None or not isinstance(query, str) or rules.truncate or rules.chunk or model.template is not None:
        return
    # Without an embedding model's prompt: a lower bound still (do_lower_case is in the tokenizer's normalizer).
    texts: list[str] = [query, *items]  # type: ignore[list-item]
    sizes = [len(text.encode("utf-8", "surrogatepass")) for text in texts]
    if sum(sizes) <= limit:  # a token is at least a byte: the bound cannot pass the limit
        return
    cap = rules.max_item_tokens
    counted, start, size = 0, 0, 0
    for end, text_size in enumerate(sizes, start=1):
        size += text_size
        if size < SLICE_BYTES and end < len(texts):
            continue
        # Each text counted up to one token past the model's maximum (`bounded_ids`): beyond it, the text
        # is refused as too long anyway (400), and its count stays a lower bound.
        slice_ids = bounded_ids(model.tokenizer, texts[start:end], [model.max_positions + 1] * (end - start), False)
        for i, tokens in enumerate(slice_ids, start):
            counted += len(tokens.ids) if i == 0 or cap is None else min(len(tokens.ids), cap)
        if counted > limit:
            raise TooLarge(
                f"{rules.field}: the request would run more than {limit} tokens through the model (counted "
                f"{counted} in its first {end - 1} of {len(texts) - 1} items and the query, each once), over this "
                "server's limit (--max-request-tokens); split it into smaller requests")
        start, size = end, 0


def admit(planned: int, limit: int | None, how: str, field: str) -> None:
    """The `--max-request-tokens` check, on the planned count, before any unit is built (so a request over it costs
    a pass over its lengths, never the tokens it would plan)."""
    if limit is not None and planned > limit:
        raise TooLarge(f"{field}: the request would run {planned} tokens through the model ({how}), over this "
                              f"server's limit of {limit} (--max-request-tokens); split it into smaller requests")


def _where(tokens: Tokenized, row: int) -> str:
    return f"{tokens.field}[{tokens.rows_of[row]}]"


def mis_chunks(context: int, rows: list[int], max_batch_tokens: int) -> list[range]:
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


def plan(model: ScoringModel, request: ScoreAsk, tokens: Tokenized, multi_item: bool, max_batch_tokens: int,
         delimiter: int | None, max_request_tokens: int | None = None) -> ScorePlan:
    """Pack units for one request, each pool keyed by the row it fills (an item's index, or QUERY_SLOT). Lengths
    are checked and the planned tokens admitted (`max_request_tokens`) before any unit is built. Embedding models
    embed the query too, unless the request embeds its items alone (/v1/embeddings)."""
    start, field, query_row = model.position_start, tokens.field, not request.embed
    if model.kind == ModelKind.CROSS_ENCODER:
        pair = tokens.pair
        assert pair is not None
        lengths = [pair.overhead + len(tokens.query) + len(item) for item in tokens.items]
        for row, length in enumerate(lengths):
            _too_long(model, length, _where(tokens, row))
        planned = sum(lengths)
        admit(planned, max_request_tokens, "the query is repeated for every item", field)
        units = []
        for row, (item, length) in enumerate(zip(tokens.items, lengths, strict=True)):
            ids, types = pair.join(item, tokens.query) if request.item_first else pair.join(tokens.query, item)
            units.append(PackUnit(ids, token_types=types if model.uses_token_types else None, position_start=start,
                                  positions=positions(model, ids), rope_table=rope_table(model, length),
                                  pools=[Pool(_pooled(model.pooling, length), row)]))
        return ScorePlan(units, planned, False)
    if model.kind == ModelKind.EMBEDDING:
        sequences = [(QUERY_SLOT, tokens.query)] if query_row else []
        sequences += enumerate(tokens.items)
        for slot, ids in sequences:
            where = "query" if slot == QUERY_SLOT else _where(tokens, slot)
            _too_long(model, len(ids), where)
            if tokens.pool_from >= len(ids):
                raise Invalid(where, f"nothing left to pool after the model's prompt ({tokens.pool_from} tokens, "
                                 "which its pooling leaves out: include_prompt false) within its maximum of "
                                 f"{model.max_positions} tokens")
        planned = sum(len(ids) for _, ids in sequences)
        admit(planned, max_request_tokens, "the query and every item once" if query_row else "every input once",
               field)
        units = [PackUnit(ids, position_start=start, positions=positions(model, ids),
                          rope_table=rope_table(model, len(ids)),
                          pools=[Pool(_pooled(model.pooling, len(ids), tokens.pool_from), slot)])
                 for slot, ids in sequences]
        return ScorePlan(units, planned, False)
    query = tokens.query
    for row, item in enumerate(tokens.items):
        _too_long(model, len(query) + len(item), _where(tokens, row))
    if multi_item and not request.item_first:
        return _plan_multi_item(model, tokens, max_batch_tokens, delimiter, max_request_tokens)
    planned = len(tokens.items) * len(query) + sum(len(item) for item in tokens.items)
    admit(planned, max_request_tokens, "the query is repeated for every item", field)
    units = []
    for row, item in enumerate(tokens.items):
        ids = item + query if request.item_first else query + item
        read = read_index(model, ids)
        units.append(PackUnit(ids, position_start=start, rope_table=rope_table(model, len(ids)),
                              pools=[Pool(range(read, read + 1), row)]))
    return ScorePlan(units, planned, False)


def _plan_multi_item(model: ScoringModel, tokens: Tokenized, max_batch_tokens: int, delimiter: int | None,
                     max_request_tokens: int | None) -> ScorePlan:
    """`query [D] item1 [D] item2 [D] …` split into chunks that fit the batch budget; every chunk repeats the query.
    Each delimiter closes the row before it, so only the delimiter itself could ever attend to it. Items whose
    sequences take different RoPE tables go to different chunks (the query row is computed with its items' table),
    and an item whose delimiter would sit past the model's last position runs as a single sequence."""
    query, items = tokens.query, tokens.items
    tail = [] if delimiter is None else [delimiter]
    context = query + tail
    shared = [i for i, item in enumerate(items) if len(query) + len(item) + len(tail) <= model.max_positions]
    alone = sorted(set(range(len(items))) - set(shared))
    groups: dict[int, list[int]] = {}
    for i in shared:
        groups.setdefault(rope_table(model, len(query) + len(items[i])), []).append(i)
    chunks = [(table, [group[k] for k in chunk]) for table, group in groups.items()
              for chunk in mis_chunks(len(context), [len(items[i]) + len(tail) for i in group], max_batch_tokens)]
    planned = (len(chunks) * len(context) + sum(len(items[i]) + len(tail) for i in shared)
               + sum(len(query) + len(items[i]) for i in alone))
    admit(planned, max_request_tokens, f"the query is repeated in each of {len(chunks)} multi-item chunks",
           tokens.field)
    units: list[PackUnit] = []
    for table, chunk in chunks:
        unit = PackUnit(list(context), visible_prefix=len(query), position_start=model.position_start,
                        rope_table=table)
        for i in chunk:
            # Read where the joined sequence is read: in the item, or in the query row (an empty item: SGLang's
            # semantics for "", or an item of pad tokens only under a classifier).
            read = read_index(model, query + items[i])
            offset = read if read < len(query) else unit.num_tokens + read - len(query)
            unit.items.append(items[i] + tail)
            unit.pools.append(Pool(range(offset, offset + 1), i))
        units.append(unit)
    for i in alone:
        ids = query + items[i]
        read = read_index(model, ids)
        units.append(PackUnit(ids, position_start=model.position_start, rope_table=rope_table(model, len(ids)),
                              pools=[Pool(range(read, read + 1), i)]))
    return ScorePlan(units, planned, True)
