"""Issues 36 and 49: an upgrade wave frees its slots on progress, not on perfection; a slot is held only by a rollout
that has not progressed yet; a wave that cannot move says so on every waiting model, and a wave that moves costs each
waiting model no status write; a model that left the wave (deleted, stopped at an error) holds no one up. The real
operator, restarted as a new release, against the emulator (which plays the Deployment controller, the scheduler, the
cluster-autoscaler and the HPA where the test says so)."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, post_event, set_deployment_status, timestamp
from harness import NAMESPACE, Cluster, running_cluster, running_operator
from scorekeeper_operator.pacing import PACED_ANNOTATION, progressed
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


def degraded(cluster: Cluster, name: str) -> dict[str, Any]:
    return next((c for c in status_of(cluster, name).get("conditions", []) if c["type"] == "Degraded"), {})


async def test_a_stalled_wave_names_the_model_that_holds_the_slot_on_every_waiting_model(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await unschedulable(cluster, holder, since=0)  # within the scheduling deadline: a wait, the slot is held
        waiting = [n for n in MODELS if n != holder]
        named = f"{NAMESPACE}/{holder} holds one and is held up (PodsUnschedulable)"
        for name in waiting:  # the holder and its reason, not its whole Ready message
            await cluster.wait_for(lambda n=name: named in wave_condition(cluster, n).get(  # type: ignore[misc]
                "message", ""), timeout=WAIT, what=f"{name} naming the stall")
            found = wave_condition(cluster, name)
            assert (found["status"], found["reason"]) == ("True", "WaitingForRolloutSlot")
            assert "Insufficient nvidia.com/gpu" not in found["message"]
            progressing = next(c for c in status_of(cluster, name)["conditions"] if c["type"] == "Progressing")
            assert progressing["reason"] != "RolloutComplete"
        assert image_of(cluster, holder) == NEW and all(image_of(cluster, n) == OLD for n in waiting)
        assert wave_condition(cluster, holder) == {}  # the holder itself waits for nothing


async def test_a_model_that_cannot_be_placed_frees_its_slot(cluster: Cluster) -> None:
    """Unschedulable, at once (the cluster-autoscaler says no node can come) as past the scheduling deadline
    (test_operator_kmock_waits.py waits for that one): the model has failed, for want of room."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await unschedulable(cluster, holder, since=0)
        pod = cluster.get("pods", NAMESPACE, f"{holder}-new") or {}
        await post_event(cluster, pod, "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size"
                         " reached", kind="Normal")
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the wave moving on")
        await cluster.wait_for(lambda: degraded(cluster, holder).get("reason") == "Unschedulable", timeout=WAIT,
                               what="the holder saying why it freed its slot")


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


async def test_a_holder_waiting_for_a_node_past_its_progress_deadline_frees_its_slot(cluster: Cluster) -> None:
    """Karpenter keeps nominating a node that never comes (a NodeProvisioning wait has no deadline of ours), and the
    Deployment passes its progress deadline: the rollout failed for want of room, like Unschedulable."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        await unschedulable(cluster, holder, since=0)
        pod = cluster.get("pods", NAMESPACE, f"{holder}-new") or {}
        await post_event(cluster, pod, "Nominated", "Pod should schedule on: nodeclaim/gpu-7x2kq", kind="Normal")
        await set_deployment_status(cluster, ready=0, model=holder, conditions=[{
            "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
            "message": f'ReplicaSet "{holder}-5d8f" has timed out progressing.'}])
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the wave moving on")
        await cluster.wait_for(lambda: degraded(cluster, holder).get("reason") == "Unschedulable", timeout=WAIT,
                               what="the holder saying why it freed its slot")
        assert "progress deadline" in degraded(cluster, holder)["message"]
        assert "nodeclaim/gpu-7x2kq" in degraded(cluster, holder)["message"]


async def test_a_finished_rollout_that_loses_ready_pods_takes_no_slot_again(cluster: Cluster) -> None:
    """A drain after the first model's rollout progressed leaves it short of pods: it rolls nothing, so the third
    model's turn comes when the second's rollout progresses (with one slot)."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (first,) = upgrading(cluster)
        await set_deployment_status(cluster, ready=1, model=first)  # progressed: the slot frees
        await cluster.wait_for(lambda: PACED_ANNOTATION not in paced(cluster, first), timeout=WAIT,
                               what="the progress recorded on the Deployment")
        await cluster.wait_for(lambda: sum(image_of(cluster, n) == NEW for n in MODELS) == 2, timeout=WAIT,
                               what="the second model's turn")
        (second,) = upgrading(cluster)
        await set_deployment_status(cluster, ready=0, model=first)  # a node drain takes its pod
        await cluster.wait_for(lambda: status_of(cluster, first).get("readyReplicas") == 0, timeout=WAIT,
                               what="the drain seen")
        await set_deployment_status(cluster, ready=1, model=second)
        await cluster.wait_for(lambda: all(image_of(cluster, n) == NEW for n in MODELS), timeout=WAIT,
                               what="the third model's turn")


