"""One scoring request from its checks to its queued job: every limit checked before the work it bounds (the
response's size and the largest intermediate from its shape, its tokens and its longest sequence once planned), then
the tokens, the plan and the job that absorbs its rows. Pure and synchronous (a worker thread runs it for the service;
start-up's probes, benchmarks and tests call it directly, `serving/direct.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from scorekeeper_worker.base.config import PooledHiddenStates, WorkerConfig
from scorekeeper_worker.base.errors import IntermediateTooLarge, Invalid, ResponseTooLarge
from scorekeeper_worker.engine.queue.jobs import JobResult, ScoreJob
from scorekeeper_worker.engine.runner.forward import NORMALISER_ELEMENTS
from scorekeeper_worker.engine.runner.packing import PackUnit
from scorekeeper_worker.model.kernels.tiled import TILE_ELEMENTS
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.planning.encoding import check_token_ids
from scorekeeper_worker.planning.planner import ScoreAsk, ScorePlan, plan, refuse_early, tokenize
from scorekeeper_worker.planning.readable_ids import check_rows

# An upper bound of the JSON a response takes: the longest float Python writes ("-1.2345678901234567e-308") and its
# comma; the brackets and commas of an item's score and pooled lists; the fixed fields (usage, object) with room to
# spare, plus the echoed model name at up to 6 bytes per character (JSON escapes).
JSON_FLOAT_BYTES = 25
JSON_ITEM_BYTES = 6
JSON_ESCAPE_BYTES = 6
RESPONSE_OVERHEAD_BYTES = 1024


def label_lists(model: ScoringModel, request: ScoreAsk, num_items: int) -> list[list[int]] | None:
    if model.kind != ModelKind.CAUSAL_LM:
        return None  # ignored for classifier, reward, cross-encoder and embedding models (SGLang does the same)
    labels = request.label_token_ids if request.label_token_ids is not None else model.default_labels
    if labels is None:
        raise Invalid("label_token_ids", "required for causal LM models (this server has no --label-tokens)")
    per_item = bool(labels) and isinstance(labels[0], list)
    lists: list[list[int]] = labels if per_item else [labels] * num_items  # type: ignore[list-item,assignment]
    if per_item and len(lists) != num_items:
        raise Invalid("label_token_ids", f"{len(lists)} lists for {num_items} items; give one list per item")
    for at, row in enumerate(lists if per_item else [labels]):  # type: ignore[arg-type]
        if not row:
            raise Invalid("label_token_ids", "must not be empty")
        if len(row) == 1 and request.apply_softmax:
            where = f"label_token_ids[{at}]" if per_item else "label_token_ids"
            raise Invalid(where, "a single label token under apply_softmax scores every item 1.0 (a softmax "
                             "over one logit); send it with its alternatives, or apply_softmax false for its "
                             "probability")
        if len(set(row)) != len(row):
            raise Invalid("label_token_ids", "must not contain duplicates")
        for token in row:
            if not 0 <= token < model.logit_size:
                raise Invalid("label_token_ids", f"token id {token} is out of range [0, {model.logit_size}) "
                                 "(the model's logit size)")
    return lists


def check_response_bytes(model: ScoringModel, request: ScoreAsk, labels: list[list[int]] | None, limit: int) -> None:
    """`--max-response-bytes`, before any work: an upper bound of the JSON response from the request's shape."""
    items, embed = len(request.items), request.embed
    scores = sum(len(row) for row in labels) if labels is not None else \
        items * (1 if model.kind == ModelKind.EMBEDDING else model.logit_size)
    pooled = items * model.hidden_size if request.return_pooled_hidden_states or embed else 0
    bound = (RESPONSE_OVERHEAD_BYTES + JSON_ESCAPE_BYTES * len(request.model_name) + items * JSON_ITEM_BYTES
             + (scores + pooled) * JSON_FLOAT_BYTES)
    if bound > limit:
        field = "input" if embed else "return_pooled_hidden_states" if pooled else \
            "label_token_ids" if labels is not None else "items"
        what = f"{items} items × {model.hidden_size} pooled floats" if pooled else f"{scores} scores"
        raise ResponseTooLarge(field, f"the response could reach {bound} bytes ({what}), over this server's "
                               f"limit of {limit} (--max-response-bytes); ask for fewer items per request")


