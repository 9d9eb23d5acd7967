"""--api-key-file: /v1/* need `Authorization: Bearer <key>`, probes stay open, rotated keys apply without a restart
(an edited file, or a Kubernetes Secret volume's symlink swap); --metrics-port serves /metrics there, alone."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from serving import RunningServer, free_port

FIRST, SECOND, ROTATED = "sk-first-0123456789", "sk-second-abcdefghij", "sk-rotated-after-the-restartless-swap"
SCORE = {"query": "q", "items": ["a", "b"]}


class SecretVolume:
    """The layout the kubelet gives a Secret volume: `keys -> ..data/keys`, `..data -> ..<timestamp>/`; an update
    writes a new timestamped directory and swaps `..data` atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        (root / "keys").symlink_to("..data/keys")

    @property
    def path(self) -> Path:
        return self.root / "keys"

    def publish(self, text: str) -> None:
        self.generation += 1
        version = self.root / f"..2025_01_01_00_00_{self.generation:02d}"
        version.mkdir()
        (version / "keys").write_text(text)
        staged = self.root / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, self.root / "..data")


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> SecretVolume:
    secret = SecretVolume(tmp_path_factory.mktemp("secret"))
    secret.publish(f"# scorekeeper keys\n{FIRST}\n\n  {SECOND}  \n")
    return secret


@pytest.fixture(scope="module")
def server(tiny_model: Callable[[str], Path], volume: SecretVolume) -> Iterator[RunningServer]:
    running = RunningServer(model=tiny_model("qwen3-cls3"), api_key_file=volume.path, metrics_port=free_port())
    yield running
    running.stop()


def post(server: RunningServer, path: str, key: str | None, body: object = SCORE,
         scheme: str = "Bearer") -> httpx.Response:
    headers = {} if key is None else {"authorization": f"{scheme} {key}".rstrip()}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("key", [None, "", "sk-wrong", FIRST + "x", FIRST[:-1]], ids=repr)
def test_missing_or_wrong_key_is_401_with_www_authenticate(server: RunningServer, key: str | None) -> None:
    response = post(server, "/v1/score", key)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()
    assert error == {"object": "error", "message": error["message"], "type": "AuthenticationError", "code": 401}
    assert "Authorization: Bearer" in error["message"]


def test_every_v1_route_needs_the_key_before_reading_the_body(server: RunningServer) -> None:
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
    for path in ("/v1/rerank", "/v2/rerank"):  # /v2/rerank: Cohere's path
        assert post(server, path, None, {"query": "q", "documents": ["a"]}).status_code == 401
    assert post(server, "/v1/embeddings", None, {"input": "a"}).status_code == 401
    assert post(server, "/v1/no-such-route", None).status_code == 401  # no route discovery without a key
    assert post(server, "/v2/no-such-route", None).status_code == 401
    # An unauthenticated client gets 401, not a schema error: its body is never parsed.
    assert post(server, "/v1/score", None, {"items": 42}).status_code == 401


def test_each_listed_key_is_accepted(server: RunningServer) -> None:
    for key in (FIRST, SECOND):
        assert post(server, "/v1/score", key).status_code == 200
    assert post(server, "/v1/score", FIRST, scheme="bearer").status_code == 200  # the scheme is case-insensitive
    assert httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {SECOND}"},
                     timeout=10).json()["data"][0]["kind"] == "classifier"
    assert post(server, "/v1/rerank", FIRST, {"query": "q", "documents": ["a"]}).status_code == 200
    assert post(server, "/v2/rerank", FIRST, {"query": "q", "documents": ["a"]}).status_code == 200


def test_probes_and_the_schema_stay_open(server: RunningServer) -> None:
    for path in ("/health", "/ready", "/openapi.json"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path in ("/v1/score", "/v1/rerank", "/v2/rerank"):  # /v1/embeddings: only for an embedding model
        assert spec["paths"][path]["post"]["security"] == [{"bearer": []}], path
        assert "401" in spec["paths"][path]["post"]["responses"], path
    assert "security" not in spec["paths"]["/ready"]["get"]


def test_metrics_live_on_the_metrics_port_alone(server: RunningServer) -> None:
    metrics_url = f"http://127.0.0.1:{server.config.metrics_port}"
    scraped = httpx.get(metrics_url + "/metrics", timeout=10)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    assert "scorekeeper_requests_total" in scraped.text and "scorekeeper_ready 1.0" in scraped.text
    for path in ("/", "/v1/score", "/ready", "/metrics/extra"):
        response = httpx.get(metrics_url + path, timeout=10)
        assert response.status_code == 404 and response.json()["type"] == "NotFoundError", path
    assert httpx.post(metrics_url + "/v1/score", json=SCORE, timeout=10).status_code in (404, 405)
    # ... and no longer on the scoring port, where it would sit beside the API.
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 404
    assert "/metrics" not in httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]


