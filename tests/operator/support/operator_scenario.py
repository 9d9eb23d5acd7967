"""Every API call the operator makes, recorded from its real behaviour against the emulator (for RBAC rules).

The scenario walks every code path that touches the API: startup (kopf's discovery, CRD scanning, watches), all eight
child kinds created (the HPA, then KEDA's ScaledObject instead) and the optional ones deleted again, a status write,
reading the HPA and a pending pod's Events, drift repair, an invalid spec (kopf posts an Event), and the
ScoringModel's deletion. Usable outside pytest, e.g. from the Helm chart's RBAC test:

    sys.path.insert(0, str(REPO / "tests" / "operator" / "support"))
    from operator_scenario import record_operator_api_calls, rbac_rules
    rules = rbac_rules(record_operator_api_calls())
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from cluster_actors import add_worker_pod
from harness import Cluster, running_cluster, running_operator
from kmock_ext import ApiCall

NAMESPACE = "rbac"
NAME = "scenario"


def _model(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel",
            "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": spec}


async def exercise(cluster: Cluster) -> None:
    def has(plural: str) -> Any:
        return lambda: cluster.get(plural, NAMESPACE, NAME)

    full = {"model": {"uri": "pvc://models/x"}, "replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 3},
            "monitoring": {"serviceMonitor": True}, "networkPolicy": {"enabled": True}}
    await cluster.create("scoringmodels", NAMESPACE, _model(full))
    for plural in ("configmaps", "services", "deployments", "poddisruptionbudgets", "horizontalpodautoscalers",
                   "servicemonitors", "networkpolicies"):
        await cluster.wait_for(has(plural), what=plural)
    await add_worker_pod(cluster, f"{NAME}-0", NAME, ready=False, namespace=NAMESPACE, phase="Pending")
    await cluster.wait_for(lambda: any(c.resource == "events" and c.verb == "list" for c in cluster.emulator.calls),
                           what="the pending pod's Events read")
    await cluster.patch("scoringmodels", NAMESPACE, NAME, {"spec": {"autoscaling": {
        "provider": "KEDA", "prometheusAddress": "http://prometheus:9090"}}})
    await cluster.wait_for(lambda: cluster.get("scaledobjects", NAMESPACE, NAME)
                           and not cluster.get("horizontalpodautoscalers", NAMESPACE, NAME), what="HPA → KEDA")
    await cluster.patch("scoringmodels", NAMESPACE, NAME, {"spec": {
        "replicas": 1, "autoscaling": {"enabled": False}, "monitoring": {"serviceMonitor": False},
        "networkPolicy": {"enabled": False}}})
    await cluster.wait_for(lambda: not any(cluster.get(p, NAMESPACE, NAME) for p in (
        "scaledobjects", "servicemonitors", "networkpolicies")), what="optional children gone")
    await cluster.delete("services", NAMESPACE, NAME)
    await cluster.wait_for(has("services"), what="service recreated")
    await cluster.patch("scoringmodels", NAMESPACE, NAME, {"spec": {"extraArgs": ["--served=other"]}})
    await cluster.wait_for(lambda: any(c.resource == "events" and c.verb == "create" for c in cluster.emulator.calls),
                           what="kopf posting a warning event")
    await cluster.delete("scoringmodels", NAMESPACE, NAME)
    await cluster.reconciled(NAME, NAMESPACE)  # the operator has seen it go


async def record_async() -> frozenset[ApiCall]:
    async with running_cluster(service_monitor_api=True) as cluster:
        async with running_operator(cluster):
            await exercise(cluster)
        return frozenset(cluster.emulator.calls)


def record_operator_api_calls() -> frozenset[ApiCall]:
    """Run the scenario in a fresh event loop; returns the distinct (method, apiGroup, resource, subresource, verb)."""
    return asyncio.run(record_async())


def rbac_rules(calls: frozenset[ApiCall]) -> list[dict[str, Any]]:
    """ClusterRole rules that allow exactly these calls: one rule per (apiGroup, resource[/subresource])."""
    verbs: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for call in calls:
        name = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
        verbs[call.api_group, name].add(call.verb)
    return [{"apiGroups": [group], "resources": [name], "verbs": sorted(v)}
            for (group, name), v in sorted(verbs.items())]
