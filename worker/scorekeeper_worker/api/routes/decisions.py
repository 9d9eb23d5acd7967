"""POST /v1/decisions (OpenAI's Decisions API, as openai-python's `client.decisions.create` sends and parses it) and
POST /v1/systemone (api/routes/systemone.py) on the decision path (serving/decisions.py), and the routes of both.

The conversation, as the model reads it: a text input is one user message; messages keep their roles (developer
becomes system, as chat templates know it); a function or custom tool call is an assistant message, its output a
`tool` message; text parts are joined by newlines, JSON parts written as compact JSON; an image is a 400.

Answers, in question order, with each question's name (null without one): a predicate's probability of "yes"; a
choice's most probable value, every value's probability and the confidence; a score's expected level index (0: the
first level), every level's probability and the confidence (engine/queue/decision_job.best, .confidence)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response

from scorekeeper_worker.api.middleware.per_request import cancel_on_disconnect
from scorekeeper_worker.api.routes.systemone import systemone_ask, systemone_response
from scorekeeper_worker.api.wire.decisions import (
    ChoiceAnswer,
    ChoiceProbability,
    ChoiceQuestion,
    CustomToolCall,
    CustomToolCallOutput,
    DecisionRequest,
    DecisionResponse,
    DecisionUsage,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    PredicateAnswer,
    PredicateQuestion,
    ScoreAnswer,
    ScoreProbability,
)
from scorekeeper_worker.api.wire.systemone import SystemOneRequest, SystemOneResponse
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.queue.decision_job import DecisionResult, best, confidence
from scorekeeper_worker.model.loader import ModelKind
from scorekeeper_worker.planning.decision_prompts import (
    ChatMessage,
    DecisionAsk,
    DecisionQuestion,
    Option,
    QuestionKind,
    json_text,
    yes_no,
)
from scorekeeper_worker.serving.decisions import decide

if TYPE_CHECKING:
    from scorekeeper_worker.serving.service import ScoringService

DECISIONS, SYSTEMONE = "/v1/decisions", "/v1/systemone"
# Who can serve these routes: a causal LM (any other kind answers 400). Declared in the OpenAPI document too.
SERVED_KINDS = (ModelKind.CAUSAL_LM,)


def _text(content: str | list[Any], field: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type == "input_image":
            raise Invalid(f"{field}[{i}]", "images are not supported: the served model reads text only")
        texts.append(json_text(part.data) if part.type == "input_json" else
                     part.refusal if part.type == "refusal" else part.text)
    return "\n".join(texts)


def _message(item: InputItem, field: str) -> ChatMessage:
    if isinstance(item, FunctionCall | CustomToolCall):
        namespace = f"{item.namespace}." if item.namespace else ""
        arguments = item.arguments if isinstance(item, FunctionCall) else item.input
        return ChatMessage("assistant", f"Call {namespace}{item.name} ({item.call_id}): {arguments}")
    if isinstance(item, FunctionCallOutput | CustomToolCallOutput):
        return ChatMessage("tool", f"Output of {item.call_id}: {_text(item.output, field + '.output')}")
    role = "system" if item.role == "developer" else item.role
    return ChatMessage(role, _text(item.content, field + ".content"))


def _question(question: Any, field: str) -> DecisionQuestion:
    instructions = _text(question.instructions, field + ".instructions")
    if isinstance(question, PredicateQuestion):
        return DecisionQuestion(QuestionKind.PREDICATE, instructions, yes_no(), field)
    if isinstance(question, ChoiceQuestion):
        options = tuple(Option(json_text(choice.value), choice.description) for choice in question.choices)
        return DecisionQuestion(QuestionKind.CHOICE, instructions, options, field)
    options = tuple(Option(level.label, level.description) for level in question.levels)
    return DecisionQuestion(QuestionKind.SCORE, instructions, options, field)


def decision_ask(request: DecisionRequest) -> DecisionAsk:
    if isinstance(request.input, str):
        messages: tuple[ChatMessage, ...] = (ChatMessage("user", request.input),)
    else:
        messages = tuple(_message(item, f"input[{i}]") for i, item in enumerate(request.input))
    return DecisionAsk(messages, tuple(_question(q, f"questions[{i}]") for i, q in enumerate(request.questions)))


def decision_response(request: DecisionRequest, result: DecisionResult, model: str) -> DecisionResponse:
    answers: list[PredicateAnswer | ChoiceAnswer | ScoreAnswer] = []
    for question, p in zip(request.questions, result.probabilities, strict=True):
        if isinstance(question, PredicateQuestion):
            answers.append(PredicateAnswer(name=question.name, probability=p[0]))
        elif isinstance(question, ChoiceQuestion):
            values = [choice.value for choice in question.choices]
            answers.append(ChoiceAnswer(
                name=question.name, choice=values[best(p)], confidence=confidence(p),
                probabilities=[ChoiceProbability(value=v, probability=q) for v, q in zip(values, p, strict=True)]))
        else:
            answers.append(ScoreAnswer(
                name=question.name, score=sum(i * q for i, q in enumerate(p)), confidence=confidence(p),
                probabilities=[ScoreProbability(label=level.label, value=i, probability=q)
                               for i, (level, q) in enumerate(zip(question.levels, p, strict=True))]))
    usage = DecisionUsage(input_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
    return DecisionResponse(answers=answers, model=model, usage=usage)


def add_routes(app: FastAPI, service: ScoringService, responses: dict[int | str, dict[str, Any]]) -> None:
    """The decision routes (causal LMs: SERVED_KINDS). Like the scoring routes, they race their work against the
    client's connection and build and serialise the response in a worker thread."""

    async def run(ask: DecisionAsk, route: str, http: Request) -> tuple[DecisionResult, str]:
        result = await cancel_on_disconnect(decide(service, ask, route), http.receive)
        assert service.model is not None
        return result, service.model.name

    @app.post(DECISIONS, response_model=DecisionResponse, responses=responses)
    async def decisions_route(body: DecisionRequest, http: Request) -> Response:
        result, model = await run(await asyncio.to_thread(decision_ask, body), DECISIONS, http)
        response = await asyncio.to_thread(decision_response, body, result, model)
        return Response(await asyncio.to_thread(response.model_dump_json), media_type="application/json")

    @app.post(SYSTEMONE, response_model=SystemOneResponse, responses=responses)
    async def systemone_route(body: SystemOneRequest, http: Request) -> Response:
        result, model = await run(await asyncio.to_thread(systemone_ask, body), SYSTEMONE, http)
        response = await asyncio.to_thread(systemone_response, body, result, model)
        return Response(await asyncio.to_thread(response.model_dump_json), media_type="application/json")
