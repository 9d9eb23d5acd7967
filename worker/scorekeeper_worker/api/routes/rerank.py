"""POST /v1/rerank (Cohere v2 / Jina shape) on the /v1/score engine: one relevance score per document, sorted.

Relevance per scored sequence: a causal LM's first label token against the others (`softmax(logits[labels])[0]`,
the server's --label-tokens: " yes" before " no"); a single logit through the activation the model declares
(sentence-transformers' CrossEncoder: sigmoid by default, identity, tanh); the last class's probability for several
logits (softmax, or its own sigmoid for a multi-label classifier); the model's similarity (cosine by default) for
embedding models. A document chunked into windows gets its best window's relevance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scorekeeper_worker.api.wire.compat import RerankedDocument, RerankRequest, RerankResponse, RerankResult
from scorekeeper_worker.api.wire.score import Usage
from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.base.logs import REQUEST_ID
from scorekeeper_worker.model.loader import ModelKind
from scorekeeper_worker.planning.encoding import Direction, LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk

if TYPE_CHECKING:
    from scorekeeper_worker.serving.service import ScoringService


def best_per_document(relevance: list[float], rows_of: list[int], documents: int) -> list[float]:
    best = [float("-inf")] * documents
    for score, document in zip(relevance, rows_of, strict=True):
        best[document] = max(best[document], score)
    return best


def ranked(scores: list[float], top_n: int | None) -> list[int]:
    """Document indexes by relevance, highest first; equal scores keep request order (a stable sort)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]


async def rerank(service: ScoringService, request: RerankRequest, served_name: str) -> RerankResponse:
    """`served_name` names the model in the answer to a request that names none."""
    model = service.model
    name = request.model or served_name
    causal = model is not None and model.kind == ModelKind.CAUSAL_LM
    if causal and model is not None and model.default_labels is None:
        raise Invalid("model", "/v1/rerank on a causal LM needs label tokens: start the server with --label-tokens "
                         "(\"yes,no\": relevance is the first one's probability) or a --prompt-template that has "
                         "them; or use /v1/score with label_token_ids")
    # A single logit's relevance is the activation the model declares (CrossEncoder.rank), sigmoid by default.
    single_logit = model is not None and model.kind in (ModelKind.CROSS_ENCODER, ModelKind.CLASSIFIER) \
        and model.logit_size == 1
    texts = request.texts
    rules = LengthRules(truncate=request.truncate, direction=Direction(request.truncation_direction),
                        max_item_tokens=request.max_tokens_per_doc, chunk=request.long_document_strategy == "chunk",
                        max_chunks=request.max_chunks_per_doc, field="documents")
    scored = await service.run(ScoreAsk(query=request.query, items=texts, apply_softmax=not single_logit,
                                        instruct=request.instruct, rules=rules, model_name=name))
    if single_logit and model is not None:
        rows = [model.sentence_config.activation.apply(row[0]) for row in scored.rows]
    else:
        rows = [row[0] if causal else row[-1] for row in scored.rows]
    relevance = best_per_document(rows, scored.rows_of, len(texts))
    results = []
    for i in ranked(relevance, request.top_n):
        document = request.documents[i]
        results.append(RerankResult(
            index=i, relevance_score=relevance[i], id=None if isinstance(document, str) else document.id,
            document=RerankedDocument(text=texts[i]) if request.return_documents else None))
    usage = Usage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens)
    return RerankResponse(id=REQUEST_ID.get(), model=name, results=results, usage=usage)
