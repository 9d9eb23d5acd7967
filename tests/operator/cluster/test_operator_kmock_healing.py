"""Self-healing through the real operator: conflicts and rejections without a spec edit, API errors with backoff,
lost watch streams, and a restart in the middle of a pass."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from cluster_actors import set_deployment_status
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from model_checks import CHILDREN, condition, created, model_status

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The delays the operator chose after each failed pass (its own log: "retrying in N s")."""
    return [record.args[-1] for record in caplog.records  # type: ignore[index,misc]
            if record.name == "scorekeeper_operator.schedule" and "retrying" in record.msg]


def labelled(cluster: Cluster, plural: str) -> list[dict[str, object]]:
    return [obj.raw for (res, ns, _), obj in cluster.emulator.objects.items() if res.plural == plural
            and ns == NAMESPACE and not obj.deleted
            and (obj.raw["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == "reranker"]


async def test_deleting_the_foreign_object_brings_the_model_back_without_a_spec_edit(operator: Cluster) -> None:
    foreign = {"metadata": {"name": "reranker", "labels": {"team": "other"}},
               "spec": {"ports": [{"port": 80}], "selector": {"app": "other"}}}
    await operator.create("services", NAMESPACE, foreign)
    await operator.create("scoringmodels", NAMESPACE, scoring_model())
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("False", "ChildConflict"))
    service = operator.get("services", NAMESPACE, "reranker") or {}
    assert service["spec"]["selector"] == {"app": "other"} and "ownerReferences" not in service["metadata"]
    blocked = await operator.wait_for(lambda: [p.next_pass_in for p in operator.passes if p.error == "ChildConflict"]
                                      if sum(p.error == "ChildConflict" for p in operator.passes) >= 3 else None)
    assert blocked[:3] == [0.2, 0.4, 0.8]  # re-checked with backoff (base 0.2 s, capped at 1 s in the tests)
    await operator.delete("services", NAMESPACE, "reranker")  # the foreign object goes: no spec edit follows
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"), what="healed")
    for plural in CHILDREN:
        await operator.wait_for(lambda p=plural: operator.get(p, NAMESPACE, "reranker"), what=plural)  # type: ignore[misc]
    await set_deployment_status(operator, ready=1)
    await operator.wait_for(lambda: condition(operator, "Ready") == ("True", "AllReplicasReady"), what="Ready")


QUOTA = ('configmaps "reranker" is forbidden: exceeded quota: object-counts, requested: count/configmaps=1,'
         ' used: count/configmaps=10, limited: count/configmaps=10')
GATEKEEPER = ('admission webhook "validation.gatekeeper.sh" denied the request: [must-have-owner] you must provide'
              ' labels: {"owner"}')


def events_about(cluster: Cluster, name: str = "reranker") -> list[dict[str, Any]]:
    return [obj.raw for (res, ns, _), obj in cluster.emulator.objects.items() if res.plural == "events"
            and ns == NAMESPACE and not obj.deleted and obj.raw["involvedObject"].get("kind") == "ScoringModel"
            and obj.raw["involvedObject"]["name"] == name]


@pytest.mark.parametrize(("plural", "status", "reason", "message", "expected"), [
    ("configmaps", 403, "Forbidden", QUOTA, "QuotaExceeded"),  # a ResourceQuota on object counts
    ("deployments", 403, "Forbidden", GATEKEEPER, "AdmissionWebhookDenied"),  # a policy engine's webhook
    ("deployments", 422, "Invalid", 'Deployment.apps "reranker" is invalid: spec.template: bad', "Rejected"),
])
async def test_a_refusal_is_a_condition_and_an_event_at_once_and_heals_by_itself(
        operator: Cluster, plural: str, status: int, reason: str, message: str, expected: str) -> None:
    """Issue 25: a 403 from a quota or a webhook was retried silently, and a new model showed an empty status
    forever. Now the pass that meets it writes a condition naming the refusal, with the API's message, and an Event
    (not one retry interval later); the operator keeps looking, so lifting the quota heals the model."""
    operator.emulator.fail("PATCH", plural, status=status, times=3, reason=reason, message=message)
    await operator.create("scoringmodels", NAMESPACE, scoring_model())
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("False", expected), what=expected)
    first = await operator.wait_for(lambda: next((p for p in operator.passes if p.error == expected), None))
    assert first.wrote[-2:] == ["status", "event"]  # in that very pass
    config_valid = next(c for c in model_status(operator)["conditions"] if c["type"] == "ConfigValid")
    assert message in config_valid["message"]
    (event,) = events_about(operator)
    assert (event["type"], event["reason"]) == ("Warning", expected) and message in event["message"]
    assert event["involvedObject"]["uid"] == operator.get("scoringmodels", NAMESPACE, "reranker")["metadata"]["uid"]
    await operator.wait_for(lambda: operator.get("deployments", NAMESPACE, "reranker"), what="applied, no spec edit")
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"))
    assert [p.next_pass_in for p in operator.passes if p.error == expected] == [0.2, 0.4, 0.8]
    assert len(events_about(operator)) == 1  # one Event per refusal, not one per retry


@pytest.mark.parametrize("status", [500, 409])
async def test_api_errors_are_retried_with_exponential_backoff_until_converged(
        operator: Cluster, caplog: pytest.LogCaptureFixture, status: int) -> None:
    caplog.set_level(logging.WARNING, logger="scorekeeper_operator.schedule")
    operator.emulator.fail("PATCH", "deployments", status=status, times=3)
    await created(operator)
    assert retry_delays(caplog) == [0.2, 0.4, 0.8]  # base·2^n: the first pass and three retries, the last one applied
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"))
    # The child-event path backs off too (the streak starts again after a success).
    caplog.clear()
    operator.emulator.fail("PATCH", "configmaps", status=500, times=2)
    await operator.delete("configmaps", NAMESPACE, "reranker")
    await operator.wait_for(lambda: operator.get("configmaps", NAMESPACE, "reranker"), what="configmap restored")
    assert retry_delays(caplog) == [0.2, 0.4]


async def test_changes_made_while_the_watches_are_down_are_caught_up(operator: Cluster) -> None:
    await created(operator, replicas=2)
    holds = [operator.emulator.hold("GET", plural, watch=True) for plural in ("configmaps", "scoringmodels")]
    await operator.emulator.drop_watches()  # an API server restart: every stream ends
    await operator.wait_for(lambda: all(h.held for h in holds), what="kopf reconnecting")
    # Unseen: the DELETED event of the ConfigMap and the spec change go to no one.
    await operator.delete("configmaps", NAMESPACE, "reranker")
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 3}})
    for hold in holds:
        hold.release()
    await operator.wait_for(lambda: operator.get("configmaps", NAMESPACE, "reranker"), what="configmap restored")
    await operator.wait_for(lambda: (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]["replicas"]
                            == 3, what="spec change applied")


