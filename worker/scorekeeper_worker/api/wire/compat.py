"""HTTP contract of the routes other servers' clients speak: POST /v1/rerank (Cohere v2 / Jina request and response)
and POST /v1/embeddings (OpenAI). Validated as strictly as /v1/score (api/wire/score.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Discriminator, Field, Tag

from scorekeeper_worker.api.wire.score import (
    MAX_INT,
    Count,
    CutToFit,
    Instruct,
    ModelName,
    StrictModel,
    Text,
    TokenIds,
    TruncationDirection,
    Usage,
    cut_end,
    integral,
    own_tokens_limit,
)
from scorekeeper_worker.planning.encoding import Direction, LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk


def _id_shape(value: Any) -> str | None:
    if isinstance(value, str):
        return "<text>"
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return "<int>" if integral and not isinstance(value, bool) else None


DocumentId = Annotated[
    Annotated[Text, Tag("<text>")]
    | Annotated[int, Field(ge=-MAX_INT, le=MAX_INT), BeforeValidator(integral), Tag("<int>")],
    Discriminator(_id_shape, custom_error_type="id_type",
                  custom_error_message="Input should be a string or an integer"),
]


class RerankDocument(StrictModel):
    """A document as an object (Cohere v1, Jina): its text, and an id echoed in its result."""

    text: Text
    id: DocumentId | None = None


def _document_shape(value: Any) -> str | None:
    return "<text>" if isinstance(value, str) else "<object>" if isinstance(value, dict | RerankDocument) else None


Document = Annotated[
    Annotated[Text, Tag("<text>")] | Annotated[RerankDocument, Tag("<object>")],
    Discriminator(_document_shape, custom_error_type="document_type",
                  custom_error_message="Input should be text or an object with text (and an optional id)"),
]


class RerankRequest(StrictModel):
    query: Text
    documents: list[Document]
    model: ModelName = None
    top_n: Count | None = Field(None, description="return only the best top_n (more than there are: all)")
    return_documents: bool = False
    instruct: Instruct = None
    truncate: CutToFit = False
    truncation_direction: TruncationDirection = cut_end("a document")
    max_tokens_per_doc: Count | None = own_tokens_limit("document")
    long_document_strategy: Literal["truncate", "chunk"] = Field(
        "truncate", description="chunk: a document over the limit is scored in consecutive windows that fit beside "
                                "the query; its relevance is the best window's")
    max_chunks_per_doc: Count = Field(8, description="windows per document with chunk (the rest is dropped)")

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankedDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankedDocument | None = Field(None, description="with return_documents only")
    id: str | int | None = Field(None, description="the document's id, when it had one")


class RerankResponse(BaseModel):
    id: str = Field(description="the request id (x-request-id)")
    model: str
    results: list[RerankResult]
    usage: Usage


def _input_shape(value: Any) -> str | None:
    """A list is read by its first element: lists (token-id lists), numbers (token ids: 0.0 is the integer 0 in
    JSON Schema, and a fraction is refused as a token id), anything else texts."""
    if isinstance(value, str):
        return "<text>"
    if not isinstance(value, list):
        return None
    if value and isinstance(value[0], list):
        return "<lists>"
    number = value and isinstance(value[0], int | float) and not isinstance(value[0], bool)
    return "<list>" if number else "<texts>"


EmbeddingInput = Annotated[
    Annotated[Text, Tag("<text>")] | Annotated[list[Text], Tag("<texts>")]
    | Annotated[TokenIds, Tag("<list>")] | Annotated[list[TokenIds], Field(min_length=1), Tag("<lists>")],
    Discriminator(_input_shape, custom_error_type="input_type", custom_error_message=(
        "Input should be text, a list of texts, a list of token ids or a list of token-id lists")),
]


class EmbeddingRequest(StrictModel):
    input: EmbeddingInput
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each embedding as little-endian float32 bytes, base64-encoded")
    dimensions: Count | None = Field(None, description="only the model's own dimension is accepted")
    user: Text | None = Field(None, description="accepted and ignored (OpenAI clients send it)")
    truncate: bool = Field(False, description="cut inputs over the model's maximum to fit (false: 400)")
    truncation_direction: TruncationDirection = cut_end("an input")
    prompt_name: Text | None = Field(
        None, description="one of the model's sentence-transformers prompts (config_sentence_transformers.json), "
                          "prepended to every text input; default: the model's default_prompt_name, if any")

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        value = self.input
        if isinstance(value, str):
            return [value]
        return [value] if value and isinstance(value[0], int) else value  # type: ignore[list-item,return-value]

    def ask(self, served_name: str = "") -> ScoreAsk:
        """The inputs' embeddings, with no query row; `served_name` answers a request that names no model."""
        inputs = self.inputs
        rules = LengthRules(truncate=self.truncate, direction=Direction(self.truncation_direction), field="input")
        return ScoreAsk(query=[] if inputs and isinstance(inputs[0], list) else "", items=inputs, rules=rules,
                        prompt_name=self.prompt_name, embed=True, model_name=self.model or served_name)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
