"""POST /v1/rerank (Cohere/Jina shape) on the /v1/score engine: one relevance score per document, sorted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scorekeeper_worker.loader import ModelKind
from scorekeeper_worker.schemas import BadRequest, RerankRequest, RerankResponse, RerankResult, ScoreRequest

if TYPE_CHECKING:
    from scorekeeper_worker.service import ScoringService


async def rerank(service: ScoringService, request: RerankRequest) -> RerankResponse:
    """Relevance: sigmoid of a single logit (cross-encoders, reward-style classifiers), the last class's
    probability for multi-class classifiers, cosine for embedding models."""
    model = service.model
    if model is not None and model.kind == ModelKind.CAUSAL_LM:
        raise BadRequest("model: /v1/rerank needs a classifier, cross-encoder or embedding model; "
                         "use /v1/score with label_token_ids for causal LMs")
    response = await service.score(ScoreRequest(query=request.query, items=request.documents, apply_softmax=True,
                                                model=request.model))
    relevance = [row[-1] for row in response.scores]
    order = sorted(range(len(relevance)), key=lambda i: relevance[i], reverse=True)[: request.top_n]
    results = [RerankResult(index=i, relevance_score=relevance[i],
                            document={"text": request.documents[i]} if request.return_documents else None)
               for i in order]
    return RerankResponse(model=request.model, results=results, usage=response.usage)
