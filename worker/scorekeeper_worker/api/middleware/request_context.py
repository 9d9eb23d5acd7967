"""The outermost layer of every request (pure ASGI): its id, its metrics, the in-flight count the drain waits for,
and the last word on errors.

- `x-request-id`: the client's, when it is sane (1-128 visible ASCII characters), else a new one; echoed in the
  response and stamped on every log line written while the request is handled (logs.py).
- `scorekeeper_requests_total{endpoint, code}` counts every answer, 5xx included, by declared route ("other" for
  any other path, so scanners cannot create series without bound).
- An exception that escapes the app becomes the error response here and is logged once, with the request id;
  nothing is re-raised, so uvicorn does not log it a second time.
- A request the server cancels (uvicorn cancels what still runs when the drain time is over) is answered 503 in the
  error shape, not uvicorn's plain-text 500 and its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Collection

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scorekeeper_worker.api.drain import Drain
from scorekeeper_worker.api.error_shape import error_for
from scorekeeper_worker.base.errors import NotReady
from scorekeeper_worker.base.logs import REQUEST_ID
from scorekeeper_worker.base.metrics import WorkerMetrics

log = logging.getLogger(__name__)
SCORING_PATHS = frozenset({"/v1/score", "/v1/rerank", "/v2/rerank", "/v1/embeddings", "/v1/decisions",
                           "/v1/systemone"})
_SANE_ID = re.compile(rb"[!-~]{1,128}")


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _SANE_ID.fullmatch(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


class ErrorReporter:
    """Exception → response (errors.error_for), plus what the server records about it: the capacity-refusal
    counter and one log line (a 500 with its traceback)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def answer(self, error: Exception, method: str, path: str) -> JSONResponse:
        body, headers = error_for(error, method, path, REQUEST_ID.get())
        reason = getattr(error, "reason", None)
        if reason is not None:
            self.metrics.rejected.labels(reason).inc()
        cancelled = getattr(error, "cancelled", None)
        if cancelled is not None:
            self.metrics.cancelled.labels(cancelled).inc()
        if body.code == 500:
            log.error("%s %s failed: %s: %s", method, path, type(error).__name__, error, exc_info=error)
        else:  # an answer the server meant to give (metrics count them; a probe during loading is one too)
            log.info("%s %s → %d %s: %s", method, path, body.code, body.type, body.message)
        return JSONResponse(body.model_dump(), status_code=body.code, headers=headers)


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: WorkerMetrics, drain: Drain, routes: Collection[str],
                 reporter: ErrorReporter) -> None:
        self.app = app
        self.metrics = metrics
        self.drain = drain
        self.routes = routes  # filled once every route is declared
        self.reporter = reporter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _request_id(scope)
        token = REQUEST_ID.set(request_id)
        path = scope["path"]
        scoring = path in SCORING_PATHS  # a scrape or probe does not count as in flight
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)

        if scoring:
            self.drain.inflight += 1
            self.metrics.inflight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as error:
            if status is None:
                await self.reporter.answer(error, scope["method"], path)(scope, receive, send_with_id)
            else:  # the answer has begun: it cannot become an error any more; uvicorn closes the connection
                log.error("%s %s failed after its response started", scope["method"], path, exc_info=error)
        except asyncio.CancelledError:  # only uvicorn's shutdown cancels a request: the drain time is over
            if status is not None:
                raise
            stopped = NotReady("the worker is shutting down: the request was still running when the drain time "
                               "(--drain-timeout-seconds) ran out, and was cancelled; retry it")
            await self.reporter.answer(stopped, scope["method"], path)(scope, receive, send_with_id)
        finally:
            if scoring:
                self.drain.inflight -= 1
                self.metrics.inflight.dec()
                self.metrics.stage_seconds.labels("end_to_end").observe(time.perf_counter() - started)
            if status is not None:  # a request cancelled before any answer (server stopping) has no status to count
                self.metrics.requests.labels(path if path in self.routes else "other", str(status)).inc()
            REQUEST_ID.reset(token)