def paced(cluster: Cluster, name: str) -> dict[str, str]:
    return dict((cluster.get("deployments", NAMESPACE, name) or {})["metadata"].get("annotations") or {})


@pytest.mark.parametrize("leaves", ["deleted", "invalid"])
async def test_a_waiting_model_that_leaves_the_wave_holds_no_one_up(cluster: Cluster, leaves: str) -> None:
    """The model at the head of the queue is deleted, or a spec edit the operator refuses (InvalidSpec) stops its
    passes before they decide: when the slot frees, the model behind it takes it."""
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *MODELS)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        await settled(cluster, on_new=1)
        (holder,) = upgrading(cluster)
        head, behind = [name for _, name in cluster.memo.reconciler.pacer.waiting]  # type: ignore[union-attr]
        if leaves == "deleted":
            await cluster.delete("scoringmodels", NAMESPACE, head)
            await cluster.wait_for(lambda: any(p.key == (NAMESPACE, head) and p.gone for p in cluster.passes),
                                   timeout=WAIT, what=f"{head} seen gone")
        else:  # the API takes it (CEL cannot see an abbreviated flag); the operator refuses it
            await cluster.patch("scoringmodels", NAMESPACE, head, {"spec": {"extraArgs": ["--served", "x"]}})
            await cluster.wait_for(lambda: any(c["type"] == "ConfigValid" and c["reason"] == "InvalidSpec"
                                               for c in status_of(cluster, head).get("conditions", [])),
                                   timeout=WAIT, what=f"{head} stopped at InvalidSpec")
        await set_deployment_status(cluster, ready=1, model=holder)
        await cluster.wait_for(lambda: image_of(cluster, behind) == NEW, timeout=WAIT, what=f"{behind}'s turn")


def status_writes(cluster: Cluster, since: int) -> int:
    return sum(1 for c in cluster.emulator.calls[since:] if c.resource == "scoringmodels" and c.subresource == "status")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("count", [12, 24])
async def test_status_writes_per_wave_grow_with_the_number_of_models_not_its_square(count: int) -> None:
    """A waiting model hears of the wave only when a holder is held up, or stops being: while holders move, what it
    says does not change. So a wave costs each model a few writes (waiting, rolling, rolled), not one per step.
    (No ServiceMonitor API: fewer requests for the emulator, which matches each against its whole log.)"""
    names = [f"model-{index:02d}" for index in range(count)]
    async with running_cluster(service_monitor_api=False, keda_api=False) as cluster:
        await _wave(cluster, names)


async def _wave(cluster: Cluster, names: list[str]) -> None:
    count = len(names)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": OLD}):
        await serving(cluster, *names)
    before = len(cluster.emulator.calls)
    async with running_operator(cluster, env={"SCOREKEEPER_WORKER_IMAGE": NEW}):
        for step in range(1, count + 1):
            # The first model moves once the new operator's first passes are done: one per model, all reading fresh
            # (through the API client's few threads), so that ceiling grows with the count (a loaded CI box is slow).
            ceiling = WAIT + 10.0 * count if step == 1 else WAIT
            await cluster.wait_for(lambda s=step: sum(image_of(cluster, n) == NEW for n in names) == s,  # type: ignore[misc]
                                   timeout=ceiling, what=f"{step} models on the new image")
            for name in names:
                deployment = cluster.get("deployments", NAMESPACE, name) or {}
                if image_of(cluster, name) == NEW and not progressed(deployment):
                    await set_deployment_status(cluster, ready=1, model=name)
        await cluster.wait_for(lambda: not any(status_of(cluster, n).get("pendingWorkerImage") for n in names)
                               and all(status_of(cluster, n).get("readyReplicas") == 1 for n in names),
                               timeout=WAIT, what="the wave done")
        await cluster.reconciled(names[-1], timeout=WAIT)
    writes = status_writes(cluster, before)
    assert writes <= 4 * count, writes
