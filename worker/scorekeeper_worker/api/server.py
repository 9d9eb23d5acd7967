"""HTTP: the FastAPI app (routes, their declared errors) wrapped in pure-ASGI layers, and the server that drains.

Layers, outermost first: RequestContext (request id, metrics, the error of last resort), ApiKeyAuth (with
--api-key-file), BodyLimit (--max-request-bytes as bytes arrive), then FastAPI's exception handlers and routes.
Every non-2xx answer goes through one mapping (errors.error_for) and has the same shape.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import transformers
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from scorekeeper_worker.api.access_log import uvicorn_log_config
from scorekeeper_worker.api.drain import Drain, DrainingServer
from scorekeeper_worker.api.error_shape import error_responses
from scorekeeper_worker.api.http_protocol import quiet_accept_errors, server_options
from scorekeeper_worker.api.listeners import listen
from scorekeeper_worker.api.metrics_server import MetricsServer
from scorekeeper_worker.api.middleware.auth import ApiKeyAuth, ApiKeys
from scorekeeper_worker.api.middleware.parse_gate import ParseGate
from scorekeeper_worker.api.middleware.per_request import (
    BodyLimit,
    ErrorReporter,
    JSONRoute,
    RequestContext,
    cancel_on_disconnect,
)
from scorekeeper_worker.api.openapi import openapi_document
from scorekeeper_worker.api.preflight import REFUSALS, preflight
from scorekeeper_worker.api.routes.decisions import add_routes as add_decision_routes
from scorekeeper_worker.api.routes.embeddings import embed
from scorekeeper_worker.api.routes.embeddings import response as embedding_response
from scorekeeper_worker.api.routes.rerank import rerank
from scorekeeper_worker.api.termination import (
    EXIT_DEVICE_LOST,
    EXIT_LOAD_FAILED,
    failure_reason,
    write_termination_message,
)
from scorekeeper_worker.api.wire.compat import (
    EmbeddingRequest,
    EmbeddingResponse,
    RerankRequest,
    RerankResponse,
)
from scorekeeper_worker.api.wire.score import ModelCard, ModelList, ScoreRequest, ScoreResponse, Status
from scorekeeper_worker.base.config import Device, LogLevel, WorkerConfig
from scorekeeper_worker.base.errors import NotReady
from scorekeeper_worker.base.gpu_stats import TorchGpu
from scorekeeper_worker.base.logs import install_request_ids
from scorekeeper_worker.base.metrics import WorkerMetrics
from scorekeeper_worker.serving.service import ScoringService
from scorekeeper_worker.serving.startup import load as startup
from scorekeeper_worker.serving.startup.gc_pauses import GcPauseObserver

log = logging.getLogger(__name__)
EXIT_UNEXPECTED = 1  # what Python itself exits with on an uncaught exception
# Every route can answer these: a wrong method, a body over the limit (any request may carry one), a bug.
ANY_ROUTE = (405, 413, 500)
def create_app(config: WorkerConfig, load_in_background: bool = True,
               metrics_sockets: list[socket.socket] | None = None) -> FastAPI:
    """The app; `metrics_sockets` are --metrics-port's, bound by `run` before start-up (else bound here)."""
    install_request_ids()
    metrics = WorkerMetrics()
    metrics.configure(config)
    if config.device == Device.CUDA:
        metrics.watch_gpu(TorchGpu())  # the worker runs on the current device, cuda:0 of those it sees
    service = ScoringService(config, metrics)
    drain = Drain()

    def on_failure(reason: str) -> None:  # `run` sets the hook: write the termination message, stop the server
        hook: Callable[[str], None] | None = getattr(app.state, "on_load_failure", None)
        if hook is not None:
            hook(reason)

    service.on_failure = on_failure
    gc_pauses = GcPauseObserver(metrics.gc_pauses)
    keys = ApiKeys(config.api_key_file) if config.api_key_file is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        quiet_accept_errors(asyncio.get_running_loop())
        scrapes = None
        if config.metrics_port is not None:
            sockets = metrics_sockets or listen(config.host, config.metrics_port, "--metrics-port")
            scrapes = MetricsServer(metrics.registry, sockets, server_options(config))
            scrapes.start()

        def load() -> None:
            try:
                service.serve(startup.load(config, metrics))
            except Exception as error:  # never ready; `run` says why in one line and exits non-zero
                service.fail(failure_reason(config.model, error))
                if not isinstance(error, REFUSALS):  # a bug: its traceback is what to report
                    log.exception("model failed to load")
                on_failure(service.failure or "")

        gc_pauses.install()
        loader = threading.Thread(target=load, name="scorekeeper-load", daemon=True)
        loader.start()
        if not load_in_background:
            loader.join()
        yield
        service.stop()  # the server has already drained in-flight HTTP requests
        gc_pauses.remove()
        if scrapes is not None:
            scrapes.stop()

    app = FastAPI(title="Scorekeeper worker", version="0.1.0", lifespan=lifespan)
    app.router.route_class = JSONRoute
    # HTTP hardening (issue 26): no redirect for a trailing slash (its Location would repeat the client's Host
    # header): a 404 names the path. A body is refused before parsing beyond this many arrays and objects
    # (api/middleware/per_request.py): four per item a request may hold, and room for the rest.
    app.router.redirect_slashes = False
    app.state.max_json_containers = 4 * config.max_items_per_request + 1024
    app.state.parse_gate = ParseGate()  # large bodies parsed one at a time, behind a bounded line
    app.state.service = service
    app.state.metrics = metrics
    app.state.drain = drain

    reporter = ErrorReporter(metrics)

    async def on_error(request: Request, error: Exception) -> Response:
        return reporter.answer(error, request.method, request.url.path)

    app.add_exception_handler(HTTPException, on_error)
    app.add_exception_handler(RequestValidationError, on_error)
    routes: set[str] = set()  # filled once every route is declared (end of create_app)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)  # innermost of the three
    if keys is not None:
        app.add_middleware(ApiKeyAuth, keys=keys)
    app.add_middleware(RequestContext, metrics=metrics, drain=drain, routes=routes, reporter=reporter)

    v1 = (401,) if keys is not None else ()
    served_name = config.name  # what GET /v1/models lists; the name a response gives when the request names none
    scoring_errors = error_responses(400, *v1, 429, 503, 504, *ANY_ROUTE)

    # Scoring routes race their work against the client's connection (a disconnect drops the queued work) and
    # serialise in a worker thread (a large response must not stall the event loop).
    @app.post("/v1/score", response_model=ScoreResponse, responses=scoring_errors)
    async def score(body: ScoreRequest, http: Request) -> Response:
        scored = await cancel_on_disconnect(service.run(body.ask(served_name)), http.receive)
        started = time.perf_counter()
        name = body.model or served_name
        content = await asyncio.to_thread(lambda: ScoreResponse.of(name, scored).model_dump_json())
        metrics.stage_seconds.labels("serialize").observe(time.perf_counter() - started)
        return Response(content, media_type="application/json")

    # /v2/rerank: the path Cohere's v2 clients post to (vLLM serves it too); the same route.
    @app.post("/v1/rerank", response_model=RerankResponse, responses=scoring_errors)
    @app.post("/v2/rerank", response_model=RerankResponse, responses=scoring_errors)
    async def rerank_route(body: RerankRequest, http: Request) -> Response:
        response = await cancel_on_disconnect(rerank(service, body, served_name), http.receive)
        # Cohere and Jina leave out what was not asked for (a result's document, an id the document did not have).
        content = await asyncio.to_thread(response.model_dump_json, exclude_none=True)
        return Response(content, media_type="application/json")

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=scoring_errors)
    async def embeddings_route(body: EmbeddingRequest, http: Request) -> Response:
        vectors, prompt_tokens = await cancel_on_disconnect(embed(service, body, served_name), http.receive)
        response = await asyncio.to_thread(embedding_response, body, vectors, prompt_tokens, served_name)
        return Response(await asyncio.to_thread(response.model_dump_json), media_type="application/json")

    # Decisions (/v1/decisions, /v1/systemone): served by causal LMs only (api/routes/decisions.SERVED_KINDS).
    add_decision_routes(app, service, scoring_errors)

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(*v1, *ANY_ROUTE))
    async def models() -> ModelList:
        model = service.model
        cards = [] if model is None else [ModelCard(id=model.name, kind=model.kind.value,
                                                    max_positions=model.max_positions)]
        return ModelList(data=cards)

    @app.get("/health", response_model=Status, responses=error_responses(503, *ANY_ROUTE))
    async def health() -> Status:
        if service.failed:  # the process is about to exit; a liveness probe must not keep it around either
            raise NotReady(service.failure or "model failed to load")
        return Status(status="alive")

    @app.get("/ready", response_model=Status, responses=error_responses(503, *ANY_ROUTE))
    async def ready() -> Status:
        if drain.started:
            raise NotReady("draining: the worker is shutting down")
        if not service.ready:
            raise NotReady(service.failure or "model failed to load" if service.failed else "model is loading")
        return Status(status="ready")

    if config.metrics_port is None:  # otherwise /metrics lives on its own port, alone
        @app.get("/metrics", response_class=Response, responses={
            200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            **error_responses(*ANY_ROUTE)})
        async def metrics_route() -> Response:
            return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes.update(route.path for route in app.routes if isinstance(route, APIRoute))
    app.openapi = lambda: openapi_document(  # type: ignore[method-assign]
        app, secured=keys is not None, model=service.model)  # the server as loaded (api/openapi.py)
    return app


