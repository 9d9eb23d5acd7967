"""Issue 36 through the real operator: a short cluster (no free GPU), a refused optional child, a burst of edits.

- Pending GPU pods are named at once: the scheduler's reason, Karpenter's `Nominated`, and a Recreate model that is
  down because its new pod cannot be placed says so (not "0 of 1 pods run the current configuration" for 10 min).
- Ready follows Available: a refused optional child is its own condition, never Ready=False or phase Failed while
  the pods serve.
- The scheduling deadline is the model's, counted on the operator's clock from when it first saw the wait (issue 49:
  the scheduler's timestamps come from another machine's clock), and its re-check comes by itself.
- Spec edits are debounced: 20 edits in a burst roll the pods at most twice; a pass for another reason (a child
  event) that reads an edit kopf has not delivered yet holds it too.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from cluster_actors import add_worker_pod, post_event, set_deployment_status, timestamp
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from model_checks import args_of, condition, created, model_status, reached
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, GENERATION_ANNOTATION
from test_operator_kmock_healing import QUOTA

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
GPU = {"resources": {"gpu": {"count": 1}}}


def conditions_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def pending_gpu_pod(cluster: Cluster, *, since: float = 0.0) -> dict[str, Any]:
    """The Recreate rollout's new pod: the old one is gone, the scheduler finds no free GPU."""
    await set_deployment_status(cluster, ready=0)
    return await add_worker_pod(cluster, "reranker-new", ready=False, phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_GPU,
        "lastTransitionTime": timestamp(since)}])


async def test_a_recreate_model_whose_pod_cannot_be_placed_says_it_is_down_and_why_at_once(
        operator: Cluster) -> None:
    await created(operator, **GPU)
    assert operator.get("deployments", NAMESPACE, "reranker")["spec"]["strategy"] == {"type": "Recreate"}
    await pending_gpu_pod(operator)

    def named() -> dict[str, Any] | None:
        found = conditions_of(model_status(operator))
        return found if "Insufficient nvidia.com/gpu" in found.get("Ready", {}).get("message", "") else None

    found = await operator.wait_for(named, timeout=30, what="the scheduler's reason in Ready")  # the target: 30 s
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "PodsUnschedulable")
    assert found["Available"]["reason"] == "PodsUnschedulable" and "down" in found["Available"]["message"]
    assert "Insufficient nvidia.com/gpu" in found["Progressing"]["message"]
    assert found["Degraded"]["status"] == "False"  # a wait, within the scheduling deadline


async def test_karpenter_nomination_is_a_node_on_its_way(operator: Cluster) -> None:
    await created(operator, **GPU)
    pod = await pending_gpu_pod(operator)
    await post_event(operator, pod, "Nominated", "Pod should schedule on: nodeclaim/gpu-7x2kq", kind="Normal")
    await operator.wait_for(lambda: "nodeclaim/gpu-7x2kq" in conditions_of(model_status(operator)).get(
        "Ready", {}).get("message", ""), timeout=30, what="the nomination named")
    assert condition(operator, "Ready") == ("False", "NodeProvisioning")
    assert condition(operator, "Degraded") == ("False", "Healthy")


async def test_the_scheduling_deadline_runs_on_the_operators_clock_and_its_re_check_comes_by_itself(
        cluster: Cluster) -> None:
    """The scheduler's clock is 15 minutes behind the operator's: the pod's PodScheduled condition looks 900 s old
    when the operator first sees it, yet the wait gets the model's whole deadline (30 s, the default is 600 s), from
    that moment. Events are polled every 600 s here: only the deadline's own re-check can bring the pass that says
    it has passed (before kopf reconnects the watches it finds idle for 60 s, which would bring one too)."""
    async with running_operator(cluster, env={"SCOREKEEPER_POLL_SECONDS": "600"}):
        await created(cluster, rollout={"schedulingDeadlineSeconds": 30}, **GPU)
        await pending_gpu_pod(cluster, since=900)
        seen = await cluster.wait_for(lambda: "reranker-new" in conditions_of(model_status(cluster)).get(
            "Ready", {}).get("message", "") and model_status(cluster), timeout=30, what="the pod seen")
        assert conditions_of(seen)["Degraded"]["status"] == "False"  # 0 s of 30 on the operator's clock: a wait
        report = await cluster.reconciled()
        assert report.next_pass_in is not None and report.next_pass_in <= 31  # the re-check, not the 600 s poll
        status = await reached(cluster, timeout=45, Degraded=("True", "Unschedulable"))
        said = conditions_of(status)["Degraded"]["message"]
        assert "Insufficient nvidia.com/gpu" in said and re.search(r"\(for \d+ s\)$", said), said