async def test_a_restart_in_the_middle_of_a_pass_converges_without_duplicates(cluster: Cluster) -> None:
    hold = cluster.emulator.hold("PATCH", "deployments")
    # The connection drops (503) only once this operator is told to stop: its pass never applies the Deployment.
    async with running_operator(cluster, on_stop=lambda: hold.release(fail_with=503)):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(replicas=2))
        await cluster.wait_for(lambda: hold.held, what="a pass stuck applying the Deployment")
        first = {plural: (cluster.get(plural, NAMESPACE, "reranker") or {}).get("metadata", {}).get("uid")
                 for plural in ("configmaps", "services")}
        assert all(first.values()) and cluster.get("deployments", NAMESPACE, "reranker") is None
    async with running_operator(cluster):
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker"), what="resumed")
        await set_deployment_status(cluster, ready=2)
        await cluster.wait_for(lambda: condition(cluster, "Ready") == ("True", "AllReplicasReady"), what="Ready")
    for plural in (*CHILDREN, "poddisruptionbudgets"):
        assert len(labelled(cluster, plural)) == 1, plural  # nothing created twice …
    for plural, uid in first.items():
        assert (cluster.get(plural, NAMESPACE, "reranker") or {})["metadata"]["uid"] == uid  # … or again


async def test_the_resync_repairs_what_no_watch_reported(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_RESYNC_SECONDS": "0.5"}):
        await created(cluster)
        while (await cluster.reconciled()).wrote:  # settled: no pass has anything left to do
            pass
        watched = ("scoringmodels", "configmaps", "services", "deployments", "poddisruptionbudgets",
                   "horizontalpodautoscalers", "servicemonitors", "pods")
        # kopf re-lists before it watches again: hold those too, or the re-listed objects would trigger a pass.
        holds = [cluster.emulator.hold("GET", plural, cluster_wide=True) for plural in watched]
        await cluster.emulator.drop_watches()
        await cluster.wait_for(lambda: all(h.held for h in holds), what="kopf reconnecting")
        await cluster.delete("configmaps", NAMESPACE, "reranker")  # no watch is open: nothing reports this
        await cluster.wait_for(lambda: cluster.get("configmaps", NAMESPACE, "reranker"), what="restored by resync")
        for hold in holds:
            hold.release()
