"""Run the real operator (kopf, in process) against the extended KMock emulator, and poke it like a cluster would.

The harness's own requests carry HARNESS_HEADER, so `emulator.calls` holds only what the operator asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from kmock_ext import HARNESS_HEADER, RealisticEmulator
from kmock_semantics import parse_path_with_namespaces

T = TypeVar("T")
GROUP_VERSION = "scorekeeper.dev/v1alpha1"
HEADERS = {HARNESS_HEADER: "1"}
NAMESPACE = "ml"
NAMESPACES = (NAMESPACE, "elsewhere", "rbac")
FAST_RETRIES = {"SCOREKEEPER_RETRY_BASE_SECONDS": "0.2", "SCOREKEEPER_RETRY_MAX_SECONDS": "1"}


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
    def __init__(self, emulator: RealisticEmulator) -> None:
        self.emulator = emulator

    async def _send(self, method: str, url: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {**HEADERS, **({"Content-Type": content_type} if content_type else {})}
        response = await self.emulator.request(method, url, json=body, headers=headers)
        data = await response.json(content_type=None)
        if response.status >= 400:
            raise AssertionError(f"{method} {url} → {response.status}: {data.get('message')}")
        return data

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._send("POST", path(plural, namespace), body)
        return result

    async def patch(self, plural: str, namespace: str, name: str, body: dict[str, Any], *,
                    subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._send("PATCH", path(plural, namespace, name, subresource), body,
                                                  "application/merge-patch+json")
        return result

    async def delete(self, plural: str, namespace: str, name: str) -> None:
        await self._send("DELETE", path(plural, namespace, name))

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), read directly from the emulator."""
        for (res, ns, obj_name), obj in self.emulator.objects.items():
            if res.plural == plural and ns == namespace and obj_name == name and not obj.deleted:
                return obj.raw
        return None

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
        """Poll until `check()` returns something truthy; fail with the last value otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
            await asyncio.sleep(0.05)


async def add_worker_pod(cluster: Cluster, name: str, model: str = "reranker", *, ready: bool = True,
                         namespace: str = NAMESPACE, **status: Any) -> None:
    """What the ReplicaSet controller and kubelet would do: a pod from the Deployment's template, with a status."""
    deployment = cluster.get("deployments", namespace, model)
    assert deployment is not None, "no Deployment to make a pod for"
    template = deployment["spec"]["template"]["metadata"]
    await cluster.create("pods", namespace, {"metadata": {"name": name, "labels": template["labels"],
                                                          "annotations": template["annotations"]},
                                             "spec": deployment["spec"]["template"]["spec"]})
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *status.pop("conditions", [])]
    await cluster.patch("pods", namespace, name, {"status": {"phase": "Running", "conditions": conditions, **status}},
                        subresource="status")


async def set_deployment_status(cluster: Cluster, ready: int, model: str = "reranker", *,
                                namespace: str = NAMESPACE, **extra: Any) -> None:
    """What the Deployment controller would report: `ready` pods, all on the newest template."""
    deployment = cluster.get("deployments", namespace, model)
    assert deployment is not None
    want = deployment["spec"].get("replicas", 1)
    status = {"observedGeneration": deployment["metadata"]["generation"], "replicas": want, "updatedReplicas": want,
              "readyReplicas": ready, "availableReplicas": ready, **extra}
    await cluster.patch("deployments", namespace, model, {"status": status}, subresource="status")


async def quiet(cluster: Cluster, seconds: float = 0.5, timeout: float = 10.0) -> None:
    """Wait until the operator has made no API call for `seconds` (its reaction to the last change is over)."""
    deadline = time.monotonic() + timeout
    seen = len(cluster.emulator.calls)
    while time.monotonic() < deadline:
        await asyncio.sleep(seconds)
        if len(cluster.emulator.calls) == seen:
            return
        seen = len(cluster.emulator.calls)
    raise AssertionError(f"the operator kept calling the API for {timeout}s")


def _register_crd(emulator: RealisticEmulator, crd: dict[str, Any]) -> None:
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
    emulator = RealisticEmulator()
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
    emulator.admission["scoringmodels"] = crd_tools.admit
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


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, env: dict[str, str] | None = None,
                           namespaces: tuple[str, ...] = ()) -> AsyncIterator[None]:
    """The operator's real handlers under kopf.operator(), as `scorekeeper-operator` runs them.

    kopf gets its own thread and event loop: on shutdown it cancels every task of its loop that it did not see
    at start-up, which in a shared loop would include the test's own teardown.
    """
    import scorekeeper_operator.handlers  # noqa: F401  (registers the handlers)

    stop, ready = threading.Event(), threading.Event()
    crashes: list[BaseException] = []

    def operate() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=kopf.get_default_registry(), clusterwide=not namespaces, namespaces=list(namespaces),
                standalone=True, stop_flag=stop, ready_flag=ready, memo=kopf.Memo()))
        except BaseException as error:  # surfaced in the test below
            crashes.append(error)

    with _environ({**FAST_RETRIES, **(env or {})}):
        thread = threading.Thread(target=operate, name="kopf-operator", daemon=True)
        thread.start()
        started = await asyncio.to_thread(ready.wait, 15)
        try:
            if crashes:
                raise crashes[0]
            assert started, "the operator did not become ready"
            # kopf's ready flag comes before its watches; stopping in between leaves hung tasks (seconds).
            watching = {"scoringmodels", "pods", "deployments"}
            await cluster.wait_for(lambda: watching <= {c.resource for c in cluster.emulator.calls
                                                        if c.verb == "watch"}, what="the operator's watches")
            yield
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 15)
            assert not thread.is_alive(), "the operator did not stop"
        if crashes:
            raise crashes[0]
