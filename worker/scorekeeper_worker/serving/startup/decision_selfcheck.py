"""Start-up self-check of the decision path (causal LMs, with the self-check on): a fixed request of three questions
(yes/no, a choice whose options are several tokens, a score) planned as requests are, through the decision template
on the model's own tokenizer, run through the engine one question per sequence and, with multi-item scoring on, all
questions sharing the input; against plain transformers on each flat sequence `prompt + option` alone (eager
attention, the model's own forward), its masked sequence log-probabilities normalised over the options. It proves
the prompt rendering, the tree-shaped units (engine/runner/packing.py) and the option readout
(engine/queue/decision_job.py) on the served model; above the dtype's tolerance the worker refuses to start
(serving/startup/selfcheck.py)."""

from __future__ import annotations

import asyncio

import torch

from scorekeeper_worker.engine.queue.decision_job import DecisionJob
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.dtypes import dtype_name
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.templates.decision_template import DecisionTemplate
from scorekeeper_worker.planning import decision_plan, decision_prompts
from scorekeeper_worker.planning.decision_prompts import (
    ChatMessage,
    DecisionAsk,
    DecisionQuestion,
    DecisionTokens,
    Option,
    QuestionKind,
    yes_no,
)
from scorekeeper_worker.serving.startup.selfcheck import TOLERANCE, SelfCheckFailed, deviation, eager_attention

PROBE = DecisionAsk(
    messages=(ChatMessage("user", "Customer wrote: I was charged twice for my order #4411 and want one of the "
                                  "charges refunded today."),),
    questions=(
        DecisionQuestion(QuestionKind.PREDICATE, "The customer asks for a refund.", yes_no(), "probe[0]"),
        DecisionQuestion(QuestionKind.CHOICE, "How urgent is this?",
                         (Option("low", "can wait a week"), Option("needs action today"),
                          Option("Urgent: escalate to billing now")), "probe[1]"),
        DecisionQuestion(QuestionKind.SCORE, "How frustrated is the customer?",
                         (Option("calm"), Option("mildly annoyed"), Option("angry")), "probe[2]"),
    ),
)


def engine_probabilities(model: ScoringModel, executor: Executor, tokens: DecisionTokens,
                         multi_item: bool) -> list[list[float]]:
    """The probe planned as a request is (without limits), run as one batch."""
    plan = decision_plan.plan(model, tokens, [q.field for q in PROBE.questions], multi_item, 1 << 30, None)
    loop = asyncio.new_event_loop()
    try:
        job = DecisionJob(questions=decision_plan.questions(tokens), targets=plan.targets, future=loop.create_future(),
                          loop=loop)
        executor.run([(job, unit) for unit in plan.units])
    finally:
        loop.close()
    return job.probabilities()


@torch.inference_mode()
def reference_probabilities(model: ScoringModel, tokens: DecisionTokens) -> list[list[float]]:
    """Each option's flat sequence alone through the model's own forward: Σ log-softmax of its tokens, then a
    softmax over the options (float64)."""
    out = []
    with eager_attention(model):
        for prompt, options in zip(tokens.prompts, tokens.options, strict=True):
            totals = []
            for option in options:
                ids = torch.tensor([prompt + option[:-1]], device=model.device)
                logits = model.model(input_ids=ids).logits[0, len(prompt) - 1:].double()
                targets = torch.tensor(option, device=logits.device)[:, None]
                totals.append(torch.log_softmax(logits, dim=-1).gather(1, targets).sum())
            out.append(torch.softmax(torch.stack(totals), dim=0).tolist())
    return out


def run(model: ScoringModel, executor: Executor, template: DecisionTemplate, multi_item: bool) -> float:
    """The deviation of the engine's answers from the reference's, or SelfCheckFailed."""
    options = [decision_prompts.option_tokens(model, question) for question in PROBE.questions]
    tokens = decision_prompts.tokenize(model, template, PROBE, options)
    reference = reference_probabilities(model, tokens)
    engine = [engine_probabilities(model, executor, tokens, multi) for multi in sorted({False, multi_item})]
    found = deviation(engine, [reference] * len(engine))
    tolerance = TOLERANCE[model.dtype]
    if not found <= tolerance:  # NaN fails too
        raise SelfCheckFailed(
            f"start-up self-check failed: the engine's decision answers deviate from plain transformers by {found:.3g} "
            f"(tolerance {tolerance:g} for {dtype_name(model.dtype)}) on a probe of {len(PROBE.questions)} questions "
            f"rendered with {template.name}. /v1/decisions would serve wrong answers for this model, so the worker "
            "refuses to start; --no-self-check skips the check (only to debug).")
    return found
