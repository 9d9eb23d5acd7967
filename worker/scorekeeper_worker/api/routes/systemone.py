"""POST /v1/systemone (TypeSafe's System One format): the request as a DecisionAsk, the answers keyed by question name.

The state is the input: text as is, any other JSON value as compact JSON, as one user message. A noul is answered
"yes" or "no" (its criteria describe each); a choice by one of its criteria labels, in the order given; a score by
a level's index ("0" for the first, listed with its description). Answers: a noul's probability of yes; a choice's
label, probabilities by label and confidence; a score's expected index, its legend (index → description),
probabilities by index and confidence (engine/queue/decision_job.confidence)."""

from __future__ import annotations

from scorekeeper_worker.api.wire.systemone import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResponse,
    SystemOneUsage,
)
from scorekeeper_worker.engine.queue.decision_job import DecisionResult, best, confidence
from scorekeeper_worker.planning.decision_prompts import (
    ChatMessage,
    DecisionAsk,
    DecisionQuestion,
    QuestionKind,
    json_text,
    options,
    yes_no,
)


def _question(name: str, question: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> DecisionQuestion:
    field = f"questions.{name}"
    instructions = json_text(question.instructions)
    if isinstance(question, NoulQuestion):
        criteria = question.criteria
        yes_and_no = yes_no(criteria.true, criteria.false) if criteria is not None else yes_no()
        return DecisionQuestion(QuestionKind.YES_NO, instructions, yes_and_no, field)
    if isinstance(question, ChoiceQuestion):
        return DecisionQuestion(QuestionKind.CHOICE, instructions, options(question.criteria.items()), field)
    levels = options((str(i), level) for i, level in enumerate(question.criteria))
    return DecisionQuestion(QuestionKind.SCORE, instructions, levels, field)


def systemone_ask(request: SystemOneRequest) -> DecisionAsk:
    return DecisionAsk((ChatMessage("user", json_text(request.state)),),
                       tuple(_question(name, question) for name, question in request.questions.items()))


def systemone_response(request: SystemOneRequest, result: DecisionResult, model: str) -> SystemOneResponse:
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer] = {}
    for (name, question), p in zip(request.questions.items(), result.probabilities, strict=True):
        if isinstance(question, NoulQuestion):
            answers[name] = NoulAnswer(noul=p[0])
        elif isinstance(question, ChoiceQuestion):
            labels = list(question.criteria)
            answers[name] = ChoiceAnswer(choice=labels[best(p)], confidence=confidence(p),
                                         probabilities=dict(zip(labels, p, strict=True)))
        else:
            indexes = [str(i) for i in range(len(p))]
            answers[name] = ScoreAnswer(score=sum(i * q for i, q in enumerate(p)), confidence=confidence(p),
                                        legend=dict(zip(indexes, question.criteria, strict=True)),
                                        probabilities=dict(zip(indexes, p, strict=True)))
    return SystemOneResponse(model=model, answers=answers, usage=SystemOneUsage(input_tokens=result.prompt_tokens))
