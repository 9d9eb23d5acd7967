"""The worker's listening sockets, bound before it loads anything or says it is listening.

uvicorn binds its own sockets once serving has started: a taken API port ended the worker with the status of a failed
model load, and a taken --metrics-port was only logged while the worker became ready without /metrics (Prometheus
then scraped whatever process held the port). Binding here first makes either one line naming the flag and the
address (PortUnavailable), and uvicorn serves on the sockets bound here.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.base.errors import PortUnavailable

# Listening at once closes the window in which another process could bind the same port (SO_REUSEADDR lets two
# sockets bind one address until one of them listens); uvicorn's own listen() then sets its backlog.
BACKLOG = 128
_WHY = {
    errno.EADDRINUSE: "already in use by another process",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "no network interface of this machine has that address",
}


def _shown(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int, flag: str) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to, as asyncio would bind them; PortUnavailable naming
    `flag` (the setting that chose the port) otherwise."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise PortUnavailable(f"{flag} {port}: cannot listen on host {host!r}: {error.strerror}") from None
    sockets: list[socket.socket] = []
    for family, kind, protocol, _, address in dict.fromkeys(addresses):  # getaddrinfo may repeat an address
        sock = socket.socket(family, kind, protocol)
        sockets.append(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to take
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # "::" must not also claim IPv4
            sock.bind(address)
            sock.listen(BACKLOG)
        except OSError as error:
            for bound in sockets:
                bound.close()
            why = _WHY.get(error.errno or 0, error.strerror or str(error))
            raise PortUnavailable(f"{flag} {port}: cannot listen on {_shown(address)}: {why}") from None
    return sockets


@dataclass
class Listeners:
    """The API port's sockets and, with --metrics-port, the metrics port's."""

    api: list[socket.socket]
    metrics: list[socket.socket] | None

    @staticmethod
    def bind(config: WorkerConfig) -> Listeners:
        api = listen(config.host, config.port, "--port")
        try:
            metrics = None if config.metrics_port is None else listen(config.host, config.metrics_port,
                                                                      "--metrics-port")
        except PortUnavailable:
            for sock in api:
                sock.close()
            raise
        return Listeners(api, metrics)
