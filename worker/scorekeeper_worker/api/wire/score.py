"""HTTP contract: pydantic models for /v1/score (SGLang-compatible superset); /v1/rerank and /v1/embeddings:
api/wire/compat.py.

Requests are validated strictly (score-api.md, "Every error has one shape"): `true` is not 1, `"1"` is not 1, `1.5`
is not a token id (`1.0` is one, as JSON Schema reads it), non-finite numbers and integers beyond 2**53 are refused,
and text must be valid Unicode (a lone surrogate, or invalid UTF-8 that the body parser kept as one, is a 400 naming
the field). Unions are discriminated by the input's shape, so an error names one reading of the field (`items[1]`),
not every reading pydantic tried; their tags are written `<...>` and left out of the field path in messages
(base/errors.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.planning.encoding import Direction, LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.service import Scored

# The largest integer a request may hold: beyond it a JSON number is no longer exact in every client (JavaScript,
# float64 parsers), and it is far beyond any vocabulary or count. Larger ones, 64-bit and more, are a 400.
MAX_INT = 2**53 - 1
# SGLang 0.5.23 request fields with semantics this server does not implement: refused, never silently ignored.
UNSUPPORTED_SGLANG_FIELDS = ("return_token_logprobs", "score_extraction_token", "embed_override_token_id",
                             "query_embed_overrides", "item_embed_overrides")


class StrictModel(BaseModel):
    """A request body, or a part of one, validated strictly (see above); unknown fields are ignored."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


def valid_text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not valid Unicode text at character {error.start} (a lone surrogate, or bytes that are "
                         "not UTF-8)") from None
    return value


def integral(value: Any) -> Any:
    """A number with no fractional part is an integer in JSON Schema (the OpenAPI document's language): 2.0 → 2."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integral_ids(value: Any) -> Any:
    """A list of token ids, its integral numbers as integers (2.0 → 2). Ids come by the thousand, so the common case
    (every one an int already) is one pass in C; pydantic then checks each id in Rust, with its own errors."""
    if not isinstance(value, list) or set(map(type, value)) <= {int}:
        return value
    return [integral(v) for v in value]


def _shape(value: Any) -> str | None:
    """The reading of a union field that fits the input's shape (None: no reading fits)."""
    if isinstance(value, str):
        return "<text>"
    if isinstance(value, list):
        return "<lists>" if value and isinstance(value[0], list) else "<list>"
    return None


def _query_shape(value: Any) -> str | None:
    shape = _shape(value)
    return "<list>" if shape == "<lists>" else shape  # a list of lists is read as token ids, and refused as such


def _label_shape(value: Any) -> str | None:
    shape = _shape(value)
    return None if shape == "<text>" else shape


Text = Annotated[str, AfterValidator(valid_text)]
# A request's `model`: echoed in its response, as SGLang, Cohere and OpenAI clients expect; a request that names none
# is answered with the served model's name (what GET /v1/models lists), which the route passes to ask().
ModelName = Annotated[Text | None, Field(description="echoed in the response; default: the served model's name, as "
                                                     "GET /v1/models lists it")]
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT)]], BeforeValidator(integral_ids)]
Query = Annotated[
    Annotated[Text, Tag("<text>")] | Annotated[TokenIds, Tag("<list>")],
    Discriminator(_query_shape, custom_error_type="query_type",
                  custom_error_message="Input should be text or a list of token ids"),
]
Items = Annotated[
    Annotated[Text, Tag("<text>")] | Annotated[list[Text], Tag("<list>")]
    | Annotated[list[TokenIds], Field(min_length=1), Tag("<lists>")],
    Discriminator(_shape, custom_error_type="items_type",
                  custom_error_message="Input should be text, a list of texts or a list of token-id lists"),
]
LabelTokenIds = Annotated[
    Annotated[TokenIds, Tag("<list>")] | Annotated[list[TokenIds], Field(min_length=1), Tag("<lists>")],
    Discriminator(_label_shape, custom_error_type="label_ids_type",
                  custom_error_message="Input should be a list of token ids, or one such list per item"),
]
Temperature = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1, le=MAX_INT), BeforeValidator(integral)]
TruncationDirection = Literal["left", "right"]
Instruct = Annotated[Text | None, Field(
    description="fills {instruct} of the server's prompt template (--prompt-template); text inputs only")]
CutToFit = Annotated[bool, Field(description="cut what does not fit the model's maximum: the item, or the query only "
                                             "if it alone cannot fit (false: such a request is a 400)")]


