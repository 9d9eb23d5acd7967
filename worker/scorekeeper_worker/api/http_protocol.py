"""The HTTP/1.1 connection, hardened against slow and hostile clients (both ports, before any API key is checked).

uvicorn's h11 protocol, plus what it leaves out:
- a request head (request line and headers) must arrive within --http-header-timeout-seconds of the connection
  opening (or of its first byte on a kept-alive connection), and the body within --http-body-timeout-seconds of the
  head; otherwise the client gets 408 in the error shape and the connection is closed (a connection that sent
  nothing is closed without an answer). uvicorn alone times out only idle kept-alive connections;
- after an answer given before the body was read (401, 413), the rest of the upload may take DISCARD_SECONDS, then
  the connection is closed: uvicorn would read (and throw away) an endless upload;
- at most --max-connections open connections per port: one more closes the oldest connection still waiting for a
  request head (an idle or slow one), or, when every connection is busy with a request, is answered 503;
- what h11 cannot parse is answered 400 in the error shape instead of uvicorn's plain text.
Errors written here never reach the app, so they are written as raw bytes, with a new x-request-id.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from scorekeeper_worker.api.error_shape import TYPES
from scorekeeper_worker.api.wire.errors import ErrorResponse
from scorekeeper_worker.base.config import WorkerConfig

log = logging.getLogger(__name__)
DISCARD_SECONDS = 2.0  # after an early answer, the rest of an upload gets this long before the connection closes
LISTEN_BACKLOG = 128  # also the most connections asyncio accepts at once: the file descriptors kept in reserve cover it
FD_RESERVE = 256  # descriptors for everything but connections: model files, logs, pipes, one accept burst
REPORT_EVERY = 10.0  # seconds between two log lines about connections closed by the limits


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    max_connections: int


def error_bytes(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response in the error shape that closes the connection."""
    body = ErrorResponse(message=message, type=TYPES[status], code=status).model_dump_json().encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\nx-request-id: {uuid.uuid4().hex}\r\n\r\n")
    return head.encode("ascii") + body


class _Report:
    """Connections closed by the limits, counted per reason and logged at most every REPORT_EVERY seconds: a flood
    of slow connections must not become a flood of log lines."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last = 0.0

    def closed(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = time.monotonic()
        if now - self.last >= REPORT_EVERY:
            log.warning("connections closed by the HTTP limits since the last such line: %s",
                        ", ".join(f"{n} {why}" for why, n in sorted(self.counts.items())))
            self.counts, self.last = {}, now


class GuardedH11Protocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]
    waiting: ClassVar[dict[GuardedH11Protocol, None]]  # connections waiting for a request head, oldest first
    report: ClassVar[_Report]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._spoke = False
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_oldest_waiting():
            self._close("connections refused at --max-connections", 503,
                        f"too many open connections (--max-connections {self.limits.max_connections}); retry later")
            return
        self._enter("head")

    def data_received(self, data: bytes) -> None:
        self._spoke = True
        super().data_received(data)
        self._follow(idle=False)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow(idle=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(None)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:  # what h11 cannot parse
        self._close("malformed requests", 400, f"malformed HTTP request: {msg}")

    def _follow(self, idle: bool) -> None:
        """The phase the connection is in now, from h11's view of the client's side."""
        state = self.conn.their_state
        if self.transport.is_closing():
            self._enter(None)
        elif state is h11.IDLE:  # after a response: uvicorn's keep-alive timer; from the next request's first byte on
            self._enter("idle" if idle else "head")
        elif state is h11.SEND_BODY:
            self._enter("discard" if self.cycle is not None and self.cycle.response_complete else "body")
        else:  # the request is in: the app has it (--request-timeout-seconds bounds it there)
            self._enter(None)

    def _enter(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        self._phase = phase
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if phase in ("head", "idle"):
            self.waiting[self] = None
        else:
            self.waiting.pop(self, None)
        seconds = {"head": self.limits.header_timeout, "body": self.limits.body_timeout,
                   "discard": DISCARD_SECONDS}.get(phase or "")
        if seconds is not None:
            self._timer = self.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        phase, limits = self._phase, self.limits
        if phase == "head" and not self._spoke:  # a connection that never sent a byte: nothing to answer
            self._close("silent connections")
        elif phase == "head":
            self._close("request heads not received in time", 408, "request head (request line and headers) not "
                        f"received within {limits.header_timeout:g} s (--http-header-timeout-seconds)")
        elif phase == "body" and (self.cycle is None or not self.cycle.response_started):
            self._close("request bodies not received in time", 408, "request body not received within "
                        f"{limits.body_timeout:g} s of its head (--http-body-timeout-seconds)")
        else:  # a body still arriving after its answer
            self._close("uploads cut off after an early answer")

    def _evict_oldest_waiting(self) -> bool:
        oldest = next(iter(self.waiting), None)  # this connection is not waiting yet
        if oldest is None:
            return False
        oldest._close("idle or slow connections closed for new ones")
        return True

    def _close(self, reason: str, status: int | None = None, message: str = "") -> None:
        self._enter(None)
        self.report.closed(reason)
        if status is not None and not self.transport.is_closing():
            self.transport.write(error_bytes(status, message))
        if self.cycle is not None:  # the app, if it still runs, sees a disconnect and its answer goes nowhere
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class of its own per server (port): the connections waiting for a head are counted per port."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "waiting": {}, "report": _Report()})


def connection_budget(requested: int, ports: int) -> int:
    """Connections per port that fit the process's file descriptors: the soft limit is raised to the hard one
    first; beyond that --max-connections is lowered (logged), so that accepting never fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    allowed = max(8, (soft - FD_RESERVE) // ports)
    if requested > allowed:
        log.warning("--max-connections %d lowered to %d per port: the process may open %d files", requested, allowed,
                    soft)
    return min(requested, allowed)


def server_options(config: WorkerConfig) -> dict[str, Any]:
    """uvicorn.Config arguments for one port of this worker (the API, or the metrics port)."""
    ports = 1 if config.metrics_port is None else 2
    limits = ConnectionLimits(config.http_header_timeout_seconds, config.http_body_timeout_seconds,
                              connection_budget(config.max_connections, ports))
    return {"http": protocol_class(limits), "timeout_keep_alive": config.http_idle_timeout_seconds,
            "backlog": LISTEN_BACKLOG}


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio logs a traceback for every accept() that fails for lack of descriptors (and retries a second later):
    one warning line at most every REPORT_EVERY seconds instead."""
    default = loop.get_exception_handler()
    last = [0.0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
            if time.monotonic() - last[0] >= REPORT_EVERY:
                last[0] = time.monotonic()
                log.warning("cannot accept connections: %s (the process's file-descriptor limit)", error.strerror)
            return
        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
