"""Status during real operations, through the real operator: what issue 15 found flapping, hidden or generic.

Kubelet, the scheduler, the Deployment and HPA controllers and the cluster-autoscaler are played by cluster_actors.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, post_event, set_deployment_status, set_pod_status, timestamp
from harness import NAMESPACE, Cluster
from model_checks import condition, created, model_status, reached

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
LOAD_ERROR = ("model /models/qwen3-reranker cannot be loaded: config.json declares architecture Qwen3ForCausalLM,"
              " which this worker does not support (supported: BertModel, LlamaForCausalLM, Qwen2ForCausalLM).")


def ready_history(cluster: Cluster) -> list[str]:
    """The Ready condition's status in every version of the ScoringModel, oldest first (what watchers saw)."""
    found = []
    for version in cluster.versions("scoringmodels", NAMESPACE, "reranker"):
        ready = next((c for c in (version.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)
        if ready is not None:
            found.append(ready["status"])
    return found


async def serving(cluster: Cluster, replicas: int, **spec: Any) -> None:
    await created(cluster, replicas=replicas, **spec)
    for index in range(replicas):
        await add_worker_pod(cluster, f"reranker-{index}", ready_since=timestamp(3600))
    await set_deployment_status(cluster, ready=replicas)
    await cluster.wait_for(lambda: condition(cluster, "Ready") == ("True", "AllReplicasReady"), what="Ready")


async def test_a_model_load_failure_is_degraded_with_the_workers_own_message(operator: Cluster) -> None:
    await created(operator, replicas=1)
    container = operator.get("deployments", NAMESPACE, "reranker")["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The first restart: the worker wrote its reason to /dev/termination-log and exited 3; kubelet started it again.
    await add_worker_pod(operator, "reranker-0", ready=False, ready_since=timestamp(120), containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 1, "state": {"running": {"startedAt": timestamp(2)}},
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": LOAD_ERROR,
                                     "startedAt": timestamp(60), "finishedAt": timestamp(3)}}}])
    status = await reached(operator, phase="Degraded", Degraded=("True", "ModelLoadFailed"),
                           ModelLoaded=("False", "ModelLoadFailed"))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == f"reranker-0: {LOAD_ERROR}"
    assert status["lastFailure"]["message"] == LOAD_ERROR and status["lastFailure"]["exitCode"] == 3


async def test_hpa_scale_up_onto_a_node_being_added_keeps_ready(operator: Cluster) -> None:
    """Issue 25: a GPU node takes longer than 600 s to come; the autoscaler says it is adding one: no Degraded."""
    await serving(operator, 2, autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    before = len(ready_history(operator))
    await operator.patch("deployments", NAMESPACE, "reranker", {"spec": {"replicas": 4}})  # the HPA scales up
    await set_deployment_status(operator, ready=2)  # the ReplicaSet made two pods; no node has room for them yet
    for name in ("reranker-2", "reranker-3"):
        pod = await add_worker_pod(operator, name, ready=False, phase="Pending", conditions=[{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": timestamp(900),
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
        await post_event(operator, pod, "TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 3->4 (max: 8)}]",
                         kind="Normal", seconds_ago=890)
    # The pods (their waits) and the Deployment (its counts) come on different streams: one status with both.
    await operator.wait_for(lambda: "NodeProvisioning" in next(
        c["message"] for c in model_status(operator)["conditions"] if c["type"] == "Progressing")
        and condition(operator, "Progressing") == ("True", "PodsStarting"), what="provisioning")
    await reached(operator, phase="Ready", Progressing=("True", "PodsStarting"), Degraded=("False", "Healthy"))
    await operator.reconciled()
    assert set(ready_history(operator)[before:]) == {"True"}  # never False, in any status the operator wrote


async def test_one_pod_restarting_keeps_ready(operator: Cluster) -> None:
    await serving(operator, 2)
    before = len(ready_history(operator))
    await set_pod_status(operator, "reranker-1", ready=False, ready_since=timestamp(), containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 1, "state": {"running": {"startedAt": timestamp()}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": timestamp(3600),
                                     "finishedAt": timestamp()}}}])
    await set_deployment_status(operator, ready=1)
    await reached(operator, Progressing=("True", "PodsStarting"), Ready=("True", "MinimumReplicasAvailable"),
                  Degraded=("False", "Healthy"))
    await set_pod_status(operator, "reranker-1", ready=True, ready_since=timestamp())
    await set_deployment_status(operator, ready=2)
    await operator.wait_for(lambda: condition(operator, "Ready") == ("True", "AllReplicasReady"), what="back")
    assert set(ready_history(operator)[before:]) == {"True"}


@pytest.mark.parametrize(("reason", "message", "expected"), [
    ("FailedAttachVolume", 'Multi-Attach error for volume "pvc-8d1" Volume is already used by pod(s) reranker-0',
     "MultiAttach"),
    ("FailedMount", "MountVolume.SetUp failed for volume \"model\" : persistentvolumeclaim \"models\" not found",
     "FailedMount"),
])
async def test_volume_failures_reach_the_status_from_the_pods_events(operator: Cluster, reason: str, message: str,
                                                                     expected: str) -> None:
    await serving(operator, 1)
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 2}})
    await operator.wait_for(lambda: operator.get("deployments", NAMESPACE, "reranker")["spec"]["replicas"] == 2)
    pod = await add_worker_pod(operator, "reranker-1", ready=False, phase="Pending", containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}])
    await set_deployment_status(operator, ready=1)
    await operator.wait_for(lambda: "reranker-1: ContainerCreating" in next(
        c["message"] for c in model_status(operator)["conditions"] if c["type"] == "Progressing"), what="creating")
    # Nothing about the pod changes: only an Event says why. The operator polls the Events of pods on their way.
    await post_event(operator, pod, reason, message)
    await operator.wait_for(lambda: condition(operator, "Degraded") == ("True", expected), what=expected)
    assert model_status(operator)["lastFailure"]["message"] == message