# The largest intermediate one request makes the worker hold at once, from its shape, before any forward.
#
# Each step of a request's computation holds tensors whose size the request sets; the largest of them is what a
# request can cost beyond its batch, and `--max-intermediate-bytes` bounds it (a 400 naming the field that sets it).
# Before tokenization the request's shape gives (`shape_intermediates`):
# - its score rows: scored rows × scores per row, in float64 (the heads' softmax and sigmoid run in float64); a
#   causal LM's scores per row are its label list;
# - the label rows of a causal LM's output embedding: its longest label list × hidden, in the model's dtype (one
#   product per distinct list, `rows @ W[labels].T`: never items × labels × hidden);
# - its pooled rows: scored rows × hidden in float32 (what `return_pooled_hidden_states` and embeddings return);
# - a causal LM's true probabilities (`apply_softmax` false): vocabulary logits, a chunk of rows at a time
#   (engine/runner/forward.py: NORMALISER_ELEMENTS).
# Once planned, its longest unit (a sequence, or a multi-item group) gives (`token_intermediates`):
# - the trunk's activations: the unit's tokens × the widest layer (hidden, MLP, attention heads), in the model's dtype;
# - attention scores: heads × tokens² of the unit, in float32, at most one tile (model/kernels/tiled.py).
# A batch holds the units of several requests: those terms are also bounded by --max-batch-tokens, whatever the
# request; a request's own unit can exceed that budget only by itself.
FLOAT32, FLOAT64 = 4, 8


@dataclass(frozen=True)
class Intermediate:
    """One tensor a request makes the worker hold: its size, the request field that sets it, and what it is."""

    nbytes: int
    field: str
    what: str


def shape_intermediates(model: ScoringModel, ask: ScoreAsk, labels: list[list[int]] | None,
                        rows_of: list[int] | None = None) -> list[Intermediate]:
    """The intermediates a request's shape sets (`labels`: a causal LM's list per item): before it is tokenized, one
    scored row per item; once planned, `rows_of` (the item behind each row: a chunked document has one per window)."""
    rows_of = list(range(len(ask.items))) if rows_of is None else rows_of
    rows, hidden, field = len(rows_of), model.hidden_size, ask.rules.field
    dtype_bytes = model.dtype.itemsize
    found = [Intermediate(rows * hidden * FLOAT32, field, f"pooled rows ({rows} × {hidden} floats)")]
    if labels is not None:
        longest = max(map(len, labels), default=0)
        scores = sum(len(labels[item]) for item in rows_of)
        found += [Intermediate(scores * FLOAT64, "label_token_ids", f"label scores ({scores} float64)"),
                  Intermediate(longest * hidden * dtype_bytes, "label_token_ids",
                               f"label rows of the output embedding ({longest} × {hidden})")]
        if not ask.apply_softmax:  # the full vocabulary's normaliser
            found.append(vocabulary_logits(model, rows, "apply_softmax"))
    elif not ask.embed and model.kind != ModelKind.EMBEDDING:
        found.append(Intermediate(rows * model.logit_size * FLOAT64, field,
                                  f"class scores ({rows} × {model.logit_size} float64)"))
    return found


