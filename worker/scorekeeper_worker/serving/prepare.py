"""One scoring request from its checks to its queued job: every limit checked before the work it bounds, then the
tokens, the plan and the job that absorbs its rows. Pure and synchronous (a worker thread runs it for the service;
start-up's probes, benchmarks and tests call it directly, `serving/direct.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from scorekeeper_worker.base.config import PooledHiddenStates, WorkerConfig
from scorekeeper_worker.base.errors import Invalid, ResponseTooLarge
from scorekeeper_worker.engine.queue.jobs import JobResult, ScoreJob
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

    @staticmethod
    def of(config: WorkerConfig) -> Limits:
        return Limits(config.max_items_per_request, config.pooled_hidden_states != PooledHiddenStates.FORBIDDEN,
                      config.max_response_bytes, config.max_request_tokens, config.max_batch_tokens,
                      config.mis_enabled, config.multi_item_scoring_delimiter)


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
    job = ScoreJob(num_items=len(tokens.items), kind=model.kind, apply_softmax=ask.apply_softmax,
                   temperature=ask.temperature,
                   labels=None if labels is None else [labels[item] for item in tokens.rows_of],
                   want_pooled=ask.return_pooled_hidden_states or ask.embed, embed=ask.embed,
                   prompt_tokens=score_plan.prompt_tokens, multi_item=score_plan.multi_item, future=future, loop=loop)
    return Prepared(job, score_plan, tokens.rows_of)
