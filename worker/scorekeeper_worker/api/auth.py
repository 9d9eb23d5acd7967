"""API keys (--api-key-file): /v1/* and /v2/* need `Authorization: Bearer <key>`; /health, /ready, /metrics and the
schema stay open (probes and scrapers carry no key).

The file holds one key per line (blank lines and lines starting with `#` are skipped). It is re-read when it changes,
so a rotated key needs no restart: a Kubernetes Secret volume updates by swapping a symlink (a new inode behind the
same path), an edited file changes size or modification time. One `stat` per request notices either. A file that
cannot be read any more keeps the last keys (a transient error must not lock everyone out); a file that is read and
holds no key lets nobody in.
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from scorekeeper_worker.contract.errors import Unauthorized

log = logging.getLogger(__name__)
PROTECTED_PREFIXES = ("/v1/", "/v2/")  # the API (/v2/rerank: Cohere's path); probes, metrics and docs stay open


def is_protected(path: str) -> bool:
    return (path + "/").startswith(PROTECTED_PREFIXES)


class KeyFileError(ValueError):
    """The key file cannot serve at start-up (missing, unreadable, or no key in it)."""


def read_keys(path: Path) -> tuple[bytes, ...]:
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return tuple(line.encode("utf-8") for line in lines if line and not line.startswith("#"))


def _stamp(path: Path) -> tuple[int, ...] | None:
    try:
        stat = os.stat(path)  # follows symlinks: the Secret's current version
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


class ApiKeys:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._keys = read_keys(path)
        except (OSError, UnicodeDecodeError) as error:
            raise KeyFileError(f"--api-key-file {path}: cannot read it ({error})") from None
        if not self._keys:
            raise KeyFileError(f"--api-key-file {path}: no key in it (one key per line)")
        self._stamp = _stamp(path)

    def _current(self) -> tuple[bytes, ...]:
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self._stamp:
            try:
                self._keys = read_keys(self.path)
            except (OSError, UnicodeDecodeError) as error:
                log.warning("--api-key-file %s: cannot re-read it (%s); keeping the previous keys", self.path, error)
            else:
                log.info("--api-key-file %s changed: %d key(s)", self.path, len(self._keys))
                if not self._keys:
                    log.warning("--api-key-file %s holds no key: every /v1 request is refused", self.path)
            self._stamp = stamp
        return self._keys

    def accepts(self, candidate: bytes) -> bool:
        """Constant-time against every key (no early exit that would tell which key came close)."""
        accepted = False
        for key in self._current():
            accepted |= hmac.compare_digest(candidate, key)
        return accepted


def _bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


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
