"""The scoring service: request checks against the loaded model, tokenization, submission, response assembly."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import torch

from scorekeeper_worker.config import Device, DType, PooledHiddenStates, Quantization, WorkerConfig
from scorekeeper_worker.contract.errors import NonFiniteScore, NotReady, RequestTimedOut, ResponseTooLarge
from scorekeeper_worker.contract.schemas import BadRequest, ScoreRequest, ScoreResponse, Usage
from scorekeeper_worker.engine import cpu_memory, cpu_threads
from scorekeeper_worker.engine.cuda_graphs import GraphRunner
from scorekeeper_worker.engine.executor import Executor
from scorekeeper_worker.engine.jobs import JobResult, ScoreJob
from scorekeeper_worker.engine.scheduler import Scheduler
from scorekeeper_worker.kernels.attention import LayoutKind
from scorekeeper_worker.kernels.flex import resolve_backend
from scorekeeper_worker.kernels.onednn_linear import fuse_linears
from scorekeeper_worker.metrics import WorkerMetrics
from scorekeeper_worker.model.decision_template import DecisionTemplate, resolve_decision_template
from scorekeeper_worker.model.loader import ModelKind, ScoringModel, load_model
from scorekeeper_worker.model.prompt_template import load_template, resolve_label_tokens
from scorekeeper_worker.planning.encoding import LengthRules
from scorekeeper_worker.planning.planner import ScorePlan, length_rules, plan, tokenize
from scorekeeper_worker.planning.token_budget import refuse_early
from scorekeeper_worker.serving import decision_selfcheck, quantization, selfcheck
from scorekeeper_worker.serving.gc_pauses import freeze_after_load

log = logging.getLogger(__name__)
T = TypeVar("T")


# An upper bound of the JSON a response takes: the longest float Python writes ("-1.2345678901234567e-308") and its
# comma; the brackets and commas of an item's score and pooled lists; the fixed fields (usage, object) with room to
# spare, plus the echoed model name at up to 6 bytes per character (JSON escapes).
JSON_FLOAT_BYTES = 25
JSON_ITEM_BYTES = 6
JSON_ESCAPE_BYTES = 6
RESPONSE_OVERHEAD_BYTES = 1024


@dataclass
class Scored:
    """A request's score rows (one per scored sequence: an item, or a window of a chunked document), the request
    item behind each row, and the tokens that ran."""

    rows: list[list[float]]
    pooled: list[list[float]] | None
    rows_of: list[int]
    prompt_tokens: int
    multi_item: bool


def label_lists(model: ScoringModel, request: ScoreRequest, num_items: int) -> list[list[int]] | None:
    if model.kind != ModelKind.CAUSAL_LM:
        return None  # ignored for classifier, reward, cross-encoder and embedding models (SGLang does the same)
    labels = request.label_token_ids if request.label_token_ids is not None else model.default_labels
    if labels is None:
        raise BadRequest("label_token_ids is required for causal LM models (this server has no --label-tokens)")
    per_item = bool(labels) and isinstance(labels[0], list)
    lists: list[list[int]] = labels if per_item else [labels] * num_items  # type: ignore[list-item,assignment]
    if per_item and len(lists) != num_items:
        raise BadRequest(f"label_token_ids: {len(lists)} lists for {num_items} items; give one list per item")
    for at, row in enumerate(lists if per_item else [labels]):  # type: ignore[arg-type]
        if not row:
            raise BadRequest("label_token_ids must not be empty")
        if len(row) == 1 and request.apply_softmax:
            where = f"label_token_ids[{at}]" if per_item else "label_token_ids"
            raise BadRequest(f"{where}: a single label token under apply_softmax scores every item 1.0 (a softmax "
                             "over one logit); send it with its alternatives, or apply_softmax false for its "
                             "probability")
        if len(set(row)) != len(row):
            raise BadRequest("label_token_ids must not contain duplicates")
        for token in row:
            if not 0 <= token < model.logit_size:
                raise BadRequest(f"label_token_ids: token id {token} is out of range [0, {model.logit_size}) "
                                 "(the model's logit size)")
    return lists


def _check_response_bytes(model: ScoringModel, request: ScoreRequest, labels: list[list[int]] | None,
                          limit: int, embed: bool) -> None:
    """`--max-response-bytes`, before any work: an upper bound of the JSON response from the request's shape."""
    items = len(request.item_list)
    scores = sum(len(row) for row in labels) if labels is not None else \
        items * (1 if model.kind == ModelKind.EMBEDDING else model.logit_size)
    pooled = items * model.hidden_size if request.return_pooled_hidden_states or embed else 0
    bound = (RESPONSE_OVERHEAD_BYTES + JSON_ESCAPE_BYTES * len(request.model) + items * JSON_ITEM_BYTES
             + (scores + pooled) * JSON_FLOAT_BYTES)
    if bound > limit:
        field = "input" if embed else "return_pooled_hidden_states" if pooled else \
            "label_token_ids" if labels is not None else "items"
        what = f"{items} items × {model.hidden_size} pooled floats" if pooled else f"{scores} scores"
        raise ResponseTooLarge(f"{field}: the response could reach {bound} bytes ({what}), over this server's "
                               f"limit of {limit} (--max-response-bytes); ask for fewer items per request")


