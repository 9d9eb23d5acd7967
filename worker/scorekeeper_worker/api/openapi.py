"""The OpenAPI document: FastAPI's, less its 422 (validation errors are 400s here), plus what the ASGI layers add
(the x-request-id header, the bearer scheme on /v1), and describing the server as loaded, so that every body the
document calls valid can be served by this model:
- /v1/embeddings is listed only when the model is an embedding model, /v1/decisions and /v1/systemone only when it
  is a causal LM (api/routes/decisions.SERVED_KINDS);
- where a query and an item can both be empty and then make a sequence of no tokens (token ids, always; text, on a
  decoder whose tokenizer adds no special tokens and with no prompt template), the request schema says `not` that;
- token ids are bounded by the model's embedding rows (query, items, /v1/embeddings input) and, on a causal LM,
  label tokens by its output rows (elsewhere they are ignored, any id is accepted);
- `instruct` (/v1/score, /v1/rerank, /v2/rerank) is left out where no prompt template has an {instruct} to fill.
Until the model has loaded the document is not cached (it cannot say all this yet).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from scorekeeper_worker.api.middleware.auth import is_protected
from scorekeeper_worker.api.routes.decisions import DECISIONS, SERVED_KINDS, SYSTEMONE
from scorekeeper_worker.model.loader import ModelKind, ScoringModel

REQUEST_ID_HEADER = {"x-request-id": {"description": "the request's id (the client's x-request-id, or a new one); "
                                                     "log lines written for the request carry it",
                                      "schema": {"type": "string"}, "required": True}}
EMPTY_QUERY_TEXT = {"enum": ["", None]}  # also matches a query left out (`properties` holds for absent fields)
EMPTY_QUERY_IDS = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}
EMPTY_TEXT = {"const": ""}
EMPTY_IDS = {"type": "array", "maxItems": 0}


def _empty_pairs(model: ScoringModel) -> tuple[dict[str, Any], dict[str, Any]]:
    """`not` clauses for /v1/score and /v1/rerank: the bodies whose query and some item are both empty and give
    no tokens on this model (empty clauses when there are none)."""
    ids = {"properties": {"query": EMPTY_QUERY_IDS, "items": {"type": "array", "contains": EMPTY_IDS}},
           "required": ["items"]}
    if model.kind == ModelKind.EMBEDDING:  # every sequence alone: the query's own emptiness is model-dependent
        return {}, {}
    if model.kind == ModelKind.CROSS_ENCODER or model.template is not None or model.specials.prefix \
            or model.specials.suffix:  # text always gets tokens
        return {"not": ids}, {}
    text = {"properties": {"query": EMPTY_QUERY_TEXT,
                           "items": {"anyOf": [EMPTY_TEXT, {"type": "array", "contains": EMPTY_TEXT}]}},
            "required": ["items"]}
    document = {"anyOf": [EMPTY_TEXT, {"type": "object", "properties": {"text": EMPTY_TEXT}, "required": ["text"]}]}
    rerank = {"properties": {"query": EMPTY_TEXT, "documents": {"type": "array", "contains": document}},
              "required": ["query", "documents"]}
    return {"not": {"anyOf": [text, ids]}}, {"not": rerank}


def _bound_ids(node: Any, maximum: int) -> None:
    """Every token id (a non-negative integer) under `node` bounded by `maximum`."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and node.get("minimum") == 0:
            node["maximum"] = maximum
        for value in node.values():
            _bound_ids(value, maximum)
    elif isinstance(node, list):
        for value in node:
            _bound_ids(value, maximum)


def _token_ids(schemas: dict[str, Any], model: ScoringModel) -> None:
    rows = model.vocabulary.input_rows if model.vocabulary is not None else \
        model.model.get_input_embeddings().num_embeddings
    score = schemas["ScoreRequest"]["properties"]
    for ids in (score["query"], score["items"], schemas["EmbeddingRequest"]["properties"]["input"]):
        _bound_ids(ids, rows - 1)
    if model.kind == ModelKind.CAUSAL_LM:
        _bound_ids(score["label_token_ids"], model.logit_size - 1)


def _instruct(schemas: dict[str, Any], model: ScoringModel) -> None:
    if model.template is not None and model.template.has_instruct:
        return
    for name in ("ScoreRequest", "RerankRequest"):
        schemas[name]["properties"].pop("instruct", None)
    for branch in schemas["ScoreRequest"].get("anyOf", []):
        branch.get("properties", {}).pop("instruct", None)


def _describe_the_model(schema: dict[str, Any], model: ScoringModel) -> None:
    if model.kind != ModelKind.EMBEDDING:
        schema["paths"].pop("/v1/embeddings", None)
    if model.kind not in SERVED_KINDS:
        for path in (DECISIONS, SYSTEMONE):
            schema["paths"].pop(path, None)
    _token_ids(schema["components"]["schemas"], model)
    _instruct(schema["components"]["schemas"], model)
    score, rerank = _empty_pairs(model)
    schema["components"]["schemas"]["ScoreRequest"].update(score)
    schema["components"]["schemas"]["RerankRequest"].update(rerank)


def openapi_document(app: FastAPI, secured: bool, model: ScoringModel | None) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for unused in ("HTTPValidationError", "ValidationError"):
        schema["components"]["schemas"].pop(unused, None)
    if secured:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            operation["responses"].pop("422", None)
            for response in operation["responses"].values():
                response["headers"] = {**response.get("headers", {}), **REQUEST_ID_HEADER}
            if secured and is_protected(path):
                operation["security"] = [{"bearer": []}]
    if model is not None:
        _describe_the_model(schema, model)
        app.openapi_schema = schema
    return schema
