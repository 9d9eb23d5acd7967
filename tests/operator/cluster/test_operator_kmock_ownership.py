"""What the operator may touch, with the real operator against the emulator: a user's own objects named like the
model stay theirs, a delete removes exactly the object that was read (uid precondition), and a field the operator
stopped rendering leaves the live object."""

from __future__ import annotations

import pytest
from harness import NAMESPACE, Cluster, scoring_model
from model_checks import condition, created

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
TARGET = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker"}
USERS = {
    "horizontalpodautoscalers": ({"scaleTargetRef": TARGET, "minReplicas": 1, "maxReplicas": 9},
                                 {"autoscaling": {"enabled": True, "maxReplicas": 3}}),
    "poddisruptionbudgets": ({"minAvailable": 1, "selector": {"matchLabels": {"app": "mine"}}}, {"replicas": 3}),
}


@pytest.mark.parametrize("plural", list(USERS))
async def test_a_users_own_object_named_like_the_model_is_not_taken_over(operator: Cluster, plural: str) -> None:
    user_spec, model_spec = USERS[plural]
    mine = await operator.create(plural, NAMESPACE, {"metadata": {"name": "reranker", "labels": {"team": "search"}},
                                                     "spec": user_spec})
    await operator.create("scoringmodels", NAMESPACE, scoring_model(**model_spec))
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("False", "ChildConflict"), what="conflict")
    await operator.reconciled()  # looked again (with backoff): still theirs
    assert operator.get(plural, NAMESPACE, "reranker") == mine  # not one field changed, no owner reference added
    writes = [c for c in operator.emulator.calls if c.resource == plural and c.verb in ("patch", "create", "delete")]
    assert writes == []


async def test_a_delete_removes_only_the_object_that_was_read(operator: Cluster) -> None:
    """The PDB is no longer wanted; between the operator's read and its DELETE, someone replaces it with their own
    object of the same name: the uid precondition makes the DELETE miss (409), and theirs stays."""
    await created(operator, replicas=3)
    ours = await operator.wait_for(lambda: operator.get("poddisruptionbudgets", NAMESPACE, "reranker"), what="PDB")
    hold = operator.emulator.hold("DELETE", "poddisruptionbudgets")
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 1}})
    await operator.wait_for(lambda: hold.held, what="the operator deleting our PDB")
    await operator.delete("poddisruptionbudgets", NAMESPACE, "reranker")
    theirs = await operator.create("poddisruptionbudgets", NAMESPACE, {"metadata": {"name": "reranker"}, "spec": {
        "maxUnavailable": 2, "selector": {"matchLabels": {"app": "mine"}}}})
    assert theirs["metadata"]["uid"] != ours["metadata"]["uid"]
    hold.release()
    await operator.reconciled()
    assert operator.get("poddisruptionbudgets", NAMESPACE, "reranker") == theirs


async def test_a_label_removed_from_monitoring_labels_leaves_the_service_monitor(operator: Cluster) -> None:
    """Issue 25: the live ServiceMonitor still contained everything rendered, so it was not applied again, and the
    label the user removed stayed (only an apply without it removes it)."""
    await created(operator, monitoring={"labels": {"release": "prometheus", "team": "search"}})
    labels = lambda: (operator.get("servicemonitors", NAMESPACE, "reranker") or {}).get(  # noqa: E731
        "metadata", {}).get("labels", {})
    await operator.wait_for(lambda: labels().get("team") == "search", what="both labels")
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"monitoring": {"labels": {"team": None}}}})
    await operator.wait_for(lambda: "team" not in labels(), what="the label removed")
    assert labels()["release"] == "prometheus"
    report = await operator.reconciled()
    assert report.wrote == []  # and no apply loop after that