def _response(request: ScoreRequest, scored: Scored) -> ScoreResponse:
    """The response model (validates every float: a worker thread for large responses)."""
    usage = Usage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens)
    return ScoreResponse(scores=scored.rows, pooled_hidden_states=scored.pooled, model=request.model, usage=usage)


class ScoringService:
    def __init__(self, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.model: ScoringModel | None = None
        self.scheduler: Scheduler | None = None
        self.decision_template: DecisionTemplate | None = None  # causal LMs: /v1/decisions, /v1/systemone
        self.ready = False
        self.failed = False
        self.failure: str | None = None  # why loading failed: one paragraph, for the log and the termination message

    def load(self) -> None:
        """Load, prove the engine on this model (self-check, which also warms it up), start the model thread; only
        then report ready. Any failure is raised with a message saying why (the caller exits non-zero with it)."""
        started = time.perf_counter()
        config = self.config
        threads = cpu_threads.resolve(config.threads)
        cpu_threads.apply(threads)  # before any parallel work: loading is the first
        self.metrics.cpu_threads.set(threads.threads)
        if config.device == Device.CPU:
            cpu_memory.keep_freed_memory()
        # int8 is quantized from, and certified against, the float32 weights.
        dtype = DType.FLOAT32 if config.quantization == Quantization.INT8 else config.dtype
        model = load_model(config.model, dtype, config.device.value, config.name)
        if config.onednn_linear and model.device.type == "cpu" and model.dtype == torch.float32 and \
                config.quantization == Quantization.NONE:  # int8 converts the plain float32 modules
            log.info("oneDNN linear layers: %d", fuse_linears(model.trunk))
        self._prompt(model)
        delimiter = config.multi_item_scoring_delimiter
        if delimiter is not None and delimiter >= model.model.get_input_embeddings().num_embeddings:
            raise ValueError(f"--multi-item-scoring-delimiter {delimiter} is outside the vocabulary "
                             f"(size {model.model.get_input_embeddings().num_embeddings})")
        if config.cuda_graph and not model.packed:
            raise ValueError(f"--cuda-graph: {model.support.model_type} runs its own attention on padded batches "
                             "(docs/support-matrix.md), which the CUDA-graph buckets do not capture")
        self.metrics.model_load_seconds.set(time.perf_counter() - started)
        self.metrics.info.info({"model": model.name, "kind": model.kind.value,
                                "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device)})
        executor = self._executor(model)
        check = selfcheck.run(model, executor, check=config.self_check, max_batch_tokens=config.max_batch_tokens,
                              max_items=config.max_items_per_request, multi_item=config.mis_enabled,
                              delimiter=delimiter)
        self.metrics.warmup_seconds.set(check.engine_seconds)
        self.metrics.self_check_tolerance.set(check.tolerance)
        if self.decision_template is not None and check.deviation is not None:
            decided = decision_selfcheck.run(model, executor, self.decision_template, config.mis_enabled)
            check = dataclasses.replace(check, deviation=max(check.deviation, decided))
        if check.deviation is None:
            log.warning("self-check skipped (--no-self-check): scores are not compared with transformers at start-up")
        else:
            self.metrics.self_check_deviation.set(check.deviation)
            log.info("self-check passed: deviation %.3g (tolerance %g) on %d sequences, %d tokens in two batches; "
                     "engine %.3f s, reference %.3f s", check.deviation, check.tolerance, check.sequences,
                     check.tokens, check.engine_seconds, check.reference_seconds)
        if config.quantization == Quantization.INT8:
            executor = self._int8(model, executor, threads.threads)
        self.model = model
        if config.gc_freeze:
            self.metrics.gc_frozen_objects.set(freeze_after_load())
        self.scheduler = Scheduler(executor, config.max_batch_tokens, config.max_queue_tokens, self.metrics)
        self.scheduler.start()
        self.ready = True
        self.metrics.ready.set(1)
        log.info("ready: %s", model.name)

    def _int8(self, model: ScoringModel, reference: Executor, threads: int) -> Executor:
        """The int8 engine, certified against the float32 one (`reference`), or CertificateFailed."""
        executor, certificate = quantization.int8_executor(model, reference, self.config, threads)
        self.metrics.int8_max_score_delta.set(certificate.max_score_delta)
        self.metrics.int8_spearman.set(certificate.spearman)
        self.metrics.int8_top10.set(certificate.top10)
        self.metrics.int8_speedup.set(certificate.speedup)
        quantization.check(certificate, self.config)
        return executor

    def _prompt(self, model: ScoringModel) -> None:
        """--prompt-template and --label-tokens, resolved once with the model's tokenizer (or refused: the worker
        does not start with a prompt that cannot apply, or a label that is not one token)."""
        config = self.config
        template = load_template(config.prompt_template) if config.prompt_template is not None else None
        if template is not None and not model.is_decoder:
            raise ValueError(f"--prompt-template {template.name}: a prompt template wraps (query, item) pairs for "
                             "decoder models (causal LMs and decoder classifiers); this model is a "
                             f"{model.kind.value}")
        labels, source = config.label_tokens, "--label-tokens"
        if labels is None and template is not None and model.kind == ModelKind.CAUSAL_LM and template.label_tokens:
            labels, source = template.label_tokens, f"the {template.name} template's label tokens (--label-tokens)"
        if labels is not None and model.kind != ModelKind.CAUSAL_LM:
            raise ValueError(f"--label-tokens: label tokens are read from a causal LM's next-token logits; this "
                             f"model is a {model.kind.value}, whose own head gives its scores")
        model.template = template
        if model.kind == ModelKind.CAUSAL_LM:
            self.decision_template = resolve_decision_template(model.tokenizer, config.decision_template)
        elif config.decision_template is not None:
            raise ValueError(f"--decision-template: decisions are read from a causal LM's next-token probabilities; "
                             f"this model is a {model.kind.value}")
        if labels is not None:
            model.default_labels = resolve_label_tokens(model.tokenizer, labels, source, model.logit_size)
        if template is not None or labels is not None:
            log.info("prompt template %s (shared prefix %r, per item {item}%r); label tokens %s = %s",
                     template.name if template else None, "".join(template.head) if template else "",
                     template.tail if template else "", list(labels or []), model.default_labels)

    def _executor(self, model: ScoringModel) -> Executor:
        """Attention backend and, with --cuda-graph, the graph buckets (captured here, before the model thread
        starts: nothing else may use the GPU during a capture)."""
        config = self.config
        backend = resolve_backend(config.attention_backend.value, model.device)
        graphs = None
        if config.cuda_graph:
            graphs = GraphRunner(model, LayoutKind.FLEX if backend == "flex" else LayoutKind.DENSE,
                                 config.cuda_graph_token_buckets, config.cuda_graph_max_tokens,
                                 config.cuda_graph_max_seqs, on_capture_failure=self.metrics.graph_capture_failures.inc)
            graphs.capture()
            for bucket in graphs.buckets:  # every series from the start, so graph panels have data
                if not bucket.disabled:
                    path = "graph" if bucket.graph is not None else "padded"
                    self.metrics.graph_runs.labels(path, str(bucket.tokens))
        return Executor(model, backend, graphs)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        """POST /v1/score: one row per item."""
        scored = await self.run(request)
        return await asyncio.to_thread(_response, request, scored)

    async def run(self, request: ScoreRequest, rules: LengthRules | None = None, embed: bool = False,
                  prompt_name: str | None = None) -> Scored:
        """Score one request (`embed`: the items' embeddings, as pooled rows; `prompt_name`: an embedding model's
        sentence-transformers prompt instead of its default one). On the event loop only O(1) work per request:
        checks, tokenization and planning run in a worker thread. Cancelling the calling task (client gone) or the
        timeout drops the request's queued work."""
        if self.model is None or self.scheduler is None:
            raise NotReady("model is loading")
        return await self.bounded(self._run(self.model, self.scheduler, request, rules, embed, prompt_name))

    async def bounded(self, work: Awaitable[T]) -> T:
        """`work`, or a 504 past --request-timeout-seconds (its remaining work dropped by the caller)."""
        timeout = self.config.request_timeout_seconds
        try:
            async with asyncio.timeout(timeout) as deadline:
                return await work
        except TimeoutError:
            if not deadline.expired():
                raise
            raise RequestTimedOut(f"the request did not finish within {timeout:g} s (--request-timeout-seconds); "
                                  "its remaining work was dropped") from None

    async def _run(self, model: ScoringModel, scheduler: Scheduler, request: ScoreRequest,
                   rules: LengthRules | None, embed: bool, prompt_name: str | None) -> Scored:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        prepared = await asyncio.to_thread(self._prepare, model, request, rules, embed, prompt_name,
                                           loop.create_future(), loop)
        if prepared is None:
            return Scored([], [] if request.return_pooled_hidden_states or embed else None, [], 0, False)
        job, score_plan, rows_of = prepared
        self.metrics.stage_seconds.labels("tokenize").observe(time.perf_counter() - started)
        queued = scheduler.submit(job, score_plan.units, score_plan.prompt_tokens)
        try:
            result = await job.future
        except BaseException:  # cancelled, timed out or failed: nothing of it may stay queued
            scheduler.cancel(queued)
            raise
        finite = [result.scores] if not embed else [result.pooled_hidden_states or []]
        if not all(math.isfinite(value) for rows in finite for row in rows for value in row):
            # Never a NaN or inf in a 200 (the heads keep finite logits finite; this catches a model that overflowed).
            raise NonFiniteScore("the model produced a non-finite score for this request (numeric overflow in "
                                 f"{str(model.dtype).removeprefix('torch.')}); no scores are returned")
        mode = "multi_item" if result.multi_item else "single_item"
        self.metrics.items.labels(mode).inc(job.num_items)
        self.metrics.score_requests.labels(mode).inc()
        self.metrics.prompt_tokens.inc(result.prompt_tokens)
        return Scored(result.scores, result.pooled_hidden_states, rows_of, result.prompt_tokens, result.multi_item)

    def _prepare(self, model: ScoringModel, request: ScoreRequest, rules: LengthRules | None, embed: bool,
                 prompt_name: str | None, future: asyncio.Future[JobResult], loop: asyncio.AbstractEventLoop
                 ) -> tuple[ScoreJob, ScorePlan, list[int]] | None:
        """Checks, tokenization and planning (a worker thread): the job, its plan and the request item of each
        scored row, or None for no items. Every limit is checked before the work it bounds."""
        config = self.config
        items = request.item_list
        if len(items) > config.max_items_per_request:
            field = rules.field if rules is not None else "input" if embed else "items"
            raise BadRequest(f"{field}: {len(items)} items exceed the limit of {config.max_items_per_request}")
        labels = label_lists(model, request, len(items))
        if request.return_pooled_hidden_states:
            if model.kind == ModelKind.CAUSAL_LM:
                raise BadRequest("return_pooled_hidden_states is not supported for causal LM models; it needs a "
                                 "model with a task head (classifier, reward, cross-encoder) or an embedding model")
            if config.pooled_hidden_states == PooledHiddenStates.FORBIDDEN:
                raise BadRequest("return_pooled_hidden_states is disabled on this server")
        _check_response_bytes(model, request, labels, config.max_response_bytes, embed)
        if request.return_pooled_hidden_states:
            self.metrics.hidden_requests.inc()
        if not items:
            return None
        # --max-request-tokens from a bounded count, before a text request is tokenized whole (issue 26)
        refuse_early(model, request.query, items, rules or (LengthRules(field="input") if embed else
                                                            length_rules(request)), config.max_request_tokens)
        tokens = tokenize(model, request, rules or (LengthRules(field="input") if embed else None), prompt_name,
                          query_row=not embed)
        multi_item = model.is_decoder and (request.multi_item_scoring if request.multi_item_scoring is not None
                                           else config.mis_enabled)
        job = ScoreJob(num_items=len(tokens.items), apply_softmax=request.apply_softmax,
                       temperature=request.temperature, labels=None if labels is None else [
                           labels[item] for item in tokens.rows_of],
                       want_pooled=request.return_pooled_hidden_states or embed, prompt_tokens=0, multi_item=False,
                       future=future, loop=loop, embed=embed)
        score_plan = plan(model, request, tokens, job, multi_item, config.max_batch_tokens,
                          config.multi_item_scoring_delimiter, config.max_request_tokens, query_row=not embed)
        job.prompt_tokens, job.multi_item = score_plan.prompt_tokens, score_plan.multi_item
        job.remaining = sum(len(unit.pools) for unit in score_plan.units)
        return job, score_plan, tokens.rows_of

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(self.config.drain_timeout_seconds)
