"""--metrics-port: /metrics alone on its own port (prometheus-client's WSGI app in a thread), so that a scrape never
needs an API key and the port a ServiceMonitor or NetworkPolicy opens reaches nothing else.

Every other path answers 404 (and /metrics anything but GET/HEAD 405) in the API's error shape. The thread serves
until the process exits, so metrics stay visible while the worker drains.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from scorekeeper_worker.contract.errors import TYPES, ErrorResponse

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: not worth a log line
        pass


def _error(start_response: StartResponse, status: int, reason: str, message: str,
           headers: list[tuple[str, str]]) -> Iterable[bytes]:
    body = ErrorResponse(message=message, type=TYPES[status], code=status).model_dump_json().encode()
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(body))), *headers])
    return [body]


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        metrics = make_wsgi_app(registry)

        def only_metrics(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
            if path != "/metrics":
                return _error(start_response, 404, "Not Found", f"no route {path}: this port serves /metrics only",
                              [])
            if method not in ("GET", "HEAD"):
                return _error(start_response, 405, "Method Not Allowed",
                              f"method {method} is not allowed on /metrics", [("Allow", "GET, HEAD")])
            result: Iterable[bytes] = metrics(environ, start_response)
            return result

        class Server(ThreadingWSGIServer):  # IPv4 or IPv6, as the host (--host) asks
            address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        self.httpd = make_server(host, port, only_metrics, Server, handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="scorekeeper-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
