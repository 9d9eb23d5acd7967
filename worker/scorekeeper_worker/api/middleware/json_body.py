"""Request bodies parsed strictly and off the event loop, so that no body, however malformed or large, reaches a 500,
FastAPI's own error shape, or a stalled loop.

FastAPI's route handler parses JSON with `Request.json()` and then validates it; `JSONRoute` hands it a request whose
`json()` does both in a worker thread and returns the validated model (which FastAPI's own validation then passes
through unchanged). A thread is enough only because no step holds the interpreter for long: `json.loads` and
pydantic hold it for the whole of one call, and a body of millions of small arrays costs seconds there (mostly the
garbage collector, which walks every container), so such a body is refused before it is parsed, from a scan of its
bytes (`structure`: a few fast passes of at most tens of milliseconds for 8 MB). Then:
- UTF-8 is decoded with `surrogateescape`, so invalid bytes survive as lone surrogates and the request model's text
  check names the field that holds them (instead of one "body is not UTF-8" for the whole request);
- nesting deeper than MAX_DEPTH is refused from the same scan;
- every parse failure (syntax, integers of more than 4,300 digits) is a 400 that says what is wrong.
A body sent without a JSON content type is a 400 saying which content type to send; a compressed body, or one in
another charset than UTF-8, is a 415.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.message import Message
from typing import Any

import numpy as np
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from scorekeeper_worker.api.error_shape import BadBody, UnsupportedMediaType, validation_message

JSON_TYPES = ("application/json",)
MAX_DEPTH = 32  # arrays and objects inside each other; the deepest body of this API nests 4
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')  # every byte but a quote and the brackets


@dataclass(frozen=True)
class Structure:
    containers: int  # arrays and objects
    depth: int  # the deepest nesting of them


def structure(body: bytes) -> Structure:
    """Arrays and objects in a JSON text and how deep they nest, counting only brackets outside strings. A guard, not
    a parser: garbage gives some answer, and json.loads refuses it afterwards."""
    # Escaped backslashes, then escaped quotes, go first: every quote left opens or closes a string.
    marks = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    codes = np.frombuffer(marks, dtype=np.uint8)
    quotes = codes == ord('"')
    outside = ~quotes & ((np.cumsum(quotes, dtype=np.uint8) & 1) == 0)  # quote parity (uint8 wraps: parity survives)
    opens = outside & ((codes == ord("[")) | (codes == ord("{")))
    closes = outside & ((codes == ord("]")) | (codes == ord("}")))
    steps = opens.astype(np.int32) - closes
    return Structure(int(np.count_nonzero(opens)), int(np.cumsum(steps).max(initial=0)))


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

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await asyncio.to_thread(parse, await self.body(), self.model, self.max_containers)
        return self._json


def _check_encoding(request: Request) -> None:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedMediaType(f"content-encoding: {encoding} is not decoded by this server; send the body "
                                   "uncompressed")
    header = Message()
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
                if not _is_json(request.headers.get("content-type")) and await request.body():
                    raise BadBody(f"body: send JSON with content-type: application/json (got content-type: "
                                     f"{request.headers.get('content-type', 'none')})")
            return await handler(request)

        return strict_handler