@pytest.mark.parametrize(("pod_reason", "expected"), [("Evicted", "Evicted"),
                                                      ("UnexpectedAdmissionError", "UnexpectedAdmissionError")])
async def test_pods_the_kubelet_threw_out_are_reported(operator: Cluster, pod_reason: str, expected: str) -> None:
    await serving(operator, 1)
    await set_pod_status(operator, "reranker-0", ready=False, phase="Failed", reason=pod_reason,
                         message="The node was low on resource: memory." if pod_reason == "Evicted"
                         else "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices")
    await set_deployment_status(operator, ready=0)
    await reached(operator, Degraded=("True", expected), Ready=("False", expected))


async def test_a_startup_probe_timeout_is_named(operator: Cluster) -> None:
    await created(operator, replicas=1)
    pod = await add_worker_pod(operator, "reranker-0", ready=False, ready_since=timestamp(4000), containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 1, "state": {"running": {"startedAt": timestamp()}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": timestamp(1900),
                                     "finishedAt": timestamp(1)}}}])
    await post_event(operator, pod, "Killing", "Container worker failed startup probe, will be restarted",
                     kind="Normal")
    await operator.wait_for(lambda: condition(operator, "Degraded") == ("True", "StartupProbeTimeout"), what="timeout")


async def test_a_failing_autoscaler_is_a_condition_of_the_model(operator: Cluster) -> None:
    await serving(operator, 2, autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    await operator.patch("horizontalpodautoscalers", NAMESPACE, "reranker", {"status": {
        "currentReplicas": 2, "desiredReplicas": 2, "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
            {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
             "message": "unable to get metric scorekeeper_queue_depth: no custom metrics API"}]}},
        subresource="status")
    await operator.wait_for(lambda: condition(operator, "Autoscaling") == ("False", "FailedGetPodsMetric"))
    assert condition(operator, "Ready") == ("True", "AllReplicasReady")  # it still serves what it has


async def test_non_canonical_quantities_are_applied_once(operator: Cluster) -> None:
    """Issue 15: `0.5` and `1.5Gi` read back as `500m` and `1536Mi` and were re-applied on every event."""
    await created(operator, replicas=1, resources={"cpu": "0.5", "memory": "1.5Gi"})
    stored = operator.get("deployments", NAMESPACE, "reranker")["spec"]["template"]["spec"]["containers"][0]
    # The ephemeral-storage request (tmp + caches, rendered as 5120Mi) is stored canonically too.
    assert stored["resources"] == {"requests": {"cpu": "500m", "memory": "1536Mi", "ephemeral-storage": "5Gi"},
                                   "limits": {"memory": "1536Mi"}}
    await add_worker_pod(operator, "reranker-0")
    await set_deployment_status(operator, ready=1)  # events on the Deployment and its pod: passes, no applies
    await reached(operator, Ready=("True", "AllReplicasReady"), ModelLoaded=("True", "WorkerReady"))  # both seen
    report = await operator.reconciled()
    assert report.wrote == []
    applies = [c for c in operator.emulator.calls if c.resource == "deployments" and c.verb == "patch"]
    assert len(applies) == 1  # the apply that created it; none since
