"""HTTP contract: pydantic models for /v1/score (SGLang-compatible superset) and /v1/rerank (Cohere/Jina shape)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class BadRequest(ValueError):
    """A client error; the message names the field (turned into HTTP 400)."""


class ResponseTooLarge(BadRequest):
    """The response could exceed `--max-response-bytes` (HTTP 400, counted as a rejection)."""


class RequestTooLarge(Exception):
    """The request would run more tokens than `--max-request-tokens` (HTTP 413); the message names the field."""


# SGLang 0.5.23 request fields with semantics this server does not implement: refused, never silently ignored.
UNSUPPORTED_SGLANG_FIELDS = ("return_token_logprobs", "score_extraction_token", "embed_override_token_id",
                             "query_embed_overrides", "item_embed_overrides")


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str | list[int] | None = Field("", description="text, or token ids")
    items: str | list[str] | list[list[int]] | None = Field(None, description="a bare string is one item")
    label_token_ids: list[int] | list[list[int]] | None = Field(
        None, description="causal LM: label tokens, one list for all items or one list per item")
    apply_softmax: bool = False
    item_first: bool = False
    model: str = "default"
    return_pooled_hidden_states: bool = False
    temperature: float = 1.0
    multi_item_scoring: bool | None = Field(
        None, description="per-request override of the server's multi-item scoring (decoder models)")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: object) -> object:
        if isinstance(data, dict):
            for name in UNSUPPORTED_SGLANG_FIELDS:
                if data.get(name) not in (None, False):
                    raise BadRequest(f"{name} is not supported by this server")
        return data

    @field_validator("temperature")
    @classmethod
    def _finite_positive(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError("temperature must be finite and greater than zero")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ScoreRequest:
        if self.items is None:
            raise BadRequest("items must be provided")
        if self.temperature != 1.0 and not self.apply_softmax:
            raise BadRequest("temperature requires apply_softmax=true")
        if self.query is None:
            self.query = [] if self.items and isinstance(self.items, list) and isinstance(self.items[0], list) else ""
        items = [self.items] if isinstance(self.items, str) else self.items
        if items and isinstance(self.query, str) != isinstance(items[0], str):
            raise BadRequest("query and items must be the same kind: all text or all token ids")
        self.items = items
        return self

    @property
    def item_list(self) -> list[str] | list[list[int]]:
        assert isinstance(self.items, list)
        return self.items


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


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    query: str
    documents: list[str]
    model: str = "default"
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class RerankResponse(BaseModel):
    model: str
    results: list[RerankResult]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "scorekeeper"
    kind: str
    max_positions: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorResponse(BaseModel):
    object: Literal["error"] = "error"
    message: str
    type: str
    code: int
