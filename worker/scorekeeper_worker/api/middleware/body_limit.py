"""--max-request-bytes, enforced as the body arrives (pure ASGI, so nothing is buffered to measure it).

A declared `Content-Length` over the limit is refused before any byte is read. Otherwise the bytes are counted as the
app receives them, chunked or not, and the read that crosses the limit raises `PayloadTooLarge` (413): FastAPI lets
it through its body parsing, and uvicorn discards the rest of the upload without keeping it. Every other message
(`http.disconnect` included) passes through unchanged, so the app's view of `receive` is the client's.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scorekeeper_worker.api.error_shape import PayloadTooLarge


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


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
