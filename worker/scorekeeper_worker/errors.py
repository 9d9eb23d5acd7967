"""Every non-2xx answer, in one shape: `{"object": "error", "message", "type", "code"}` (score-api.md, "Every error
has one shape").

An error the server means to send is an `ApiError` subclass that carries its status, type and headers; raising it
anywhere (a route, the service, a middleware, a pydantic validator for `BadRequest`) answers with it. `error_for`
turns any exception into the response: `ApiError`s as declared, FastAPI's validation errors as 400, Starlette's own
404/405 with the same shape, anything else as a 500. `ApiError` extends Starlette's `HTTPException` because FastAPI
re-raises those untouched while it reads a body, so a limit hit mid-body keeps its 413.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

RETRY_AFTER = (("Retry-After", "1"),)


class ErrorResponse(BaseModel):
    object: Literal["error"] = "error"
    message: str
    type: str
    code: int


class ApiError(HTTPException):
    status: ClassVar[int] = 500
    kind: ClassVar[str] = "InternalServerError"
    headers_: ClassVar[tuple[tuple[str, str], ...]] = ()  # sent with every response of this class
    # scorekeeper_rejected_requests_total{reason}: set on refusals that protect capacity.
    reason: ClassVar[str | None] = None
    # scorekeeper_cancelled_requests_total{reason}: set on requests whose queued work was dropped.
    cancelled: ClassVar[str | None] = None

    def __init__(self, message: str) -> None:
        super().__init__(self.status, message, dict(self.headers_) or None)

    @property
    def message(self) -> str:
        return str(self.detail)

    def __str__(self) -> str:  # pydantic reads str() of a ValueError raised in a validator
        return self.message


class BadRequest(ApiError, ValueError):
    """A client error; the message names the field. A ValueError too, so pydantic validators may raise it."""

    status, kind = 400, "BadRequestError"


class Unauthorized(ApiError):
    status, kind = 401, "AuthenticationError"
    headers_ = (("WWW-Authenticate", "Bearer"),)


class PayloadTooLarge(ApiError):
    status, kind, reason = 413, "RequestTooLarge", "body_too_large"


class RequestTooLarge(PayloadTooLarge):
    """The request would run more tokens through the model than --max-request-tokens (planned, before queueing)."""

    reason = "request_tokens"


class ResponseTooLarge(BadRequest):
    """The response could exceed --max-response-bytes: refused before any work."""

    reason = "response_bytes"


class Overloaded(ApiError):
    """The queue is full (or the worker is stopping); the client should retry later."""

    status, kind, reason = 429, "TooManyRequests", "queue_full"
    headers_ = RETRY_AFTER

    def __init__(self, message: str) -> None:
        super().__init__(f"server busy: {message}")


class NotReady(ApiError):
    """The model is loading or warming up, or the worker is draining."""

    status, kind = 503, "ServiceUnavailable"
    headers_ = RETRY_AFTER


class NonFiniteScore(ApiError):
    """The model's output overflowed: an internal error (500) with this message, never a 200 with NaN or inf."""


class RequestTimedOut(ApiError):
    """The request ran past its deadline (--request-timeout-seconds); its remaining work is dropped."""

    status, kind, cancelled = 504, "GatewayTimeout", "timeout"


class ClientDisconnected(ApiError):
    """The client closed the connection before its answer was ready; its queued work was dropped. Nobody reads
    this answer: its status (nginx's "client closed request") shows in the request metrics."""

    status, kind, cancelled = 499, "ClientClosedRequest", "disconnect"


# Types of the statuses Starlette raises by itself (unknown route, wrong method), and of everything above.
TYPES = {cls.status: cls.kind for cls in (BadRequest, Unauthorized, PayloadTooLarge, Overloaded, NotReady,
                                          RequestTimedOut, ClientDisconnected, ApiError)}
TYPES |= {404: "NotFoundError", 405: "MethodNotAllowed"}
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
        error = BadRequest(validation_message(error.errors()))
    if isinstance(error, ApiError):
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
    `<...>` in schemas.py) are not part of the path."""
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
