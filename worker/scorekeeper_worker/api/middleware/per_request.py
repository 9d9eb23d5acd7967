"""The per-request middleware, outermost first: the request's context, the body limit, strict JSON bodies, and the
disconnect watch. Each guards one request; none buffers more of it than it must.

The request's context (pure ASGI): its id, its metrics, the in-flight count the drain waits for, and the last word
on errors.
- `x-request-id`: the client's, when it is sane (1-128 visible ASCII characters), else a new one; echoed in the
  response and stamped on every log line written while the request is handled (logs.py).
- `scorekeeper_requests_total{route, code}` counts every answer, 5xx included, by declared route ("other" for
  any other path, so scanners cannot create series without bound).
- An exception that escapes the app becomes the error response here and is logged once, with the request id;
  nothing is re-raised, so uvicorn does not log it a second time.
- A request the server cancels (uvicorn cancels what still runs when the drain time is over) is answered 503 in the
  error shape, not uvicorn's plain-text 500 and its traceback.

--max-request-bytes, enforced as the body arrives (pure ASGI, so nothing is buffered to measure it). A declared
`Content-Length` over the limit is refused before any byte is read. Otherwise the bytes are counted as the app
receives them, chunked or not, and the read that crosses the limit raises `PayloadTooLarge` (413): FastAPI lets it
through its body parsing, and uvicorn discards the rest of the upload without keeping it. Every other message
(`http.disconnect` included) passes through unchanged, so the app's view of `receive` is the client's.

Request bodies parsed strictly and off the event loop, so that no body, however malformed or large, reaches a 500,
FastAPI's own error shape, or a stalled loop. FastAPI's route handler parses JSON with `Request.json()` and then
validates it; `JSONRoute` hands it a request whose `json()` does both in a worker thread and returns the validated
model (which FastAPI's own validation then passes through unchanged). A thread is enough only because no step holds
the interpreter for long: `json.loads` and pydantic hold it for the whole of one call, and a body of millions of
small arrays costs seconds there (mostly the garbage collector, which walks every container), so such a body is
refused before it is parsed, from a scan of its bytes (`structure`: 1 MiB at a time, each step a call of about a
millisecond that never casts inside numpy's loops, which would hold the lock: a cumsum of int32 into int64 held it
for 0.3 s per 8 MB body, and four such bodies stalled /health for 0.7 s). Bodies of 1 MiB or more are parsed one at
a time, behind a bounded line (api/middleware/parse_gate.py: 429 when it is full), so the event loop waits behind
one parse at most. Then:
- UTF-8 is decoded with `surrogateescape`, so invalid bytes survive as lone surrogates and the request model's text
  check names the field that holds them (instead of one "body is not UTF-8" for the whole request);
- nesting deeper than MAX_DEPTH is refused from the same scan;
- every parse failure (syntax, integers of more than 4,300 digits) is a 400 that says what is wrong.
A body sent without a JSON content type is a 400 saying which content type to send; a compressed body, or one in
another charset than UTF-8, is a 415.

A client that goes away cancels its request's work. Starlette (and so FastAPI) never cancels a route handler when
its client disconnects: the handler runs to the end and its response is thrown away. So a scoring route races its
work against the ASGI `receive` channel, which, once the body has been read, yields nothing until
`http.disconnect`. Cancelling the work task lets the service drop the request's queued units (`Scheduler.cancel`).
Pure ASGI: it works under any middleware that passes `receive` on.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import functools
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scorekeeper_worker.api.drain import Drain
from scorekeeper_worker.api.error_shape import (
    BadBody,
    ClientDisconnected,
    PayloadTooLarge,
    UnsupportedMediaType,
    error_for,
    validation_message,
)
from scorekeeper_worker.api.middleware.parse_gate import LARGE_BODY_BYTES, ParseGate
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


def request_header(scope: Scope, wanted: bytes) -> bytes | None:
    """The value of a request's first header named `wanted` (lower case, as ASGI gives names), or None."""
    return next((value for name, value in scope["headers"] if name == wanted), None)


def _content_length(scope: Scope) -> int | None:
    value = request_header(scope, b"content-length")
    return int(value) if value is not None and value.isdigit() else None


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes (refused after {received})")
            return message

        await self.app(scope, counted_receive, send)


JSON_TYPES = ("application/json",)
MAX_DEPTH = 32  # arrays and objects inside each other; the deepest body of this API nests 4
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')  # every byte but a quote and the brackets
# Bytes the scan takes at a time. Every step below is one call that holds the interpreter lock (bytes.replace, numpy's
# accumulations): on 1 MiB each holds it about a millisecond, so the event loop is never held behind a whole body.
SCAN_CHUNK = 1 << 20
_BACKSLASH = ord("\\")


@dataclass(frozen=True)
class Structure:
    containers: int  # arrays and objects
    depth: int  # the deepest nesting of them


