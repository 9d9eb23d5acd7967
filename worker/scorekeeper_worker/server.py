"""HTTP: FastAPI routes, error mapping (400/413/429/503/504, never 500 for bad input), metrics, graceful drain."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from scorekeeper_worker.config import WorkerConfig
from scorekeeper_worker.disconnect import ClientDisconnected, cancel_on_disconnect
from scorekeeper_worker.metrics import WorkerMetrics
from scorekeeper_worker.rerank import rerank
from scorekeeper_worker.scheduler import Overloaded
from scorekeeper_worker.schemas import (
    BadRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    RequestTooLarge,
    RerankRequest,
    RerankResponse,
    ResponseTooLarge,
    ScoreRequest,
    ScoreResponse,
)
from scorekeeper_worker.service import NotReady, RequestTimedOut, ScoringService

log = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = "1"
SCORING_PATHS = frozenset({"/v1/score", "/v1/rerank"})


def _error(code: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(message=message, type=kind, code=code).model_dump()
    return JSONResponse(body, status_code=code, headers=headers)


def _validation_message(error: ValidationError | RequestValidationError) -> str:
    parts = []
    for detail in error.errors():
        where = ".".join(str(p) for p in detail.get("loc", ()) if p != "body")
        message = str(detail.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def create_app(config: WorkerConfig, load_in_background: bool = True) -> FastAPI:
    metrics = WorkerMetrics()
    metrics.configure(config)
    service = ScoringService(config, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        def load() -> None:
            try:
                service.load()
            except Exception:  # keep /health alive but never ready; the log says why
                service.failed = True
                log.exception("model failed to load")

        loader = threading.Thread(target=load, name="scorekeeper-load", daemon=True)
        loader.start()
        if not load_in_background:
            loader.join()
        yield
        service.stop()  # uvicorn has already drained in-flight HTTP requests

    app = FastAPI(title="Scorekeeper worker", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    app.state.metrics = metrics

    routes: set[str] = set()  # filled once every route is declared (end of create_app)

    @app.middleware("http")
    async def limits_and_metrics(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        path = request.url.path
        scoring = path in SCORING_PATHS
        length = request.headers.get("content-length")
        if length is None and request.method == "POST":
            # Chunked upload: no declared length, so measure the body (Starlette hands the read body on).
            length = str(len(await request.body()))
        if length is not None and length.isdigit() and int(length) > config.max_request_bytes:
            metrics.rejected.labels("body_too_large").inc()
            response: Response = _error(413, "RequestTooLarge",
                                        f"body of {length} bytes exceeds the limit of {config.max_request_bytes}")
        else:
            if scoring:  # only scoring work: a scrape or probe must not count itself as in flight
                metrics.inflight.inc()
            try:
                response = await call_next(request)
            finally:
                if scoring:
                    metrics.inflight.dec()
        # One label value per declared route, never the raw path: scanners probing random URLs would otherwise
        # create an unbounded number of series.
        metrics.requests.labels(path if path in routes else "other", str(response.status_code)).inc()
        if scoring:
            metrics.stage_seconds.labels("end_to_end").observe(time.perf_counter() - started)
        return response

    @app.exception_handler(Exception)
    async def on_internal_error(_: Request, error: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(500, "InternalServerError", f"internal error: {type(error).__name__}")

    @app.exception_handler(RequestValidationError)
    async def on_schema_error(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(400, "BadRequestError", _validation_message(error))

    @app.exception_handler(BadRequest)
    async def on_bad_request(_: Request, error: BadRequest) -> JSONResponse:
        return _error(400, "BadRequestError", str(error))

    @app.exception_handler(ResponseTooLarge)
    async def on_response_too_large(_: Request, error: ResponseTooLarge) -> JSONResponse:
        metrics.rejected.labels("response_bytes").inc()
        return _error(400, "BadRequestError", str(error))

    @app.exception_handler(RequestTooLarge)
    async def on_too_many_tokens(_: Request, error: RequestTooLarge) -> JSONResponse:
        metrics.rejected.labels("request_tokens").inc()
        return _error(413, "RequestTooLarge", str(error))

    @app.exception_handler(RequestTimedOut)
    async def on_timeout(_: Request, error: RequestTimedOut) -> JSONResponse:
        return _error(504, "GatewayTimeout", str(error))

    @app.exception_handler(ClientDisconnected)
    async def on_disconnect(_: Request, error: ClientDisconnected) -> JSONResponse:
        # Nobody reads this response; the status (nginx's "client closed request") shows up in the request metrics.
        metrics.cancelled.labels("disconnect").inc()
        return _error(499, "ClientClosedRequest", str(error))

    @app.exception_handler(Overloaded)
    async def on_overload(_: Request, error: Overloaded) -> JSONResponse:
        metrics.rejected.labels("queue_full").inc()
        return _error(429, "TooManyRequests", f"server busy: {error}", {"Retry-After": RETRY_AFTER_SECONDS})

    @app.exception_handler(NotReady)
    async def on_not_ready(_: Request, error: NotReady) -> JSONResponse:
        return _error(503, "ServiceUnavailable", str(error), {"Retry-After": RETRY_AFTER_SECONDS})

    # Scoring routes race their work against the client's connection (a disconnect drops the queued work) and
    # serialise in a worker thread (a large response must not stall the event loop).
    @app.post("/v1/score", response_model=ScoreResponse, responses={400: {"model": ErrorResponse}})
    async def score(body: ScoreRequest, http: Request) -> Response:
        response = await cancel_on_disconnect(service.score(body), http.receive)
        started = time.perf_counter()
        content = await asyncio.to_thread(response.model_dump_json)
        metrics.stage_seconds.labels("serialize").observe(time.perf_counter() - started)
        return Response(content, media_type="application/json")

    @app.post("/v1/rerank", response_model=RerankResponse, responses={400: {"model": ErrorResponse}})
    async def rerank_route(body: RerankRequest, http: Request) -> Response:
        response = await cancel_on_disconnect(rerank(service, body), http.receive)
        return Response(await asyncio.to_thread(response.model_dump_json), media_type="application/json")

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        model = service.model
        cards = [] if model is None else [ModelCard(id=model.name, kind=model.kind.value,
                                                    max_positions=model.max_positions)]
        return ModelList(data=cards)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if service.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes.update(route.path for route in app.routes if isinstance(route, APIRoute))
    return app


def run(config: WorkerConfig) -> None:
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=config.log_level,
                timeout_graceful_shutdown=max(1, math.ceil(config.drain_timeout_seconds)))
