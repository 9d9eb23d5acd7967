"""API keys (--api-key-file): /v1/* and /v2/* need `Authorization: Bearer <key>`; /health, /ready, /metrics and the
schema stay open (probes and scrapers carry no key).

The file holds one key per line (blank lines and lines starting with `#` are skipped). It is re-read when it changes,
so a rotated key needs no restart: a Kubernetes Secret volume updates by swapping a symlink (a new inode behind the
same path), an edited file changes size or modification time. One `stat` per request notices either.

A file edited in place is truncated and then written, so a read can find it empty, or changing while it is read.
Neither is taken as the new keys: an empty file (0 bytes) and a read during which the file changed keep the last
good keys, and the next request reads it again. A file that cannot be read keeps them too (a transient error must
not lock everyone out). A file that is read whole and holds no key (only comments) lets nobody in.
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from scorekeeper_worker.api.error_shape import Unauthorized
from scorekeeper_worker.api.middleware.per_request import request_header

log = logging.getLogger(__name__)
PROTECTED_PREFIXES = ("/v1/", "/v2/")  # the API (/v2/rerank: Cohere's path); probes, metrics and docs stay open


def is_protected(path: str) -> bool:
    return (path + "/").startswith(PROTECTED_PREFIXES)


class KeyFileError(ValueError):
    """The key file cannot serve at start-up (missing, unreadable, or no key in it)."""


def read_file(path: Path) -> bytes:
    return path.read_bytes()


def parse_keys(data: bytes) -> tuple[bytes, ...]:
    lines = (line.strip() for line in data.decode("utf-8").splitlines())
    return tuple(line.encode("utf-8") for line in lines if line and not line.startswith("#"))


def _stamp(path: Path) -> tuple[int, ...] | None:
    try:
        stat = os.stat(path)  # follows symlinks: the Secret's current version
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def read_whole(path: Path) -> tuple[tuple[bytes, ...], tuple[int, ...] | None] | None:
    """The keys and the stamp they were read at; None for a read that may be partial (the file changed while it
    was read, or it is empty: truncated by a writer that has not written yet)."""
    before = _stamp(path)
    data = read_file(path)
    after = _stamp(path)
    if before != after or not data or (after is not None and len(data) != after[2]):
        return None
    return parse_keys(data), after


class ApiKeys:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._keys, self._stamp = parse_keys(read_file(path)), _stamp(path)
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"--api-key-file {path}: cannot read it ({error})") from None
        if not self._keys:
            raise KeyFileError(f"--api-key-file {path}: no key in it (one key per line)")
        self._skipped: tuple[int, ...] | None = None  # the stamp of the last read not taken (logged once)

    def _current(self) -> tuple[bytes, ...]:
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self._stamp:
            try:
                read = read_whole(self.path)
            except (OSError, UnicodeDecodeError) as error:
                log.warning("--api-key-file %s: cannot re-read it (%s); keeping the previous keys", self.path, error)
                self._stamp = stamp
                return self._keys
            if read is None:  # being written: keep the last good keys, read it again on the next request
                if stamp != self._skipped:
                    log.info("--api-key-file %s is empty or changing; keeping the previous keys", self.path)
                self._skipped = stamp
                return self._keys
            self._keys, self._stamp = read
            log.info("--api-key-file %s changed: %d key(s)", self.path, len(self._keys))
            if not self._keys:
                log.warning("--api-key-file %s holds no key: every /v1 request is refused", self.path)
        return self._keys

    def accepts(self, candidate: bytes) -> bool:
        """Constant-time against every key (no early exit that would tell which key came close)."""
        accepted = False
        for key in self._current():
            accepted |= hmac.compare_digest(candidate, key)
        return accepted


def _bearer_token(scope: Scope) -> bytes | None:
    value = request_header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


class ApiKeyAuth:
    """Pure ASGI, ahead of the body limit and body parsing: a client without a key learns nothing from its body."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_protected(scope["path"]):
            token = _bearer_token(scope)
            if not token:
                raise Unauthorized("missing API key: send the header Authorization: Bearer <key>")
            if not self.keys.accepts(token):
                raise Unauthorized("invalid API key: send the header Authorization: Bearer <key> with a current key")
        await self.app(scope, receive, send)
