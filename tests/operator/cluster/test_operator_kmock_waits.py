"""Issue 36 through the real operator: a short cluster (no free GPU), a refused optional child, a burst of edits.

- Pending GPU pods are named at once: the scheduler's reason, Karpenter's `Nominated`, and a Recreate model that is
  down because its new pod cannot be placed says so (not "0 of 1 pods run the current configuration" for 10 min).
- Ready follows Available: a refused optional child is its own condition, never Ready=False or phase Failed while
  the pods serve.
- Spec edits are debounced: 20 edits in a burst roll the pods at most twice.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, post_event, set_deployment_status, timestamp
from harness import NAMESPACE, Cluster, running_operator, scoring_model
from model_checks import args_of, condition, created, model_status
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION
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


async def test_the_scheduling_deadline_is_a_field_of_the_model(operator: Cluster) -> None:
    await created(operator, rollout={"schedulingDeadlineSeconds": 120}, **GPU)
    await pending_gpu_pod(operator, since=300)  # waited longer than this model allows (the default is 600 s)
    await operator.wait_for(lambda: condition(operator, "Degraded") == ("True", "Unschedulable"), timeout=30)
    assert "Insufficient nvidia.com/gpu" in conditions_of(model_status(operator))["Degraded"]["message"]


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