async def test_a_refused_optional_child_never_turns_ready_false_while_the_pods_serve(operator: Cluster) -> None:
    await created(operator)
    await set_deployment_status(operator, ready=1)
    await operator.wait_for(lambda: condition(operator, "Ready") == ("True", "AllReplicasReady"), what="Ready")
    served = len(operator.versions("scoringmodels", NAMESPACE, "reranker"))
    operator.emulator.fail("PATCH", "networkpolicies", status=403, times=1000, reason="Forbidden",
                           message=QUOTA.replace("configmaps", "networkpolicies"))
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"networkPolicy": {"enabled": True}}})
    await operator.wait_for(lambda: condition(operator, "ChildrenReady") == ("False", "QuotaExceeded"), timeout=30)
    await operator.reconciled()
    status = model_status(operator)
    assert condition(operator, "ConfigValid") == ("False", "QuotaExceeded")
    assert condition(operator, "Ready") == ("True", "AllReplicasReady") and status["phase"] != "Failed"
    assert "networkpolicies" in conditions_of(status)["ChildrenReady"]["message"]
    written = operator.versions("scoringmodels", NAMESPACE, "reranker")[served:]
    assert written and all(conditions_of(v.get("status") or {})["Ready"]["status"] == "True" for v in written)
    assert all(v["status"]["phase"] not in ("Failed", "Progressing") for v in written)


def rollouts(cluster: Cluster) -> list[str]:
    """The pod templates the Deployment went through (each change is a rollout), in order."""
    seen: list[str] = []
    for version in cluster.versions("deployments", NAMESPACE, "reranker"):
        found = version["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        if not seen or seen[-1] != found:
            seen.append(found)
    return seen


async def test_a_burst_of_twenty_edits_rolls_the_pods_at_most_twice(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_DEBOUNCE_SECONDS": "2"}):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model())
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker"), what="the Deployment")
        await set_deployment_status(cluster, ready=1)
        await cluster.reconciled()
        for tokens in range(1001, 1021):  # as fast as the API takes them
            await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"scoring": {
                "maxBatchTokens": tokens}}})
        await cluster.wait_for(lambda: "1020" in args_of(cluster.get("deployments", NAMESPACE, "reranker") or {}),
                               what="the last edit rendered")
        await cluster.wait_for(lambda: model_status(cluster).get("observedGeneration") == 21, what="status")
        await cluster.reconciled()
    assert len(rollouts(cluster)) <= 3  # the first template, then at most two rollouts


async def test_a_pass_for_a_child_event_holds_an_edit_kopf_has_not_delivered_yet(cluster: Cluster) -> None:
    """The edit comes within the debounce window of the last rendering, but kopf's watch of ScoringModels is down
    (held while it reconnects), so no update handler announces it; a child event's pass reads it first. That pass
    holds it too: rendering it there would roll the pods once more for a burst still under way."""
    async with running_operator(cluster, env={"SCOREKEEPER_DEBOUNCE_SECONDS": "60"}):
        await created(cluster)  # generation 1, rendered now: the window runs for 60 s
        hold = cluster.emulator.hold("GET", "scoringmodels", cluster_wide=True)
        try:
            await cluster.emulator.drop_watches()
            await cluster.wait_for(lambda: hold.held, what="kopf reconnecting to ScoringModels")
            edited = time.monotonic()
            await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"scoring": {"maxBatchTokens": 1001}}})
            await cluster.nudge()  # a child event: its pass reads generation 2, unless a pass for another came first
            # The first pass that reads it is held, and holds the passes after it (the nudge's too) for the window.
            report = await cluster.wait_for(lambda: next((p for p in cluster.passes if p.key == (NAMESPACE, "reranker")
                                                          and p.started > edited and p.held), None), what="held")
            assert report.wrote == []
            since = [p for p in cluster.passes if p.key == (NAMESPACE, "reranker") and p.started > edited]
            assert not [w for p in since for w in p.wrote if w.startswith("apply")]  # none rendered generation 2
            deployment = cluster.get("deployments", NAMESPACE, "reranker") or {}
            assert deployment["metadata"]["annotations"][GENERATION_ANNOTATION] == "1"
            assert "1001" not in args_of(deployment)
        finally:
            hold.release()
