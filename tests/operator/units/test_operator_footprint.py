"""Footprint in a big cluster: the operator is sent, and keeps, only its own objects; its LISTs come in pages.

Issue 15: every Pod, ConfigMap, Service and Deployment in the cluster was listed (unpaged) and watched, then
filtered client-side; kopf kept a memory entry for each. Here thousands of unrelated objects (some even carrying
`app.kubernetes.io/instance: reranker`, as Helm-installed apps do) exist before the operator starts (its LISTs) and
are created while it runs (its WATCHes). Assertions are on what was requested, sent and held: no timing, no RSS.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, set_deployment_status
from harness import NAMESPACE, Cluster, running_operator
from model_checks import condition, created
from scorekeeper_operator.k8s import PODS, KubeApi
from scorekeeper_operator.render.manifests import MANAGED_BY

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
WATCHED = {"configmaps", "services", "deployments", "poddisruptionbudgets", "horizontalpodautoscalers",
           "servicemonitors", "pods"}


def unrelated(first: int, count: int) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """`count` objects of other apps, spread over kinds and namespaces."""
    bodies: dict[str, list[tuple[str, dict[str, Any]]]] = {"pods": [], "configmaps": [], "deployments": []}
    for index in range(first, first + count):
        labels = {"app": f"other-{index}"}
        if index % 10 == 0:  # another tool's objects for an app that happens to share the name
            labels.update({"app.kubernetes.io/instance": "reranker", "app.kubernetes.io/managed-by": "Helm"})
        namespace = NAMESPACE if index % 2 else "elsewhere"
        meta = {"name": f"other-{index}", "labels": labels}
        kind = ("pods", "configmaps", "deployments")[index % 3]
        body = {"metadata": meta, "data": {"k": "v"}} if kind == "configmaps" else {"metadata": meta, "spec": {}}
        bodies[kind].append((namespace, body))
    return bodies


async def add_unrelated(cluster: Cluster, first: int, count: int) -> None:
    for plural, bodies in unrelated(first, count).items():
        for namespace, body in bodies:
            await cluster.emulator.seed(plural, namespace, body)


async def test_unrelated_objects_are_neither_sent_to_nor_kept_by_the_operator(cluster: Cluster) -> None:
    await add_unrelated(cluster, 0, 10_000)  # there before the operator starts: its initial LISTs
    async with running_operator(cluster):
        await created(cluster, replicas=1)
        await add_unrelated(cluster, 10_000, 5_000)  # created while it runs: its WATCHes
        # Sentinels after them: once each stream has sent these, it has filtered everything before them.
        await add_worker_pod(cluster, "reranker-0")
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"scoring": {"maxBatchTokens": 4096}}})
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker")["metadata"]["generation"] == 2,
                               what="the new template applied")
        await set_deployment_status(cluster, ready=1)
        await cluster.wait_for(lambda: condition(cluster, "Ready") == ("True", "AllReplicasReady"), what="Ready")
        delivered = cluster.emulator.delivered
        await cluster.wait_for(lambda: "reranker-0" in delivered["pods"] and delivered["configmaps"].count(
            "reranker") >= 2 and delivered["deployments"].count("reranker") >= 3, what="the sentinels")
        memories = cluster.memories
        assert memories is not None and cluster.memo is not None
        held = set(memories._items)  # kopf's per-object memory, keyed by uid (private: no public accessor)
        scheduled = cluster.memo.reconciler.scheduler.keys

    ours = {"reranker", "reranker-0"}
    for plural in ("pods", "configmaps", "deployments", "services"):
        assert set(delivered[plural]) <= ours, plural  # sent only our objects …
    uids = {obj.raw["metadata"]["uid"] for (res, ns, name), obj in cluster.emulator.objects.items()
            if name in ours and ns == NAMESPACE}
    assert held <= uids and len(held) >= 4  # … kept only those (the model, its children, its pod) …
    assert scheduled == {(NAMESPACE, "reranker")}  # … and schedules passes for its models only
    requests = [r for r in cluster.emulator if r.resource is not None and r.headers.get("X-Test-Harness") is None
                and r.method.value == "GET" and r.name is None and r.resource.plural in WATCHED]
    assert requests and all(SELECTOR in r.params.get("labelSelector", "") for r in requests)  # filtered by the server
    lists = [r for r in requests if r.params.get("watch") not in ("true", "1")]
    assert lists and all(r.params.get("limit") == "500" for r in lists)  # in pages


async def test_the_operators_own_lists_follow_continue_tokens(cluster: Cluster) -> None:
    """More pods than a page (500): KubeApi.list reads every page and returns them all."""
    labels = {"app.kubernetes.io/name": "scorekeeper-worker", "app.kubernetes.io/instance": "big"}
    for i in range(1201):
        await cluster.emulator.seed("pods", NAMESPACE, {"metadata": {"name": f"big-{i}", "labels": labels}, "spec": {}})
    api = KubeApi.from_environment()
    try:
        pods = await api.list(PODS, NAMESPACE, label_selector="app.kubernetes.io/instance=big")
    finally:
        api.close()
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"big-{i}" for i in range(1201))
    pages = [r for r in cluster.emulator if r.resource is not None and r.resource.plural == "pods"
             and r.headers.get("X-Test-Harness") is None]
    assert [bool(r.params.get("continue")) for r in pages] == [False, True, True]
