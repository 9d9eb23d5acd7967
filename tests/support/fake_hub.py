"""A Hugging Face Hub on loopback: what the operator's revision resolution and the hf:// init container talk to.

It serves the public endpoints they use, with the Hub's answers: `GET /api/models/<org>/<name>[/revision/<rev>]`
(`sha`; `siblings` with sizes when `?blobs=true`), and `HEAD`/`GET /<org>/<name>/resolve/<rev>/<path>` (the file,
with `X-Repo-Commit`, `ETag` and `Content-Length`). Repositories live in memory: commits hold files, refs (branches
and tags) point at commits, and moving a branch is one call. Private repositories want `Authorization: Bearer
<token>` (401 otherwise, as the Hub does); `fail(status, times)` makes the next requests fail. Every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    private: bool = False


class FakeHub:
    def __init__(self, token: str = "hf_operator_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self._failures: list[int] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- repositories ----------------------------------------------------------------------------------------------
    def commit(self, repo: str, files: dict[str, bytes], ref: str = "main", private: bool = False) -> str:
        """A new commit with exactly these files, and `ref` moved to it; returns the commit sha."""
        entry = self.repos.setdefault(repo, Repo(private=private))
        sha = hashlib.sha1(json.dumps([repo, ref, len(entry.commits), sorted(files)]).encode()).hexdigest()
        entry.commits[sha] = dict(files)
        entry.refs[ref] = sha
        return sha

    def fail(self, status: int, times: int = 1) -> None:
        self._failures += [status] * times

    def calls(self, method: str, fragment: str) -> int:
        return sum(1 for m, p in self.requests if m == method and fragment in p)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @contextmanager
    def running(self) -> Iterator[FakeHub]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _resolve(self, repo: Repo, revision: str) -> str | None:
        return revision if revision in repo.commits else repo.refs.get(revision)

    def _answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        with self._lock:
            self.requests.append((request.command, request.path))
            failure = self._failures.pop(0) if self._failures else None
        if failure is not None:
            return self._send(request, failure, b'{"error": "injected"}', body=body)
        url = urlsplit(request.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        api = parts[:2] == ["api", "models"]
        name = "/".join(parts[2:4] if api else parts[:2])
        repo = self.repos.get(name)
        authorized = request.headers.get("Authorization") == f"Bearer {self.token}"
        if repo is None or (repo.private and not authorized):
            return self._send(request, 401, b'{"error": "Repository Not Found"}', body=body)
        if api:
            revision = parts[5] if len(parts) == 6 and parts[4] == "revision" else "main"
            sha = self._resolve(repo, revision)
            if sha is None:
                return self._send(request, 404, b'{"error": "Revision Not Found"}', body=body)
            blobs = parse_qs(url.query).get("blobs", ["false"])[0].lower() == "true"
            siblings = [{"rfilename": path, **({"size": len(data)} if blobs else {})}
                        for path, data in sorted(repo.commits[sha].items())]
            payload = json.dumps({"id": name, "sha": sha, "siblings": siblings}).encode()
            return self._send(request, 200, payload, body=body)
        if len(parts) < 5 or parts[2] != "resolve":
            return self._send(request, 404, b"{}", body=body)
        sha = self._resolve(repo, parts[3])
        path = "/".join(parts[4:])
        if sha is None or path not in repo.commits[sha]:
            return self._send(request, 404, b'{"error": "Entry Not Found"}', body=body)
        data = repo.commits[sha][path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        return self._send(request, 200, data, body=body, headers=headers, content_type="application/octet-stream")

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, payload: bytes, *, body: bool,
              headers: dict[str, str] | None = None, content_type: str = "application/json") -> None:
        request.send_response(status)
        for key, value in {"Content-Type": content_type, "Content-Length": str(len(payload)),
                           **(headers or {})}.items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(payload)
