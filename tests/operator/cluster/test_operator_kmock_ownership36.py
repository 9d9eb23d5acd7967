"""Issue 36 through the real operator: children restored with a stale owner uid are adopted (with an Event), a 403
on a LIST reaches status, and a ScoringModel being deleted (another finalizer holds it) gets nothing re-applied."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod
from harness import NAMESPACE, Cluster, scoring_model
from model_checks import CHILDREN, condition, created, model_status
from scorekeeper_operator.render.manifests import MANAGED_BY
from test_operator_kmock_healing import events_about

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
LABELS = {"app.kubernetes.io/name": "scorekeeper-worker", "app.kubernetes.io/instance": "reranker",
          "app.kubernetes.io/managed-by": MANAGED_BY}
RBAC = 'events is forbidden: User "system:serviceaccount:scorekeeper:operator" cannot list resource "events"'


async def test_children_with_a_stale_owner_uid_are_adopted_with_an_event(operator: Cluster) -> None:
    """A backup restored the Service before its ScoringModel: the Service names the old uid as its owner."""
    stale = {"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel", "name": "reranker",
             "uid": "0c1d-old", "controller": True, "blockOwnerDeletion": True}
    await operator.emulator.seed("services", NAMESPACE, {"metadata": {
        "name": "reranker", "labels": LABELS, "ownerReferences": [stale]},
        "spec": {"ports": [{"port": 8000}], "selector": {"app.kubernetes.io/instance": "reranker"}}})
    model = await created(operator)
    await operator.wait_for(lambda: (operator.get("services", NAMESPACE, "reranker") or {})["metadata"].get(
        "ownerReferences", [{}])[0].get("uid") == model["metadata"]["uid"], what="the Service adopted")
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"), what="no conflict")
    await operator.wait_for(lambda: [e for e in events_about(operator) if e["reason"] == "Adopted"], what="Event")
    (adopted,) = [e for e in events_about(operator) if e["reason"] == "Adopted"]
    assert adopted["type"] == "Normal" and "Service ml/reranker" in adopted["message"]


async def test_a_foreign_child_is_still_a_conflict(operator: Cluster) -> None:
    """Labelled like ours, but owned by something else: not ours to take."""
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker", "uid": "0c1d-other"}
    await operator.emulator.seed("services", NAMESPACE, {"metadata": {
        "name": "reranker", "labels": LABELS, "ownerReferences": [other]}, "spec": {"ports": [{"port": 80}]}})
    await operator.create("scoringmodels", NAMESPACE, scoring_model())
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("False", "ChildConflict"))


async def test_a_403_on_the_events_list_reaches_status_and_heals(operator: Cluster) -> None:
    await created(operator)
    operator.emulator.fail("GET", "events", status=403, times=10_000, reason="Forbidden", message=RBAC)
    await add_worker_pod(operator, "reranker-a", ready=False, phase="Pending")  # its Events are read
    await operator.wait_for(lambda: condition(operator, "ChildrenReady") == ("False", "Forbidden"), what="named")
    found = next(c for c in model_status(operator)["conditions"] if c["type"] == "ChildrenReady")
    assert "list Events" in found["message"] and RBAC in found["message"]
    operator.emulator.heal()  # the Role gains the rule: the re-check (with backoff) finds it
    await operator.wait_for(lambda: condition(operator, "ChildrenReady") == ("True", "Applied"), what="healed")


def conditions_of(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


async def test_nothing_is_re_applied_while_the_model_is_being_deleted(operator: Cluster) -> None:
    """Another controller's finalizer (or a foreground deletion) keeps the ScoringModel with a deletionTimestamp
    while the garbage collector removes its children: re-applying them would fight the collector."""
    body = scoring_model()
    body["metadata"]["finalizers"] = ["example.com/hold"]
    await operator.create("scoringmodels", NAMESPACE, body)
    for plural in CHILDREN:
        await operator.wait_for(lambda p=plural: operator.get(p, NAMESPACE, "reranker"), what=plural)  # type: ignore[misc]
    await operator.delete("scoringmodels", NAMESPACE, "reranker")
    assert (operator.get("scoringmodels", NAMESPACE, "reranker") or {})["metadata"].get("deletionTimestamp")
    await operator.delete("configmaps", NAMESPACE, "reranker")  # the collector at work
    report = await operator.reconciled()
    assert report.gone and report.wrote == []
    assert operator.get("configmaps", NAMESPACE, "reranker") is None
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 2}})  # even an edit
    report = await operator.reconciled()
    assert report.gone and operator.get("configmaps", NAMESPACE, "reranker") is None
