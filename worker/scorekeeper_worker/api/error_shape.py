"""The edge of the error path: the worker's domain errors (`base/errors.py`) and the HTTP layer's own refusals get
their status, type and headers here, in one table, and every exception becomes one `ErrorResponse`.

`error_for` turns any exception into the response: domain errors by the table, the HTTP layer's own errors as
declared, FastAPI's validation errors as 400, Starlette's own 404/405 with the same shape, anything else as a 500.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from scorekeeper_worker.api.wire.errors import ErrorResponse
from scorekeeper_worker.base.errors import (
    Invalid,
    NonFiniteScore,
    NotReady,
    Overloaded,
    ScoringError,
    Timeout,
    TooLarge,
)

RETRY_AFTER = (("Retry-After", "1"),)


class HttpError(HTTPException):
    """A refusal of the HTTP layer itself (keys, media types, bodies, connections). An HTTPException because FastAPI
    re-raises those untouched while it reads a body, so a limit hit mid-body keeps its 413."""

    status: ClassVar[int] = 500
    kind: ClassVar[str] = "InternalServerError"
    headers_: ClassVar[tuple[tuple[str, str], ...]] = ()  # sent with every response of this class
    reason: ClassVar[str | None] = None  # as on ScoringError: the metrics' labels
    cancelled: ClassVar[str | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(self.status, message, dict(self.headers_) or None)

    @property
    def message(self) -> str:
        return str(self.detail)


class BadBody(HttpError):
    """A body that does not parse or validate, found while FastAPI reads it (a 400 naming the field)."""

    status, kind = 400, "BadRequestError"


class Unauthorized(HttpError):
    status, kind = 401, "AuthenticationError"
    headers_ = (("WWW-Authenticate", "Bearer"),)


class UnsupportedMediaType(HttpError):
    """A body in an encoding or charset the server does not decode (it reads uncompressed UTF-8 JSON only)."""

    status, kind = 415, "UnsupportedMediaType"


class PayloadTooLarge(HttpError):
    status, kind, reason = 413, "RequestTooLarge", "body_too_large"


class ParsersBusy(HttpError):
    """Too many large bodies are being parsed or wait for it (api/middleware/parse_gate.py): retry later."""

    status, kind, reason = 429, "TooManyRequests", "parse_queue_full"
    headers_ = RETRY_AFTER


class ClientDisconnected(HttpError):
    """The client closed the connection before its answer was ready; its queued work was dropped. Nobody reads
    this answer: its status (nginx's "client closed request") shows in the request metrics."""

    status, kind, cancelled = 499, "ClientClosedRequest", "disconnect"


# Domain error → (status, type, headers); a subclass takes its nearest listed base's entry.
STATUS: dict[type[ScoringError], tuple[int, str, tuple[tuple[str, str], ...]]] = {
    Invalid: (400, "BadRequestError", ()),
    TooLarge: (413, "RequestTooLarge", ()),
    Overloaded: (429, "TooManyRequests", RETRY_AFTER),
    NotReady: (503, "ServiceUnavailable", RETRY_AFTER),
    Timeout: (504, "GatewayTimeout", ()),
    NonFiniteScore: (500, "InternalServerError", ()),
    ScoringError: (500, "InternalServerError", ()),
}
# Types of the statuses Starlette and the connection layer raise by themselves, and of everything above.
TYPES = {status: kind for status, kind, _ in STATUS.values()}
TYPES |= {cls.status: cls.kind for cls in (Unauthorized, UnsupportedMediaType, PayloadTooLarge, ClientDisconnected)}
TYPES |= {404: "NotFoundError", 405: "MethodNotAllowed", 408: "RequestTimeout"}  # 408: the connection's limits


def status_of(error: ScoringError) -> tuple[int, str, tuple[tuple[str, str], ...]]:
    return next(STATUS[cls] for cls in type(error).__mro__ if cls in STATUS)


DESCRIPTIONS = {
    400: "Bad request: the message names the field at fault",
    401: "Missing or wrong API key (`Authorization: Bearer <key>`)",
    405: "Method not allowed on this route (see the Allow header)",
    413: "Request body over --max-request-bytes, or a request that would run more tokens than --max-request-tokens",
    429: "Queue full: retry after Retry-After seconds",
    500: "Internal error: the log holds the details under the response's x-request-id",
    503: "Model loading or worker draining: retry after Retry-After seconds",
    504: "Request ran past --request-timeout-seconds",
}
_HEADERS = {401: "WWW-Authenticate", 405: "Allow", 429: "Retry-After", 503: "Retry-After"}


def error_for(error: Exception, method: str, path: str, request_id: str) -> tuple[ErrorResponse, dict[str, str]]:
    """The one mapping from an exception to what the client sees: the body and its headers."""
    if isinstance(error, RequestValidationError):
        field, _, problem = validation_message(error.errors()).partition(": ")  # every message names its field first
        error = Invalid(field, problem) if problem else Invalid("body", field)
    if isinstance(error.__cause__, ClientDisconnect):  # FastAPI's 400 for a body cut off (api/http_protocol.py)
        error = ClientDisconnected("the connection closed before the request body was complete")
    if isinstance(error, ScoringError):
        status, kind, headers = status_of(error)
        return ErrorResponse(message=error.message, type=kind, code=status), dict(headers)
    if isinstance(error, HttpError):
        return ErrorResponse(message=error.message, type=error.kind, code=error.status), dict(error.headers or {})
    if isinstance(error, HTTPException):  # raised by Starlette's router
        status = error.status_code
        messages = {404: f"no route {path}", 405: f"method {method} is not allowed on {path}"}
        body = ErrorResponse(message=messages.get(status, str(error.detail)), type=TYPES.get(status, "HTTPError"),
                             code=status)
        return body, dict(error.headers or {})
    message = f"internal error ({type(error).__name__}); the server log has the details under request id {request_id}"
    return ErrorResponse(message=message, type=TYPES[500], code=500), {}


def _where(loc: Sequence[int | str]) -> str:
    """('body', 'items', 1) → 'items[1]'; ('body',) → 'body'; () (a rule across fields) → ''. Union tags (written
    `<...>` in api/wire/score.py) are not part of the path."""
    if not loc or list(loc) == ["body"]:
        return "body" if loc else ""
    where = ""
    for part in loc[1:] if loc[0] == "body" else loc:
        if isinstance(part, int):
            where += f"[{part}]"
        elif not part.startswith("<"):
            where += f".{part}" if where else part
    return where


def validation_message(errors: Sequence[Any]) -> str:
    parts = []
    for detail in errors:
        message = str(detail.get("msg", "")).removeprefix("Value error, ")
        where = _where(detail.get("loc", ()))
        if where == "body" and isinstance((detail.get("ctx") or {}).get("error"), Invalid):
            where = ""  # a rule across fields: the Invalid it raised names its own field
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(dict.fromkeys(parts))


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for a route: the error object, and the headers each status carries."""
    declared: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorResponse, "description": DESCRIPTIONS[status]}
        if status in _HEADERS:
            entry["headers"] = {_HEADERS[status]: {"schema": {"type": "string"}, "required": True}}
        declared[status] = entry
    return declared