def test_rotated_keys_apply_without_a_restart(server: RunningServer, volume: SecretVolume) -> None:
    assert post(server, "/v1/score", FIRST).status_code == 200
    volume.publish(ROTATED + "\n")  # a Secret update: new directory, atomic ..data swap
    assert post(server, "/v1/score", FIRST).status_code == 401
    assert post(server, "/v1/score", ROTATED).status_code == 200
    target = volume.path.resolve()
    # Edits in place (a plain file on disk). Each rewrite changes the size: file times can be as coarse as a clock
    # tick, and the worker must notice the change on the very next request.
    target.write_text(f"{ROTATED}\n{FIRST}\n")
    assert post(server, "/v1/score", FIRST).status_code == 200
    target.write_text("# no key\n")  # every key revoked: nobody gets in
    assert post(server, "/v1/score", FIRST).status_code == 401
    assert post(server, "/v1/score", ROTATED).status_code == 401
    target.write_text(f"{FIRST}\n{SECOND}\n")  # back to the module's keys for the other tests
    assert post(server, "/v1/score", SECOND).status_code == 200


def test_a_key_file_rewritten_in_place_never_locks_a_valid_key_out(server: RunningServer, volume: SecretVolume) -> None:
    """An editor or `echo > file` truncates the file, then writes it: a request between the two finds it empty. The
    worker keeps its last good keys then: not one 401 for a valid key."""
    target = volume.path.resolve()
    content = f"{FIRST}\n{SECOND}\n"
    for i in range(20):  # each state a reader can find, in turn: empty, then written (sizes vary)
        with target.open("r+") as edit:
            edit.truncate(0)
            edit.flush()
            assert post(server, "/v1/score", SECOND).status_code == 200, "empty file"
            edit.write(content + "#" * i)
        assert post(server, "/v1/score", SECOND).status_code == 200
    # And concurrently: rewrites in place while a client sends requests with a valid key.
    stop, statuses = threading.Event(), []

    def hammer() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                statuses.append(client.post(server.url + "/v1/score", json=SCORE,
                                            headers={"authorization": f"Bearer {SECOND}"}).status_code)

    client = threading.Thread(target=hammer)
    client.start()
    try:
        rewrites = 0  # at least 300, and on until 20 requests overlapped them (a loaded machine starts clients late)
        while rewrites < 300 or (len(statuses) < 20 and client.is_alive()):
            target.write_text(content + "#" * (rewrites % 7) + "\n")  # truncate, then write: in place, sizes vary
            rewrites += 1
    finally:
        stop.set()
        client.join(60)
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


def test_a_key_file_read_while_it_changes_keeps_the_last_good_keys(tmp_path: Path) -> None:
    """A file that changes while it is read (a writer between two of its writes) gives a partial read: it is not
    used, and the next request reads the file again."""
    from scorekeeper_worker.api.middleware import auth

    path = tmp_path / "keys"
    path.write_text(f"{FIRST}\n")
    keys = auth.ApiKeys(path)
    path.write_text(f"{FIRST}\n{SECOND}\n")
    real_read = auth.read_file

    def racing_read(file: Path) -> bytes:
        data = real_read(file)
        with file.open("a") as more:  # the writer goes on while the reader holds a part
            more.write(f"{ROTATED}\n")
        return data[:5]

    auth.read_file = racing_read
    try:
        assert keys.accepts(FIRST.encode()) and not keys.accepts(ROTATED.encode())  # the last good keys
    finally:
        auth.read_file = real_read
    assert keys.accepts(ROTATED.encode()) and keys.accepts(SECOND.encode())  # read again, whole
