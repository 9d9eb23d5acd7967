"""HTTP contract of POST /v1/decisions: OpenAI's Decisions API as openai-python (3.57) sends and parses it
(`client.decisions.create`; the request is `DecisionCreateParams`, the response `Decision`), validated as strictly as
/v1/score (api/wire/score.py).

Accepted and ignored: `prompt_cache_key`, `prompt_cache_options`, `safety_identifier`, and the parts'
`prompt_cache_breakpoint` (the shared input runs once per request anyway; question parts, OpenAI's without it, share
the input's part types). Images are in the schema, as in OpenAI's, and answered with a 400: the served models read
text."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, Discriminator, Field, StrictBool, Tag, field_validator

from scorekeeper_worker.api.wire.score import StrictModel, Text, valid_text
from scorekeeper_worker.base.errors import Invalid


def _valid_json(value: Any) -> Any:
    """Every string of a JSON value (keys included) is valid Unicode text, as for every other text field."""
    if isinstance(value, str):
        valid_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            valid_text(key)
            _valid_json(item)
    elif isinstance(value, list):
        for item in value:
            _valid_json(item)
    return value


JsonValue = Annotated[Any, AfterValidator(_valid_json)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_valid_json)]


class CacheBreakpoint(StrictModel):
    mode: Literal["explicit"]


class InputText(StrictModel):
    type: Literal["input_text"]
    text: Text
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputImage(StrictModel):
    type: Literal["input_image"]
    image_url: Text
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJson(StrictModel):
    """A JSON object, or a list of objects, rendered as text."""

    type: Literal["input_json"]
    data: Annotated[
        Annotated[JsonObject, Tag("<object>")] | Annotated[list[JsonObject], Tag("<list>")],
        Discriminator(lambda value: "<object>" if isinstance(value, dict) else "<list>" if isinstance(value, list)
                      else None, custom_error_type="json_data_type",
                      custom_error_message="Input should be an object or a list of objects"),
    ]


class OutputText(StrictModel):
    type: Literal["output_text"]
    text: Text


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: Text


def type_tag(value: Any) -> str | None:
    """The union tag of an object told apart by its `type` (tags are written `<...>`: left out of error paths)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"<{kind}>" if isinstance(kind, str) else None


def by_type(*models: type[BaseModel], error_type: str, message: str) -> Any:
    """A union of models told apart by their `type` field (a Literal of one value), so an error names the one the
    input's type picks."""
    members = [Annotated[model, Tag(f"<{get_args(model.model_fields['type'].annotation)[0]}>")] for model in models]
    return Annotated[reduce(operator.or_, members), Discriminator(type_tag, custom_error_type=error_type,
                                                                  custom_error_message=message)]


def _text_or_list(value: Any) -> str | None:
    return "<text>" if isinstance(value, str) else "<list>" if isinstance(value, list) else None


def text_or_list(part: Any, what: str) -> Any:
    """Text, or a list of `part`s: one reading of the field per input shape, so an error names one of them."""
    return Annotated[
        Annotated[Text, Tag("<text>")] | Annotated[list[part], Tag("<list>")],  # type: ignore[valid-type]
        Discriminator(_text_or_list, custom_error_type="content_type",
                      custom_error_message=f"Input should be text or a list of {what}"),
    ]


UserPart = by_type(InputText, InputImage, InputJson, error_type="part_type",
                   message="Input should be an input_text, input_image or input_json part")
ToolOutputPart = by_type(InputText, InputImage, error_type="part_type",
                         message="Input should be an input_text or input_image part")
AssistantPart = by_type(OutputText, Refusal, error_type="part_type",
                        message="Input should be an output_text or refusal part")


class UserMessage(StrictModel):
    role: Literal["user"]
    content: text_or_list(UserPart, "input_text, input_image or input_json parts")
    type: Literal["message"] = "message"


class DeveloperMessage(StrictModel):
    role: Literal["developer"]
    content: text_or_list(InputText, "input_text parts")
    type: Literal["message"] = "message"


class SystemMessage(StrictModel):
    role: Literal["system"]
    content: text_or_list(InputText, "input_text parts")
    type: Literal["message"] = "message"


class AssistantMessage(StrictModel):
    role: Literal["assistant"]
    content: text_or_list(AssistantPart, "output_text or refusal parts")
    phase: Literal["commentary", "final_answer"] | None = None
    type: Literal["message"] = "message"


Status = Literal["in_progress", "completed", "incomplete"]


class _ToolCall(StrictModel):
    """What a function call and a custom tool call share (in the input as the model's earlier turns)."""

    call_id: Text
    name: Text
    id: Text | None = None
    namespace: Text | None = None
    status: Status | None = None


class FunctionCall(_ToolCall):
    type: Literal["function_call"]
    arguments: Text


class CustomToolCall(_ToolCall):
    type: Literal["custom_tool_call"]
    input: Text


class _ToolOutput(StrictModel):
    """What a function's and a custom tool's output share."""

    call_id: Text
    output: text_or_list(ToolOutputPart, "input_text or input_image parts")
    id: Text | None = None
    status: Status | None = None


