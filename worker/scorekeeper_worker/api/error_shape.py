"""The error shape on the wire: any exception → `ErrorResponse` and headers, and the OpenAPI entries for it.

`error_for` turns any exception into the response: `ApiError`s as declared, FastAPI's validation errors as 400,
Starlette's own 404/405 with the same shape, anything else as a 500.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from scorekeeper_worker.contract.errors import TYPES, ApiError, BadRequest, ClientDisconnected, ErrorResponse

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
    if isinstance(error.__cause__, ClientDisconnect):  # FastAPI's 400 for a body cut off (api/http_protocol.py)
        error = ClientDisconnected("the connection closed before the request body was complete")
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
    `<...>` in contract/schemas.py) are not part of the path."""
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
