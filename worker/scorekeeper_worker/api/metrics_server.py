"""--metrics-port: /metrics alone on its own port, so that a scrape never needs an API key and the port a
ServiceMonitor or NetworkPolicy opens reaches nothing else.

A uvicorn server with the same hardened connections as the API port (api/http_protocol.py: timeouts, a connection
cap, errors in the error shape) on an event loop of its own in a thread: no thread per connection, and scrapes keep
being answered while the API port drains or its loop is busy. Every other path answers 404 (and /metrics anything
but GET/HEAD 405) in the API's error shape. Serves on sockets bound before start-up (api/listeners.py: a taken port
stops the worker there), until the worker's lifespan ends, after the drain.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from scorekeeper_worker.api.error_shape import TYPES
from scorekeeper_worker.api.http_protocol import quiet_accept_errors
from scorekeeper_worker.api.wire.errors import ErrorResponse


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(message=message, type=TYPES[status], code=status).model_dump(),
                        status_code=status, headers=headers)


def _unlogged(protocol: type[H11Protocol]) -> type[H11Protocol]:
    """The protocol without access lines: scrapes come every few seconds. (uvicorn.Config(access_log=False) would
    instead remove the handlers of the process-wide access logger, and with them the API port's access lines.)"""

    class Unlogged(protocol):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.access_log = False

    return Unlogged


class _Server(uvicorn.Server):
    async def serve(self, sockets: Any = None) -> None:
        quiet_accept_errors(asyncio.get_running_loop())  # this loop's own accept errors, as on the API port
        await super().serve(sockets)


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, sockets: list[socket.socket], options: dict[str, Any]) -> None:
        metrics = make_asgi_app(registry)

        async def only_metrics(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":  # lifespan is off; nothing else reaches an HTTP server
                return
            path, method = scope["path"], scope["method"]
            if path != "/metrics":
                response = _error(404, f"no route {path}: this port serves /metrics only")
            elif method not in ("GET", "HEAD"):
                response = _error(405, f"method {method} is not allowed on /metrics", {"Allow": "GET, HEAD"})
            else:
                try:
                    await metrics(scope, receive, send)
                    return
                except UnicodeDecodeError:  # prometheus-client decodes Accept headers as UTF-8
                    response = _error(400, "Accept and Accept-Encoding headers must be UTF-8")
            await response(scope, receive, send)

        config = uvicorn.Config(only_metrics, lifespan="off", log_config=None,
                                **{**options, "http": _unlogged(options["http"])})
        self.server = _Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, name="scorekeeper-metrics",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