def cut_end(what: str) -> Any:
    """A request's truncation_direction: which end of `what` is cut (default: the right)."""
    return Field("right", description=f"which end of {what} is cut")


def own_tokens_limit(what: str) -> Any:
    """A request's max_tokens_per_<what> (default: no limit)."""
    return Field(None, description=f"cut every {what} to this many of its own tokens (before special tokens and the "
                                   "prompt template; an embedding model's prompt is not counted or cut)")


def _score_schema(schema: dict[str, Any]) -> None:
    """What validation checks across fields, said in the schema too, so that schema-driven clients (and fuzzers)
    know which bodies are valid."""
    text = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    schema["anyOf"] = [
        {"properties": {"query": {"type": ["string", "null"]}, "items": text}},
        {"properties": {"query": {"type": ["array", "null"]}, "items": {"type": "array", "items": {"type": "array"}},
                        "instruct": {"type": "null"}}},  # token ids are verbatim: no template to fill
    ]
    schema["if"] = {"required": ["temperature"], "properties": {"temperature": {"not": {"const": 1}}}}
    schema["then"] = {"required": ["apply_softmax"], "properties": {"apply_softmax": {"const": True}}}
    for name in UNSUPPORTED_SGLANG_FIELDS:
        schema["properties"][name] = {"enum": [None, False], "description": "not supported by this server"}


class ScoreRequest(StrictModel):
    model_config = ConfigDict(json_schema_extra=_score_schema)

    query: Query | None = Field(None, description="text, or token ids; missing or null: empty, of the items' kind")
    items: Items = Field(description="a bare string is one item")
    label_token_ids: LabelTokenIds | None = Field(
        None, description="causal LM: label tokens, one list for all items or one list per item")
    apply_softmax: bool = False
    item_first: bool = False
    model: ModelName = None
    return_pooled_hidden_states: bool = False
    temperature: Temperature = Field(1.0, description="≠ 1 requires apply_softmax")
    multi_item_scoring: bool | None = Field(
        None, description="per-request override of the server's multi-item scoring (decoder models)")
    instruct: Instruct = None
    truncate: CutToFit = False
    truncation_direction: TruncationDirection = cut_end("an item")
    max_tokens_per_item: Count | None = own_tokens_limit("item")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: object) -> object:
        if isinstance(data, dict):
            for name in UNSUPPORTED_SGLANG_FIELDS:
                if data.get(name) is not None and data.get(name) is not False:
                    raise Invalid(name, "not supported by this server")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ScoreRequest:
        if self.temperature != 1.0 and not self.apply_softmax:
            raise Invalid("temperature", "requires apply_softmax=true")
        items = [self.items] if isinstance(self.items, str) else self.items
        if self.query is None:
            self.query = [] if items and isinstance(items[0], list) else ""
        if items and isinstance(self.query, str) != isinstance(items[0], str):
            raise Invalid("items", "query and items must be the same kind: all text or all token ids")
        self.items = items
        return self

    @property
    def item_list(self) -> list[str] | list[list[int]]:
        assert isinstance(self.items, list)
        return self.items

    def ask(self, served_name: str = "") -> ScoreAsk:
        """What planning reads of it; `served_name` answers a request that names no model."""
        assert self.query is not None  # filled in by validation
        return ScoreAsk(query=self.query, items=self.item_list, label_token_ids=self.label_token_ids,
                        apply_softmax=self.apply_softmax, temperature=self.temperature, item_first=self.item_first,
                        return_pooled_hidden_states=self.return_pooled_hidden_states,
                        multi_item_scoring=self.multi_item_scoring, instruct=self.instruct,
                        rules=LengthRules(truncate=self.truncate, direction=Direction(self.truncation_direction),
                                          max_item_tokens=self.max_tokens_per_item),
                        model_name=self.model or served_name)


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    scores: list[list[float]]
    pooled_hidden_states: list[list[float]] | None = None
    model: str
    usage: Usage
    object: Literal["scoring"] = "scoring"

    @staticmethod
    def of(model: str, scored: Scored) -> ScoreResponse:
        """The response model (validates every float: a worker thread for large responses)."""
        usage = Usage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens)
        return ScoreResponse(scores=scored.rows, pooled_hidden_states=scored.pooled, model=model, usage=usage)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "scorekeeper"
    kind: str
    max_positions: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Status(BaseModel):
    status: str
