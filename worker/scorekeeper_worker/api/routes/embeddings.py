"""POST /v1/embeddings (OpenAI shape) for embedding models: each input embedded alone, exactly as
`SentenceTransformer.encode(inputs, prompt_name=...)` does (the model directory's prompt, max_seq_length, pooling,
Normalize and truncate_dim), on the /v1/score engine (same batching, limits, errors and metrics)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

from scorekeeper_worker.api.wire.compat import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.model.loader import ModelKind

if TYPE_CHECKING:
    from scorekeeper_worker.serving.service import ScoringService


def _base64(vector: list[float]) -> str:
    """OpenAI's encoding_format "base64": the float32 little-endian bytes of the vector."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def response(request: EmbeddingRequest, vectors: list[list[float]], prompt_tokens: int,
             served_name: str) -> EmbeddingResponse:
    encode = _base64 if request.encoding_format == "base64" else list
    data = [Embedding(index=i, embedding=encode(vector)) for i, vector in enumerate(vectors)]
    return EmbeddingResponse(data=data, model=request.model or served_name,
                             usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens))


async def embed(service: ScoringService, request: EmbeddingRequest,
                served_name: str) -> tuple[list[list[float]], int]:
    """The inputs' embeddings, in order, and the tokens that ran."""
    model = service.model
    if model is not None and model.kind != ModelKind.EMBEDDING:
        raise Invalid("model", f"/v1/embeddings needs an embedding model; this server serves a {model.kind.value} "
                         "(use /v1/score or /v1/rerank)")
    dimensions = model.sentence_config.truncate_dim or model.hidden_size if model is not None else None
    if dimensions is not None and request.dimensions is not None and request.dimensions != dimensions:
        raise Invalid("dimensions", f"this model's embeddings have {dimensions} dimensions; "
                         f"{request.dimensions} is not offered")
    scored = await service.run(request.ask(served_name))
    return scored.pooled or [], scored.prompt_tokens
