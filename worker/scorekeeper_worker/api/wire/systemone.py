"""HTTP contract of POST /v1/systemone: TypeSafe's System One format (as served by Jev, LiteLLM, Fireworks, Databricks
and SGLang's /v1/systemone): a `state` (text or any JSON value) and named questions of type `noul` (yes/no),
`choice` (one of the `criteria` labels) or `score` (one of the `criteria` levels, lowest first), answered by name.

    {"model": "...", "state": "...", "questions": {"urgency": {"type": "choice", "instructions": "How urgent?",
     "criteria": {"low": "can wait a week", "high": "needs action today"}}}}

→   {"model": "...", "answers": {"urgency": {"type": "choice", "choice": "high", "confidence": 0.9,
     "probabilities": {"low": 0.05, "high": 0.95}}}, "usage": {"input_tokens": 391, "output_tokens": 0}}
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from scorekeeper_worker.api.wire.decisions import JsonValue, Name, by_type
from scorekeeper_worker.api.wire.score import StrictModel, Text

Content = Annotated[
    Annotated[Text, Tag("<text>")] | Annotated[dict[str, JsonValue], Tag("<object>")]
    | Annotated[list[JsonValue], Tag("<list>")],
    Discriminator(lambda value: "<text>" if isinstance(value, str) else "<object>" if isinstance(value, dict)
                  else "<list>" if isinstance(value, list) else None,
                  custom_error_type="content_type", custom_error_message="Input should be text, an object or a list"),
]


class NoulCriteria(StrictModel):
    """What counts as yes (`true`) and as no (`false`)."""

    true: Text | None = None
    false: Text | None = None


class NoulQuestion(StrictModel):
    """Yes or no: answered with the probability of yes."""

    type: Literal["noul"]
    instructions: Content
    criteria: NoulCriteria | None = None


class ChoiceQuestion(StrictModel):
    """One label of `criteria` (label → description or null), in the order given."""

    type: Literal["choice"]
    instructions: Content
    criteria: dict[Name, Text | None] = Field(min_length=2, description="at least 2 labels; no upper bound but "
                                                                        "--max-request-tokens")


class ScoreQuestion(StrictModel):
    """One level of `criteria` (descriptions, lowest first): answered with the expected level index."""

    type: Literal["score"]
    instructions: Content
    criteria: list[Text] = Field(min_length=2, description="level descriptions, lowest first (at least 2)")


SystemOneQuestion = by_type(NoulQuestion, ChoiceQuestion, ScoreQuestion, error_type="question_type",
                            message="Input should be a question of type noul, choice or score")


class SystemOneRequest(StrictModel):
    model: Text = "default"
    state: JsonValue = Field(description="the text or JSON value every question is about")
    questions: dict[Name, SystemOneQuestion] = Field(min_length=1, description="named questions, answered by name; "
                                                                              "at most --max-items-per-request")


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: float = Field(description="the probability of yes")


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    confidence: float
    probabilities: dict[str, float]


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float = Field(description="the expected level index (0: the first level)")
    confidence: float
    legend: dict[str, str] = Field(description="level index → its description")
    probabilities: dict[str, float] = Field(description="level index → its probability")


class SystemOneUsage(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class SystemOneResponse(BaseModel):
    model: str = Field(description="the served model")
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer]
    usage: SystemOneUsage