def vocabulary_logits(model: ScoringModel, rows: int, field: str) -> Intermediate:
    """A causal LM's logits over its whole vocabulary, a chunk of rows at a time (true probabilities, decisions)."""
    chunk = min(rows, max(1, NORMALISER_ELEMENTS // model.logit_size))
    return Intermediate(chunk * model.logit_size * FLOAT32, field, f"vocabulary logits ({chunk} rows × "
                        f"{model.logit_size})")


def widest_layer(model: ScoringModel) -> int:
    """The widest activation per token: hidden, the MLP's inner size, or the attention heads' queries."""
    config = model.model.config
    heads = getattr(config, "num_attention_heads", 0) or 0
    head_dim = getattr(config, "head_dim", None) or (model.hidden_size // heads if heads else 0)
    return max(model.hidden_size, getattr(config, "intermediate_size", 0) or 0, heads * head_dim)


def longest_unit(units: list[PackUnit]) -> int:
    return max((unit.num_tokens for unit in units), default=0)


def token_intermediates(model: ScoringModel, tokens: int, field: str) -> list[Intermediate]:
    """The intermediates a sequence of `tokens` (a planned request's longest unit) sets in the trunk."""
    heads = getattr(model.model.config, "num_attention_heads", 1) or 1
    width = widest_layer(model)
    attention = min(heads * tokens * tokens, max(TILE_ELEMENTS, heads * tokens))
    return [Intermediate(tokens * width * model.dtype.itemsize, field,
                         f"trunk activations ({tokens} tokens × {width})"),
            Intermediate(attention * FLOAT32, field, f"attention scores ({heads} heads × {tokens} tokens, tiled)")]


def largest(found: list[Intermediate]) -> Intermediate:
    return max(found, key=lambda intermediate: intermediate.nbytes)


def check_intermediates(found: list[Intermediate], limit: int) -> None:
    """`--max-intermediate-bytes`, before any forward: the largest tensor the request would make the worker hold."""
    worst = largest(found)
    if worst.nbytes > limit:
        raise IntermediateTooLarge(worst.field, f"the request needs {worst.nbytes} bytes at once for its {worst.what}, "
                                   f"over this server's limit of {limit} (--max-intermediate-bytes); ask for fewer "
                                   "items, labels or tokens per request")


@dataclass(frozen=True)
class Limits:
    """The server's per-request limits and multi-item settings (from WorkerConfig); the defaults bound nothing, for
    requests that the worker makes itself."""

    max_items: int = 1 << 30
    pooled_hidden_states: bool = True
    max_response_bytes: int = 1 << 62
    max_request_tokens: int | None = None
    max_batch_tokens: int = 1 << 20
    multi_item: bool = False  # the server's default; a request may override it
    delimiter: int | None = None
    max_intermediate_bytes: int = 1 << 62

    @staticmethod
    def of(config: WorkerConfig) -> Limits:
        return Limits(config.max_items_per_request, config.pooled_hidden_states != PooledHiddenStates.FORBIDDEN,
                      config.max_response_bytes, config.max_request_tokens, config.max_batch_tokens,
                      config.mis_enabled, config.multi_item_scoring_delimiter, config.max_intermediate_bytes)


@dataclass
class Prepared:
    """A request's job, its plan and the request item behind each scored row."""

    job: ScoreJob
    plan: ScorePlan
    rows_of: list[int]


def check(model: ScoringModel, ask: ScoreAsk, limits: Limits) -> list[list[int]] | None:
    """The checks that need only the request's shape; the label lists of a causal LM."""
    if len(ask.items) > limits.max_items:
        raise Invalid(ask.rules.field, f"{len(ask.items)} items exceed the limit of {limits.max_items}")
    labels = label_lists(model, ask, len(ask.items))
    if isinstance(ask.query, list) and not ask.items:  # nothing is tokenized then, but the ids are still read
        check_token_ids(model, [ask.query], "query")
    if ask.return_pooled_hidden_states:
        if model.kind == ModelKind.CAUSAL_LM:
            raise Invalid("return_pooled_hidden_states", "not supported for causal LM models; it needs a "
                          "model with a task head (classifier, reward, cross-encoder) or an embedding model")
        if not limits.pooled_hidden_states:
            raise Invalid("return_pooled_hidden_states", "disabled on this server")
    check_response_bytes(model, ask, labels, limits.max_response_bytes)
    check_intermediates(shape_intermediates(model, ask, labels), limits.max_intermediate_bytes)
    return labels


def prepare(model: ScoringModel, ask: ScoreAsk, labels: list[list[int]] | None, limits: Limits,
            future: asyncio.Future[JobResult], loop: asyncio.AbstractEventLoop) -> Prepared:
    """Tokens, plan and job of a checked request with items: --max-request-tokens from a bounded count before a
    text request is tokenized whole (issue 26), then exactly on the plan."""
    refuse_early(model, ask.query, ask.items, ask.rules, limits.max_request_tokens)
    tokens = tokenize(model, ask)
    vocab = model.vocabulary  # fields only: the usual model, every id with a row, never enters readable_ids.py
    if ask.text and vocab is not None and vocab.tokenizer_ids > vocab.input_rows:  # ids: checked as read
        field = ask.rules.field
        texts = [("query", ask.query), *((f"{field}[{i}]", item) for i, item in enumerate(ask.items)),
                 *([("instruct", ask.instruct)] if ask.instruct else [])]
        check_rows(model, [tokens.query, *tokens.items], ["query", *(f"{field}[{i}]" for i in tokens.rows_of)],
                   texts)  # type: ignore[arg-type]
    multi_item = model.is_decoder and (ask.multi_item_scoring if ask.multi_item_scoring is not None
                                       else limits.multi_item)
    score_plan = plan(model, ask, tokens, multi_item, limits.max_batch_tokens, limits.delimiter,
                      limits.max_request_tokens)
    windows = shape_intermediates(model, ask, labels, tokens.rows_of) if len(tokens.rows_of) > len(ask.items) else []
    check_intermediates([*windows, *token_intermediates(model, longest_unit(score_plan.units), ask.rules.field)],
                        limits.max_intermediate_bytes)
    job = ScoreJob(num_items=len(tokens.items), kind=model.kind, apply_softmax=ask.apply_softmax,
                   temperature=ask.temperature,
                   labels=None if labels is None else [labels[item] for item in tokens.rows_of],
                   want_pooled=ask.return_pooled_hidden_states or ask.embed, embed=ask.embed,
                   prompt_tokens=score_plan.prompt_tokens, multi_item=score_plan.multi_item, future=future, loop=loop)
    return Prepared(job, score_plan, tokens.rows_of)
