"""Issues 36 and 49 through the real operator: children restored with a stale owner uid are adopted (with one Event,
however many operator replicas race for them) under server-side apply's merge of owner references by uid, a 403 on a
LIST reaches status until it heals, and a ScoringModel being deleted (another finalizer holds it) gets nothing
re-applied."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from model_checks import CHILDREN, condition, created, model_status
from scorekeeper_operator.render.manifests import MANAGED_BY
from test_operator_kmock_healing import events_about

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
LABELS = {"app.kubernetes.io/name": "scorekeeper-worker", "app.kubernetes.io/instance": "reranker",
          "app.kubernetes.io/managed-by": MANAGED_BY}
RBAC = 'events is forbidden: User "system:serviceaccount:scorekeeper:operator" cannot list resource "events"'
STALE = {"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel", "name": "reranker", "uid": "0c1d-old",
         "controller": True, "blockOwnerDeletion": True}
SERVICE_PATH = f"/api/v1/namespaces/{NAMESPACE}/services/reranker"


async def restored_service(cluster: Cluster) -> None:
    """A backup restored the Service before its ScoringModel: it names the old uid as its controller. Its writer is
    not the operator's field manager (the restore created it)."""
    await cluster.emulator.seed("services", NAMESPACE, {"metadata": {
        "name": "reranker", "labels": LABELS, "ownerReferences": [STALE]},
        "spec": {"ports": [{"port": 8000}], "selector": {"app.kubernetes.io/instance": "reranker"}}})


def owners(cluster: Cluster) -> list[str]:
    return [ref["uid"] for ref in (cluster.get("services", NAMESPACE, "reranker") or {})["metadata"].get(
        "ownerReferences") or []]


async def test_server_side_apply_keeps_another_managers_owner_reference_and_two_controllers_are_refused(
        cluster: Cluster) -> None:
    """The API server's semantics the adoption has to live with: ownerReferences is a list keyed by uid, so an apply
    adds its reference beside the restored one, and two controller references are invalid."""
    await restored_service(cluster)
    ours = {**STALE, "uid": "0c1d-new"}
    apply = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reranker", "ownerReferences": [ours]}}
    response = await cluster.emulator.request("PATCH", SERVICE_PATH + "?fieldManager=scorekeeper-operator&force=true",
                                              json=apply, headers={"Content-Type": "application/apply-patch+yaml"})
    refused = await response.json(content_type=None)
    assert response.status == 422 and "Only one reference can have Controller set to true" in refused["message"]
    assert owners(cluster) == ["0c1d-old"]  # a refused write changes nothing
    await cluster.patch("services", NAMESPACE, "reranker", {"metadata": {"ownerReferences": [
        {**STALE, "controller": False}]}})  # no longer a controller: now the apply merges beside it
    await cluster.emulator.request("PATCH", SERVICE_PATH + "?fieldManager=scorekeeper-operator&force=true",
                                   json=apply, headers={"Content-Type": "application/apply-patch+yaml"})
    assert owners(cluster) == ["0c1d-old", "0c1d-new"]


async def test_children_with_a_stale_owner_uid_are_adopted_with_an_event(operator: Cluster) -> None:
    await restored_service(operator)
    model = await operator.create("scoringmodels", NAMESPACE, scoring_model())
    await operator.wait_for(lambda: owners(operator) == [model["metadata"]["uid"]], what="the Service adopted")
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"), what="no conflict")
    await operator.wait_for(lambda: [e for e in events_about(operator) if e["reason"] == "Adopted"], what="Event")
    (adopted,) = [e for e in events_about(operator) if e["reason"] == "Adopted"]
    assert adopted["type"] == "Normal" and "Service ml/reranker" in adopted["message"]


async def test_two_operator_replicas_adopt_once_and_post_one_event(cluster: Cluster) -> None:
    """Both replicas read the restored Service and send their adoption at the same moment (held, then released
    together): the one whose guard still holds adopts; the other reads again and finds nothing to adopt."""
    await restored_service(cluster)
    hold = cluster.emulator.hold("PATCH", "services")
    async with running_operator(cluster), running_operator(cluster):
        model = await cluster.create("scoringmodels", NAMESPACE, scoring_model())
        await cluster.wait_for(lambda: hold.held >= 2, what="both replicas adopting the Service")
        hold.release()
        await cluster.wait_for(lambda: owners(cluster) == [model["metadata"]["uid"]], what="the Service adopted")
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("True", "Valid"), what="no conflict")
        await cluster.reconciled()
    assert [e["reason"] for e in events_about(cluster)] == ["Adopted"]


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


async def test_a_403_on_the_pods_list_reaches_status_until_it_heals(operator: Cluster) -> None:
    """The reconciler's own LIST of the worker pods (kopf's cluster-wide watch is not refused here): named in
    ChildrenReady while the API refuses it, re-checked by LISTing again, not from what the watch cached."""
    denied = RBAC.replace('"events"', '"pods"')
    operator.emulator.fail("GET", "pods", status=403, times=10_000, reason="Forbidden", message=denied,
                           namespaced=True)
    await created(operator)
    await operator.wait_for(lambda: condition(operator, "ChildrenReady") == ("False", "Forbidden"), what="named")
    found = next(c for c in model_status(operator)["conditions"] if c["type"] == "ChildrenReady")
    assert "list Pods" in found["message"] and denied in found["message"]
    await operator.reconciled()  # a re-check that started after the refusal: still refused, still said
    assert condition(operator, "ChildrenReady") == ("False", "Forbidden")
    operator.emulator.heal()
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
