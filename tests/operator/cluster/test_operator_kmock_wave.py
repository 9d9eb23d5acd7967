"""Issue 36: an upgrade wave frees its slots on progress, not on perfection, and a wave that cannot move says so on
every waiting model. The real operator, restarted as a new release, against the emulator (which plays the
Deployment controller, the scheduler and the HPA where the test says so)."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, set_deployment_status, timestamp
from harness import NAMESPACE, Cluster, running_operator
from test_operator_kmock_upgrade import MODELS, NEW, OLD, WAIT, image_of, serving, settled, status_of, upgrading

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(400)]
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def wave_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    return next((c for c in status_of(cluster, name).get("conditions", []) if c["type"] == "UpgradePending"), {})


async def unschedulable(cluster: Cluster, name: str, since: float) -> None:
    """The new pod of `name`'s rollout cannot be placed (its old one is gone: Recreate)."""
    await set_deployment_status(cluster, ready=0, model=name)
    await add_worker_pod(cluster, f"{name}-new", name, ready=False, phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_GPU,
        "lastTransitionTime": timestamp(since)}])


async def test_a_stalled_wave_names_the_model_that_holds_the_slot_on_every_waiting_model(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await unschedulable(cluster, holder, since=0)  # within the scheduling deadline: a wait, the slot is held
        waiting = [n for n in MODELS if n != holder]
        for name in waiting:
            await cluster.wait_for(lambda n=name: "Insufficient nvidia.com/gpu" in wave_condition(  # type: ignore[misc]
                cluster, n).get("message", ""), timeout=WAIT, what=f"{name} naming the stall")
            found = wave_condition(cluster, name)
            assert (found["status"], found["reason"]) == ("True", "WaitingForRolloutSlot")
            assert f"{NAMESPACE}/{holder}" in found["message"]
            progressing = next(c for c in status_of(cluster, name)["conditions"] if c["type"] == "Progressing")
            assert progressing["reason"] != "RolloutComplete"
        assert image_of(cluster, holder) == NEW and all(image_of(cluster, n) == OLD for n in waiting)
        assert wave_condition(cluster, holder) == {}  # the holder itself waits for nothing


async def test_a_model_that_cannot_be_placed_past_its_deadline_frees_its_slot(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS, rollout={"schedulingDeadlineSeconds": 60})
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await unschedulable(cluster, holder, since=120)  # past its deadline: the model has failed, for want of room
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the wave moving on")
        degraded = next(c for c in status_of(cluster, holder)["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")


async def test_an_autoscaled_model_that_wants_one_pod_more_than_fits_frees_its_slot(cluster: Cluster) -> None:
    """Its HPA wants 3 GPU pods, the cluster places 2: the new configuration serves its minReplicas (and more), so
    the rollout has progressed; perfection (every wanted pod ready) would hold the slot forever."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS, autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 4})
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await cluster.patch("deployments", NAMESPACE, holder, {"spec": {"replicas": 3}})  # the HPA's count
        deployment = cluster.get("deployments", NAMESPACE, holder) or {}
        await cluster.patch("deployments", NAMESPACE, holder, {"status": {
            "observedGeneration": deployment["metadata"]["generation"], "replicas": 3, "updatedReplicas": 3,
            "readyReplicas": 2, "availableReplicas": 2}}, subresource="status")
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the wave moving on")
