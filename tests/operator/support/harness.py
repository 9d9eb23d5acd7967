"""Run the real operator (kopf, in process) against the extended KMock emulator, and poke it like a cluster would.

The harness's own requests carry HARNESS_HEADER, so `emulator.calls` holds only what the operator asked for.
Deterministic waits: `Cluster.reconciled()` nudges the operator and waits for a reconcile pass that *started* after
every change so far was committed (the operator logs a PassReport per pass), so "the operator saw it and did
nothing" needs no sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import crd_tools
import kmock
import kopf
import yaml
from kmock._internal import parsing
from kmock_cluster import ClusterEmulator
from kmock_ext import HARNESS_HEADER
from kmock_semantics import canonical_resources, parse_path_with_namespaces
from kopf._core.reactor.inventory import ResourceMemories  # kopf.operator(memories=…) takes it; not re-exported
from scorekeeper_operator.reconcile import PassReport
from scorekeeper_operator.render.manifests import MANAGED_BY

T = TypeVar("T")
GROUP_VERSION = "scorekeeper.dev/v1alpha1"
HEADERS = {HARNESS_HEADER: "1"}
NAMESPACE = "ml"
NAMESPACES = (NAMESPACE, "elsewhere", "rbac")
# Fast backoff and Event polling; the resync stays long, so that no test passes thanks to it by accident.
FAST = {"SCOREKEEPER_RETRY_BASE_SECONDS": "0.2", "SCOREKEEPER_RETRY_MAX_SECONDS": "1",
        "SCOREKEEPER_POLL_SECONDS": "0.3", "SCOREKEEPER_RESYNC_SECONDS": "600"}


def path(plural: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    group_version = {"scoringmodels": f"apis/{GROUP_VERSION}", "deployments": "apis/apps/v1",
                     "poddisruptionbudgets": "apis/policy/v1", "horizontalpodautoscalers": "apis/autoscaling/v2",
                     "servicemonitors": "apis/monitoring.coreos.com/v1", "scaledobjects": "apis/keda.sh/v1alpha1",
                     "networkpolicies": "apis/networking.k8s.io/v1"}.get(plural, "api/v1")
    return "/" + "/".join(p for p in (group_version, "namespaces", namespace, plural, name, subresource) if p)


def scoring_model(name: str = "reranker", namespace: str = NAMESPACE, **spec: Any) -> dict[str, Any]:
    """A ScoringModel body; spec fields as keyword arguments (camelCase), the model URI defaulted."""
    return {"apiVersion": GROUP_VERSION, "kind": "ScoringModel", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"uri": "pvc://models/qwen3-reranker"}, **spec}}


class Cluster:
    def __init__(self, emulator: ClusterEmulator) -> None:
        self.emulator = emulator
        self.passes: list[PassReport] = []  # every reconcile pass of the running operator(s), in completion order
        self.memories: ResourceMemories | None = None  # what kopf keeps per watched object (the running one)
        self.memo: kopf.Memo | None = None  # the running operator's root memo (memo.reconciler)

    async def _send(self, method: str, url: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {**HEADERS, **({"Content-Type": content_type} if content_type else {})}
        response = await self.emulator.request(method, url, json=body, headers=headers)
        data = await response.json(content_type=None)
        if response.status >= 400:
            raise AssertionError(f"{method} {url} → {response.status}: {data.get('message')}")
        return data

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST it; the stored object (with uid and resourceVersion)."""
        result: dict[str, Any] = await self._send("POST", path(plural, namespace), body)
        return result

    async def patch(self, plural: str, namespace: str, name: str, body: dict[str, Any], *,
                    subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._send("PATCH", path(plural, namespace, name, subresource), body,
                                                  "application/merge-patch+json")
        return result

    async def delete(self, plural: str, namespace: str, name: str) -> None:
        await self._send("DELETE", path(plural, namespace, name))

    def versions(self, plural: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """Every stored version of the object, oldest first (what watchers were told, in order)."""
        for (res, ns, obj_name), obj in self.emulator.objects.items():
            if res.plural == plural and ns == namespace and obj_name == name:
                return [version.raw for version in obj.history if version is not None]
        return []

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object, read directly from the emulator."""
        for res in self.emulator.resources:
            if res.plural == plural and (res, namespace, name) in self.emulator.objects:
                obj = self.emulator.objects[res, namespace, name]
                return None if obj.deleted else obj.raw
        return None

    async def nudge(self, name: str = "reranker", namespace: str = NAMESPACE) -> float:
        """Ask for a pass of this model as any child event would: touch a ConfigMap labelled as the model's (not one
        of its children). Returns the time just before."""
        after = time.monotonic()
        nudge = {"metadata": {"name": f"{name}-nudge", "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                                                  "app.kubernetes.io/instance": name},
                              "annotations": {"nudge": str(after)}}}
        if self.get("configmaps", namespace, f"{name}-nudge") is None:
            await self.create("configmaps", namespace, nudge)
        else:
            await self.patch("configmaps", namespace, f"{name}-nudge", nudge)
        return after

    async def reconciled(self, name: str = "reranker", namespace: str = NAMESPACE,
                         timeout: float = 30.0) -> PassReport:
        """Nudge the operator and wait for a pass of this model that started after every change made so far and
        has finished: it read the current state, and wrote whatever it was going to write (its PassReport says).
        A pass that a spec edit's debounce window held (it rendered nothing) does not count; the passes after it
        are held until the edits stop (a test of the hold waits for the held pass itself: nudge, then wait)."""
        after = await self.nudge(name, namespace)
        return await self.wait_for(lambda: next((p for p in self.passes if p.key == (namespace, name)
                                                 and p.started > after and not p.held), None), timeout,
                                   f"a pass of {name}")

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
        """Poll until `check()` returns something truthy; fail with the last value otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
            await asyncio.sleep(0.05)


def _register_crd(emulator: ClusterEmulator, crd: dict[str, Any]) -> None:
    names, (version,) = crd["spec"]["names"], crd["spec"]["versions"]
    emulator.resources[f"{crd['spec']['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
        kind=names["kind"], singular=names["singular"], shortnames=names.get("shortNames", []),
        categories=names.get("categories", []), namespaced=crd["spec"]["scope"] == "Namespaced",
        verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
        subresources=list(version.get("subresources", {})))


@contextlib.contextmanager
def _environ(values: dict[str, str], remove: tuple[str, ...] = ()) -> Iterator[None]:
    saved = dict(os.environ)
    for key in remove:
        os.environ.pop(key, None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _kubeconfig(url: str, directory: Path) -> Path:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "kmock",
              "clusters": [{"name": "kmock", "cluster": {"server": url}}],
              "users": [{"name": "kmock", "user": {}}],
              "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}]}
    target = directory / "kubeconfig"
    target.write_text(yaml.safe_dump(config))
    return target


@contextlib.asynccontextmanager
async def running_cluster(*, service_monitor_api: bool = True, keda_api: bool = True) -> AsyncIterator[Cluster]:
    """An emulated API server with the built-in resources, the ScoringModel CRD (with its admission rules) and,
    optionally, the Prometheus operator's ServiceMonitor and KEDA's ScaledObject; KUBECONFIG points at it."""
    emulator = ClusterEmulator()
    emulator.resources.load_bundled()
    _register_crd(emulator, crd_tools.load_crd())
    if service_monitor_api:
        emulator.resources["monitoring.coreos.com/v1/servicemonitors"] = kmock.ResourceInfo(
            kind="ServiceMonitor", singular="servicemonitor", namespaced=True,
            verbs=["get", "list", "watch", "create", "update", "patch", "delete"])
    if keda_api:
        emulator.resources["keda.sh/v1alpha1/scaledobjects"] = kmock.ResourceInfo(
            kind="ScaledObject", singular="scaledobject", namespaced=True,
            verbs=["get", "list", "watch", "create", "update", "patch", "delete"])
        emulator.admission["scaledobjects"] = emulator.keda_webhook
    emulator.admission["scoringmodels"] = crd_tools.admit
    for plural in ("deployments", "pods", "horizontalpodautoscalers"):  # stored canonically, as the API server does
        emulator.admission[plural] = canonical_resources
    original_parse_path = parsing.parse_path
    parsing.parse_path = parse_path_with_namespaces
    try:
        async with emulator, kmock.Server(emulator) as server:
            with tempfile.TemporaryDirectory() as tmp:
                config = _kubeconfig(str(server.url).rstrip("/"), Path(tmp))
                # Never reach a real cluster from a CI pod: drop the in-cluster service-account hints.
                with _environ({"KUBECONFIG": str(config)}, remove=("KUBERNETES_SERVICE_HOST",
                                                                   "KUBERNETES_SERVICE_PORT")):
                    cluster = Cluster(emulator)
                    for namespace in NAMESPACES:  # kopf's namespaced mode only watches namespaces that exist
                        await cluster._send("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
                    yield cluster
    finally:
        parsing.parse_path = original_parse_path


class _PassRecorder(logging.Handler):
    """Collects the PassReport each reconcile pass logs (reconcile.py, at DEBUG)."""

    def __init__(self, into: list[PassReport]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        report = getattr(record, "pass_report", None)
        if isinstance(report, PassReport):
            self.into.append(report)


@contextlib.contextmanager
def _recording_passes(cluster: Cluster) -> Iterator[None]:
    reconcile_logger = logging.getLogger("scorekeeper_operator.reconcile")
    recorder, level = _PassRecorder(cluster.passes), reconcile_logger.level
    reconcile_logger.addHandler(recorder)
    reconcile_logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        reconcile_logger.removeHandler(recorder)
        reconcile_logger.setLevel(level)


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, env: dict[str, str] | None = None, namespaces: tuple[str, ...] = (),
                           on_stop: Callable[[], None] | None = None) -> AsyncIterator[None]:
    """The operator's real handlers under kopf.operator(), as `scorekeeper-operator` runs them.

    kopf gets its own thread and event loop: on shutdown it cancels every task of its loop that it did not see
    at start-up, which in a shared loop would include the test's own teardown. `cluster.memories` is kopf's
    per-object memory of this run (one entry per object its watches delivered and that still exists).
    `on_stop` runs once the operator is told to stop, before waiting for it (e.g. to fail a held request).
    """
    import scorekeeper_operator.handlers  # noqa: F401  (registers the handlers)

    stop, ready = threading.Event(), threading.Event()
    crashes: list[BaseException] = []
    cluster.memories = memories = ResourceMemories()
    cluster.memo = memo = kopf.Memo()
    calls_before = len(cluster.emulator.calls)

    def operate() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=kopf.get_default_registry(), clusterwide=not namespaces, namespaces=list(namespaces),
                standalone=True, stop_flag=stop, ready_flag=ready, memo=memo, memories=memories))
        except BaseException as error:  # surfaced in the test below
            crashes.append(error)

    with _environ({**FAST, **(env or {})}), _recording_passes(cluster):
        thread = threading.Thread(target=operate, name="kopf-operator", daemon=True)
        thread.start()
        started = await asyncio.to_thread(ready.wait, 15)
        try:
            if crashes:
                raise crashes[0]
            assert started, "the operator did not become ready"
            # kopf's ready flag comes before its watches; stopping in between leaves hung tasks (seconds).
            watching = {"scoringmodels", "pods", "deployments"}
            await cluster.wait_for(lambda: watching <= {c.resource for c in cluster.emulator.calls[calls_before:]
                                                        if c.verb == "watch"}, what="the operator's watches")
            yield
        finally:
            stop.set()
            if on_stop is not None:
                on_stop()
            await asyncio.to_thread(thread.join, 15)
            assert not thread.is_alive(), "the operator did not stop"
        if crashes:
            raise crashes[0]
