"""Decisions on the scoring service: one request (either wire format, as a DecisionAsk) from its checks to each
question's option probabilities, on the same model thread, queue, limits, timeout and cancellation as /v1/score.

Every limit is checked before the work it bounds: the number of questions (`--max-items-per-request`) and the
response's size (`--max-response-bytes`) from the request's shape; the input's length and a lower bound of the
planned tokens (`--max-request-tokens`) before any prompt is rendered; the exact planned tokens, and the largest
intermediate its longest prompt and its vocabulary rows need (`--max-intermediate-bytes`), before anything is
queued."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.base.errors import Invalid, ResponseTooLarge
from scorekeeper_worker.engine.queue.decision_job import DecisionJob, DecisionResult
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate
from scorekeeper_worker.planning import decision_plan, decision_prompts
from scorekeeper_worker.planning.decision_prompts import DecisionAsk
from scorekeeper_worker.planning.encoding import too_long
from scorekeeper_worker.planning.readable_ids import check_rows
from scorekeeper_worker.serving.prepare import check_intermediates, longest_unit, token_intermediates, vocabulary_logits
from scorekeeper_worker.serving.service import Served, run_job

if TYPE_CHECKING:
    from scorekeeper_worker.serving.service import ScoringService

# Upper bound of an answer's JSON besides its option names: its type, name field, score and confidence; and of one
# option's: its probability (25 bytes, as for /v1/score) and the field names around it. Names, values and level
# descriptions count 6 bytes per character (JSON escapes), twice (System One repeats a choice's label).
ANSWER_BYTES = 128
OPTION_BYTES = 64
OVERHEAD_BYTES = 1024


def _check_response_bytes(ask: DecisionAsk, model_name: str, limit: int) -> None:
    options = sum(len(q.options) for q in ask.questions)
    text = len(model_name) + sum(len(q.field) + sum(len(o.name) + len(o.description or "") for o in q.options)
                                 for q in ask.questions)
    bound = OVERHEAD_BYTES + ANSWER_BYTES * len(ask.questions) + OPTION_BYTES * options + 12 * text
    if bound > limit:
        raise ResponseTooLarge("questions", f"the response could reach {bound} bytes ({len(ask.questions)} questions, "
                               f"{options} options), over this server's limit of {limit} (--max-response-bytes); "
                               "ask fewer questions per request")


def served_template(service: ScoringService, route: str) -> tuple[Served, DecisionTemplate]:
    served = service.loaded()
    if served.model.kind != ModelKind.CAUSAL_LM or served.decision_template is None:
        raise Invalid("model", f"{route} reads answers from a causal LM's next-token probabilities; this server "
                      f"serves a {served.model.kind.value} (use /v1/score or /v1/rerank)")
    return served, served.decision_template


async def decide(service: ScoringService, ask: DecisionAsk, route: str) -> DecisionResult:
    """Each question's probabilities over its options, in order (503 while loading; 400 for another model kind)."""
    served, template = served_template(service, route)
    return await service.bounded(_decide(service, served, template, ask))


async def _decide(service: ScoringService, served: Served, template: DecisionTemplate,
                  ask: DecisionAsk) -> DecisionResult:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    job, plan = await asyncio.to_thread(_prepare, service.config, served.model, template, ask, loop)
    service.metrics.stage_seconds.labels("tokenize").observe(time.perf_counter() - started)
    result = await run_job(served, job, plan, lambda r: r.probabilities, "answers")
    for question in ask.questions:
        service.metrics.decision_questions.labels(question.kind.value).inc()
    service.metrics.prompt_tokens.inc(result.prompt_tokens)
    return result


def _prepare(config: WorkerConfig, model: ScoringModel, template: DecisionTemplate, ask: DecisionAsk,
             loop: asyncio.AbstractEventLoop) -> tuple[DecisionJob, decision_plan.DecisionPlan]:
    """Checks, prompts, tokens and the plan (a worker thread)."""
    if len(ask.questions) > config.max_items_per_request:
        raise Invalid("questions", f"{len(ask.questions)} questions exceed the limit of "
                      f"{config.max_items_per_request}")
    _check_response_bytes(ask, model.name, config.max_response_bytes)
    input_tokens = decision_prompts.input_tokens(model, ask)
    if input_tokens > model.max_positions:
        raise too_long("input", input_tokens, model.max_positions, " before the decision prompt and the question")
    options = [decision_prompts.option_tokens(model, question) for question in ask.questions]
    multi_item = config.mis_enabled and len(ask.questions) > 1
    own = [len(ids) for ids in decision_prompts.token_lists(
        model, [decision_prompts.question_text(question) for question in ask.questions])]
    decision_plan.admit_early(input_tokens, own, multi_item, config.max_request_tokens)
    for question, ids in zip(ask.questions, options, strict=True):  # predicted by the output rows, read as inputs
        check_rows(model, ids, [f"{question.field}: option {o.name!r}" for o in question.options], [],
                   model.logit_size)
    tokens = decision_prompts.tokenize(model, template, ask, options)
    texts = [("input", m.content) for m in ask.messages]
    for question, prompt in zip(ask.questions, tokens.prompts, strict=True):
        check_rows(model, [prompt], [question.field], texts)
    plan = decision_plan.plan(model, tokens, [q.field for q in ask.questions], multi_item, config.max_batch_tokens,
                              config.max_request_tokens)
    check_intermediates([*token_intermediates(model, longest_unit(plan.units), "input"),
                         vocabulary_logits(model, len(plan.targets), "questions")], config.max_intermediate_bytes)
    job = DecisionJob(questions=decision_plan.questions(tokens), targets=plan.targets,
                      prompt_tokens=plan.prompt_tokens, multi_item=plan.multi_item, future=loop.create_future(),
                      loop=loop)
    return job, plan
