"""Request bodies parsed strictly, so that no body, however malformed, reaches a 500 or FastAPI's own error shape.

FastAPI's route handler parses JSON with `Request.json()`; `JSONRoute` hands it a request whose `json()`:
- decodes UTF-8 with `surrogateescape`, so invalid bytes survive as lone surrogates and the request model's text
  check names the field that holds them (instead of one "body is not UTF-8" for the whole request);
- turns every parse failure (syntax, nesting deeper than the interpreter's recursion limit, integers of more than
  4,300 digits) into a 400 that says what is wrong.
A body sent without a JSON content type is a 400 saying which content type to send.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from scorekeeper_worker.contract.errors import BadRequest

JSON_TYPES = ("application/json",)


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            text = (await self.body()).decode("utf-8", "surrogateescape")
            try:
                self._json = json.loads(text)
            except json.JSONDecodeError as error:
                raise BadRequest(f"body: not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
                                 ) from None
            except RecursionError:
                raise BadRequest("body: JSON nested too deeply") from None
            except ValueError:  # int() of a decimal string longer than Python's limit
                raise BadRequest(f"body: an integer has more than {sys.get_int_max_str_digits()} digits") from None
        return self._json


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media in JSON_TYPES or media.endswith("+json")


class JSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict_handler(request: Request) -> Response:
            request = JSONBodyRequest(request.scope, request.receive)
            if takes_body and not _is_json(request.headers.get("content-type")) and await request.body():
                raise BadRequest(f"body: send JSON with content-type: application/json (got content-type: "
                                 f"{request.headers.get('content-type', 'none')})")
            return await handler(request)

        return strict_handler
