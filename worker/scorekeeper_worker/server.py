"""HTTP: FastAPI routes, error mapping (400/413/429/503, never 500 for bad input), metrics, graceful drain."""

from __future__ import annotations

import logging
import math
import sys
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
from scorekeeper_worker.metrics import WorkerMetrics
from scorekeeper_worker.rerank import rerank
from scorekeeper_worker.scheduler import Overloaded
from scorekeeper_worker.schemas import (
    BadRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from scorekeeper_worker.service import NonFiniteScore, NotReady, ScoringService
from scorekeeper_worker.termination import EXIT_LOAD_FAILED, failure_reason, write_termination_message

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
            except Exception as error:  # never ready; `run` writes the reason and exits non-zero
                service.failure = failure_reason(config.model, error)
                service.failed = True
                log.exception("model failed to load")
                on_failure: Callable[[str], None] | None = getattr(app.state, "on_load_failure", None)
                if on_failure is not None:
                    on_failure(service.failure)

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

    @app.exception_handler(Overloaded)
    async def on_overload(_: Request, error: Overloaded) -> JSONResponse:
        metrics.rejected.labels("queue_full").inc()
        return _error(429, "TooManyRequests", f"server busy: {error}", {"Retry-After": RETRY_AFTER_SECONDS})

    @app.exception_handler(NonFiniteScore)
    async def on_non_finite(_: Request, error: NonFiniteScore) -> JSONResponse:
        log.error("%s", error)
        return _error(500, "InternalServerError", str(error))

    @app.exception_handler(NotReady)
    async def on_not_ready(_: Request, error: NotReady) -> JSONResponse:
        return _error(503, "ServiceUnavailable", str(error), {"Retry-After": RETRY_AFTER_SECONDS})

    @app.post("/v1/score", response_model=ScoreResponse, responses={400: {"model": ErrorResponse}})
    async def score(request: ScoreRequest) -> Response:
        response = await service.score(request)
        started = time.perf_counter()
        body = Response(response.model_dump_json(), media_type="application/json")
        metrics.stage_seconds.labels("serialize").observe(time.perf_counter() - started)
        return body

    @app.post("/v1/rerank", response_model=RerankResponse, responses={400: {"model": ErrorResponse}})
    async def rerank_route(request: RerankRequest) -> RerankResponse:
        return await rerank(service, request)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        model = service.model
        cards = [] if model is None else [ModelCard(id=model.name, kind=model.kind.value,
                                                    max_positions=model.max_positions)]
        return ModelList(data=cards)

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.failed:  # the process is about to exit; a liveness probe must not keep it around either
            return JSONResponse({"status": "failed", "reason": service.failure}, status_code=503)
        return JSONResponse({"status": "alive"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if service.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "failed" if service.failed else "loading"}, status_code=503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes.update(route.path for route in app.routes if isinstance(route, APIRoute))
    return app


def run(config: WorkerConfig) -> None:
    """Serve until stopped; a model that fails to load (or fails the self-check) writes its reason to the
    termination-message file, stops the server and exits with EXIT_LOAD_FAILED."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           timeout_graceful_shutdown=max(1, math.ceil(config.drain_timeout_seconds))))

    def on_load_failure(reason: str) -> None:
        write_termination_message(config.termination_log, reason)
        server.should_exit = True

    app.state.on_load_failure = on_load_failure
    server.run()
    if app.state.service.failed:
        log.error("exiting with status %d: %s", EXIT_LOAD_FAILED, app.state.service.failure)
        sys.exit(EXIT_LOAD_FAILED)