class FunctionCallOutput(_ToolOutput):
    type: Literal["function_call_output"]


class CustomToolCallOutput(_ToolOutput):
    type: Literal["custom_tool_call_output"]


def _item_kind(value: Any) -> str | None:
    """Messages are told apart by their role, every other input item by its type."""
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return f"<{role}>" if isinstance(role, str) else type_tag(value)


InputItem = Annotated[
    Annotated[UserMessage, Tag("<user>")] | Annotated[DeveloperMessage, Tag("<developer>")]
    | Annotated[SystemMessage, Tag("<system>")] | Annotated[AssistantMessage, Tag("<assistant>")]
    | Annotated[FunctionCall, Tag("<function_call>")] | Annotated[FunctionCallOutput, Tag("<function_call_output>")]
    | Annotated[CustomToolCall, Tag("<custom_tool_call>")]
    | Annotated[CustomToolCallOutput, Tag("<custom_tool_call_output>")],
    Discriminator(_item_kind, custom_error_type="input_item", custom_error_message=(
        "Input should be a message (role user, developer, system or assistant), or a function_call, "
        "function_call_output, custom_tool_call or custom_tool_call_output item")),
]


Instructions = text_or_list(UserPart, "input_text, input_image or input_json parts")  # OpenAI's question parts
Name = Annotated[str, Field(min_length=1), AfterValidator(valid_text)]  # an answer's text: at least one token


def _unique_values(keys: list[Any], field: str, what: str) -> None:
    seen: dict[Any, int] = {}
    for index, key in enumerate(keys):
        if key in seen:
            value = key[1] if isinstance(key, tuple) else key
            raise Invalid(f"[{index}].{field}", f"{value!r} repeats [{seen[key]}].{field}; each {what} must be unique")
        seen[key] = index


class PredicateQuestion(StrictModel):
    """How likely a statement about the input is true."""

    type: Literal["predicate"]
    instructions: Instructions
    name: Text | None = None


ChoiceValue = Annotated[
    Annotated[Name, Tag("<text>")] | Annotated[StrictBool, Tag("<bool>")],
    Discriminator(lambda value: "<text>" if isinstance(value, str) else "<bool>" if isinstance(value, bool) else None,
                  custom_error_type="value_type", custom_error_message="Input should be text or a boolean"),
]


class Choice(StrictModel):
    value: ChoiceValue = Field(description="typed: a string and a boolean with the same text are distinct")
    description: Text | None = None


class ChoiceQuestion(StrictModel):
    """Choose one of the supplied options."""

    type: Literal["choice"]
    instructions: Instructions
    choices: list[Choice] = Field(min_length=2, description="at least 2, each value unique; no upper bound but "
                                                            "--max-request-tokens")
    name: Text | None = None

    @field_validator("choices")
    @classmethod
    def _unique(cls, choices: list[Choice]) -> list[Choice]:
        _unique_values([(type(choice.value), choice.value) for choice in choices], "value", "choice")
        return choices


class Level(StrictModel):
    label: Name
    description: Text | None = None


class ScoreQuestion(StrictModel):
    """Rate the input on ordered levels (lowest first)."""

    type: Literal["score"]
    instructions: Instructions
    levels: list[Level] = Field(min_length=2, description="at least 2, lowest first, each label unique")
    name: Text | None = None

    @field_validator("levels")
    @classmethod
    def _unique(cls, levels: list[Level]) -> list[Level]:
        _unique_values([level.label for level in levels], "label", "level")
        return levels


Question = by_type(PredicateQuestion, ChoiceQuestion, ScoreQuestion, error_type="question_type",
                   message="Input should be a question of type predicate, choice or score")


class CacheOptions(StrictModel):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


class DecisionRequest(StrictModel):
    model: Text
    input: text_or_list(InputItem, "messages and tool items") = Field(
        description="the text, or the conversation, every question is about")
    questions: list[Question] = Field(min_length=1, description="answered in this order; at most "
                                                                "--max-items-per-request")
    prompt_cache_key: Text | None = None
    prompt_cache_options: CacheOptions | None = None
    safety_identifier: Text | None = None


class PredicateAnswer(BaseModel):
    type: Literal["predicate"] = "predicate"
    name: str | None
    probability: float


class ChoiceProbability(BaseModel):
    value: str | bool
    probability: float


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    name: str | None
    choice: str | bool
    confidence: float
    probabilities: list[ChoiceProbability]


class ScoreProbability(BaseModel):
    label: str
    value: int = Field(description="the level's index, 0 for the lowest")
    probability: float


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    name: str | None
    score: float = Field(description="the expected level index")
    confidence: float
    probabilities: list[ScoreProbability]


class InputTokensDetails(BaseModel):
    cache_write_tokens: int = 0
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class DecisionUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class DecisionResponse(BaseModel):
    answers: list[PredicateAnswer | ChoiceAnswer | ScoreAnswer]
    model: str = Field(description="the served model")
    usage: DecisionUsage