def build_server(config: WorkerConfig, metrics_sockets: list[socket.socket] | None = None) -> DrainingServer:
    app = create_app(config, metrics_sockets=metrics_sockets)
    level = config.log_level.value
    # The levels are log_config's: uvicorn's own log_level would raise its life-cycle lines back to it.
    uvicorn_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=None,
                                    log_config=uvicorn_log_config(level),
                                    timeout_graceful_shutdown=max(1, math.ceil(config.drain_timeout_seconds)),
                                    **server_options(config))
    return DrainingServer(uvicorn_config, app.state.drain, config.drain_timeout_seconds)


def _where(sockets: list[socket.socket]) -> str:
    host, port = sockets[0].getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(config: WorkerConfig) -> None:
    """Serve until stopped. What can be refused before serving raises StartupRefused (cli.py: one line, its exit
    status); a model that fails to load later (or fails the self-check) writes its reason to the termination-message
    file, stops the server and exits with EXIT_LOAD_FAILED."""
    listeners = preflight(config)
    transformers.utils.logging.disable_progress_bar()  # a bar redrawn with \r is no log line
    if config.log_level != LogLevel.DEBUG:  # its load report of missing weights repeats the worker's refusal
        transformers.utils.logging.set_verbosity_error()
    server = build_server(config, listeners.metrics)
    service = server.config.app.state.service

    def on_load_failure(reason: str) -> None:
        write_termination_message(config.termination_log, reason)
        server.should_exit = True

    server.config.app.state.on_load_failure = on_load_failure
    scrapes = "/metrics there too" if listeners.metrics is None else f"/metrics on {_where(listeners.metrics)}"
    # Said instead of uvicorn's "Uvicorn running on", which reads as if the worker could already serve.
    log.info("listening on %s (%s); loading %s: /ready answers 503 until it is loaded and checked",
             _where(listeners.api), scrapes, config.model)
    try:
        server.run(sockets=listeners.api)
    except SystemExit:
        if server.started:
            raise
        sys.exit(EXIT_UNEXPECTED)  # uvicorn's start-up failed (its traceback is logged): neither a model nor a port
    if service.failed:
        status = EXIT_DEVICE_LOST if service.device_lost else EXIT_LOAD_FAILED
        log.error("exiting with status %d: %s", status, service.failure)
        sys.exit(status)