def structure(body: bytes) -> Structure:
    """Arrays and objects in a JSON text and how deep they nest, counting only brackets outside strings. A guard, not
    a parser: garbage gives some answer, and json.loads refuses it afterwards. Scanned SCAN_CHUNK bytes at a time, the
    string state and nesting level carried over; a chunk never ends on a backslash, so no escape is cut."""
    containers = depth = level = 0
    in_string = False
    start = 0
    while start < len(body):
        end = min(len(body), start + SCAN_CHUNK)
        while end < len(body) and body[end - 1] == _BACKSLASH:
            end += 1
        # Escaped backslashes, then escaped quotes, go first: every quote left opens or closes a string.
        marks = body[start:end].replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
        start = end
        codes = np.frombuffer(marks, dtype=np.uint8)
        if not len(codes):
            continue
        quotes = codes == ord('"')
        # Inside a string from its opening quote on (the closing quote too): a running XOR, which, unlike a cumsum
        # into another dtype, numpy runs without the interpreter lock. No step below casts inside a loop either.
        inside = np.logical_xor.accumulate(quotes) ^ in_string
        outside = ~(quotes | inside)
        opens = outside & ((codes == ord("[")) | (codes == ord("{")))
        closes = outside & ((codes == ord("]")) | (codes == ord("}")))
        levels = np.cumsum(opens.view(np.int8).astype(np.int32) - closes.view(np.int8), dtype=np.int32)
        containers += int(np.count_nonzero(opens))
        depth = max(depth, level + int(levels.max()))
        level += int(levels[-1])
        in_string = bool(inside[-1])
    return Structure(containers, depth)


def parse(body: bytes, model: type[BaseModel] | None, max_containers: int) -> Any:
    """Body bytes → the validated model (or plain JSON without one); a worker thread runs this."""
    # Brackets in strings count here too, so a body under both limits by this count is under them exactly; json.loads'
    # own nesting limit is the interpreter's recursion limit, which libraries raise: this one is the server's.
    if body.count(b"[") + body.count(b"{") > min(max_containers, MAX_DEPTH):
        found = structure(body)
        if found.containers > max_containers:
            raise BadBody(f"body: {found.containers} JSON arrays and objects, over this server's limit of "
                             f"{max_containers} (4 per item of --max-items-per-request, plus 1024)")
        if found.depth > MAX_DEPTH:
            raise BadBody(f"body: JSON nested {found.depth} deep, over this server's limit of {MAX_DEPTH}")
    text = body.decode("utf-8", "surrogateescape")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadBody(f"body: not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except ValueError:  # int() of a decimal string longer than Python's limit
        raise BadBody(f"body: an integer has more than {sys.get_int_max_str_digits()} digits") from None
    if model is None or not isinstance(parsed, dict):  # FastAPI's own validation says what else it should be
        return parsed
    try:
        return model.model_validate(parsed)
    except ValidationError as error:  # as FastAPI would report it, locations under "body"; an HTTPException, which
        # FastAPI lets through while it reads a body (anything else there becomes its own generic 400)
        raise BadBody(validation_message([{**detail, "loc": ("body", *detail["loc"])}
                                             for detail in error.errors(include_url=False)])) from None


class JSONBodyRequest(Request):
    model: type[BaseModel] | None = None
    max_containers = 0
    gate: ParseGate | None = None

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            work = functools.partial(parse, body, self.model, self.max_containers)
            gate = self.gate if len(body) >= LARGE_BODY_BYTES else None  # large ones one at a time (parse_gate.py)
            self._json = await (gate.run(work) if gate is not None else asyncio.to_thread(work))
        return self._json


def _check_encoding(request: Request) -> None:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedMediaType(f"content-encoding: {encoding} is not decoded by this server; send the body "
                                   "uncompressed")
    header = email.message.Message()
    header["content-type"] = request.headers.get("content-type", "")
    charset = header.get_param("charset")
    if isinstance(charset, str) and charset.lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(f"content-type: charset={charset} is not supported; send UTF-8 JSON")


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media in JSON_TYPES or media.endswith("+json")


class JSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        body_field = self.body_field
        model = body_field.field_info.annotation if body_field is not None else None

        async def strict_handler(request: Request) -> Response:
            request = JSONBodyRequest(request.scope, request.receive)
            if body_field is not None:
                _check_encoding(request)
                request.model = model if isinstance(model, type) and issubclass(model, BaseModel) else None
                request.max_containers = request.app.state.max_json_containers
                request.gate = request.app.state.parse_gate
                if not _is_json(request.headers.get("content-type")) and await request.body():
                    raise BadBody(f"body: send JSON with content-type: application/json (got content-type: "
                                     f"{request.headers.get('content-type', 'none')})")
            return await handler(request)

        return strict_handler


T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # more body or an empty message: the body was complete already, keep listening


async def cancel_on_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled (server shutting down)
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    if watcher.exception() is not None:  # the channel failed, not the client: carry on without a watch
        log.debug("disconnect watch ended: %r", watcher.exception())
        return await task
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected("the client closed the connection; its queued work was dropped")
