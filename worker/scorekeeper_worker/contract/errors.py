"""Every non-2xx answer, in one shape: `{"object": "error", "message", "type", "code"}` (score-api.md, "Every error
has one shape").

An error the server means to send is an `ApiError` subclass that carries its status, type and headers; raising it
anywhere (a route, the service, a middleware, a pydantic validator for `BadRequest`) answers with it
(`api/error_shape.py` turns any exception into the response). `ApiError` extends Starlette's `HTTPException`
because FastAPI re-raises those untouched while it reads a body, so a limit hit mid-body keeps its 413.
"""

from __future__ import annotations

from typing import ClassVar, Literal

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


class UnsupportedMediaType(ApiError):
    """A body in an encoding or charset the server does not decode (it reads uncompressed UTF-8 JSON only)."""

    status, kind = 415, "UnsupportedMediaType"


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
TYPES = {cls.status: cls.kind for cls in (BadRequest, Unauthorized, PayloadTooLarge, UnsupportedMediaType, Overloaded,
                                          NotReady, RequestTimedOut, ClientDisconnected, ApiError)}
TYPES |= {404: "NotFoundError", 405: "MethodNotAllowed", 408: "RequestTimeout"}  # 408: the connection's limits
