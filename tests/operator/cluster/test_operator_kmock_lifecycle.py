"""The real operator (kopf, in process) against the emulated API: create, update, ready, degraded, drift, delete."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_actors import add_worker_pod, set_deployment_status
from harness import NAMESPACE, Cluster
from model_checks import CHILDREN, args_of, condition, created, model_status, reached
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
async def test_create_gives_owned_children_with_the_right_args(operator: Cluster) -> None:
    model = await created(operator, replicas=2, scoring={"maxBatchTokens": 4096, "multiItem": {"enabled": True}})
    for plural in (*CHILDREN, "poddisruptionbudgets", "servicemonitors"):
        child = await operator.wait_for(lambda p=plural: operator.get(p, NAMESPACE, "reranker"), what=plural)
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("ScoringModel", model["metadata"]["uid"], True)
    args = args_of(operator.get("deployments", NAMESPACE, "reranker") or {})
    assert args[args.index("--max-batch-tokens") + 1] == "4096" and "--multi-item-scoring" in args
    assert args[args.index("--model") + 1] == "/models/qwen3-reranker"
    status = await operator.wait_for(lambda: model_status(operator).get("endpoint") and model_status(operator))
    assert status["endpoint"] == "http://reranker.ml.svc:8000" and status["workerArgs"] == args
    assert status["observedGeneration"] == 1 and status["phase"] == "Progressing"
    assert condition(operator, "ConfigValid") == ("True", "Valid")
    assert operator.get("horizontalpodautoscalers", NAMESPACE, "reranker") is None


async def test_spec_change_changes_the_pod_template(operator: Cluster) -> None:
    await created(operator)
    before = operator.get("deployments", NAMESPACE, "reranker") or {}
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"scoring": {"maxBatchTokens": 2048}}})

    def rolled() -> dict[str, Any] | None:
        now = operator.get("deployments", NAMESPACE, "reranker") or {}
        return now if "2048" in args_of(now) else None

    after = await operator.wait_for(rolled, what="new args")
    hash_key = ("spec", "template", "metadata", "annotations", CONFIG_HASH_ANNOTATION)
    assert _dig(after, hash_key) != _dig(before, hash_key)
    config = operator.get("configmaps", NAMESPACE, "reranker") or {}
    assert "max_batch_tokens: 2048" in config["data"]["worker.yaml"]
    await operator.wait_for(lambda: model_status(operator).get("observedGeneration") == 2, what="generation 2")


async def test_ready_only_when_the_deployment_reports_ready_replicas(operator: Cluster) -> None:
    await created(operator, replicas=3)
    await set_deployment_status(operator, ready=1)  # 3 wanted, the PDB allows 1 missing: 2 needed
    await reached(operator, Ready=("False", "WaitingForReadyReplicas"), Progressing=("True", "PodsStarting"))
    for pod in ("reranker-a", "reranker-b", "reranker-c"):
        await add_worker_pod(operator, pod)
    await set_deployment_status(operator, ready=3)
    # The pods' watch events and the Deployment's come on different streams: wait for a pass that saw both.
    status = await reached(operator, phase="Ready", Ready=("True", "AllReplicasReady"),
                           ModelLoaded=("True", "WorkerReady"), Progressing=("False", "RolloutComplete"))
    assert status["readyReplicas"] == 3


async def test_crash_looping_pod_makes_it_degraded_with_the_reason(operator: Cluster) -> None:
    await created(operator, replicas=1)
    await add_worker_pod(operator, "reranker-a")
    await set_deployment_status(operator, ready=1)
    await operator.wait_for(lambda: model_status(operator).get("phase") == "Ready", what="Ready first")
    await operator.patch("pods", NAMESPACE, "reranker-a", {"status": {
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "worker", "ready": False, "restartCount": 3,
                               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                               "lastState": {"terminated": {"reason": "Error", "exitCode": 139}}}]}},
        subresource="status")
    await set_deployment_status(operator, ready=0)
    # Degraded comes from the pod, Ready from the Deployment (its watch stream may lag the pod's under load): wait for
    # the status that shows both, not for Degraded alone.
    status = await reached(operator, phase="Degraded", Degraded=("True", "CrashLoopBackOff"),
                           Ready=("False", "CrashLoopBackOff"))
    assert status["lastFailure"]["pod"] == "reranker-a" and status["lastFailure"]["exitCode"] == 139


@pytest.mark.parametrize("plural", CHILDREN)
async def test_a_deleted_child_comes_back(operator: Cluster, plural: str) -> None:
    await created(operator)
    old_uid = (operator.get(plural, NAMESPACE, "reranker") or {})["metadata"]["uid"]
    await operator.delete(plural, NAMESPACE, "reranker")
    back = await operator.wait_for(lambda: operator.get(plural, NAMESPACE, "reranker"), what=f"{plural} recreated")
    assert back["metadata"]["uid"] != old_uid


async def test_drift_on_a_child_is_corrected(operator: Cluster) -> None:
    await created(operator, replicas=2)
    await operator.patch("deployments", NAMESPACE, "reranker", {"spec": {"replicas": 7}})
    await operator.patch("configmaps", NAMESPACE, "reranker", {"data": {"worker.yaml": "model: /elsewhere\n"}})
    await operator.wait_for(lambda: (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]["replicas"] == 2,
                            what="replicas restored")
    await operator.wait_for(lambda: "/elsewhere" not in (operator.get("configmaps", NAMESPACE, "reranker") or {})[
        "data"]["worker.yaml"], what="config restored")


async def test_rollout_restart_is_not_undone(operator: Cluster) -> None:
    await created(operator)
    restarted = {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}
    await operator.patch("deployments", NAMESPACE, "reranker",
                         {"spec": {"template": {"metadata": {"annotations": restarted}}}})
    report = await operator.reconciled()  # a pass that read the restarted Deployment …
    assert not any(write.endswith("Deployment") for write in report.wrote)  # … and left it alone
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"replicas": 3}})  # … and a real apply
    await operator.wait_for(lambda: (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]["replicas"] == 3)
    annotations = (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]["template"]["metadata"][
        "annotations"]
    assert annotations["kubectl.kubernetes.io/restartedAt"] == "2026-01-01T00:00:00Z"


async def test_deleting_the_model_ends_management(operator: Cluster) -> None:
    await created(operator)
    await operator.delete("scoringmodels", NAMESPACE, "reranker")
    for plural in CHILDREN:  # garbage-collected through ownerReferences (the emulator plays kube-controller-manager)
        await operator.wait_for(lambda p=plural: operator.get(p, NAMESPACE, "reranker") is None,  # type: ignore[misc]
                                what=f"{plural} collected")
    # A leftover labelled as ours wakes the operator up for "reranker" again: it must find nothing to manage.
    await operator.create("configmaps", NAMESPACE, {"metadata": {"name": "leftover", "labels": {
        "app.kubernetes.io/managed-by": "scorekeeper-operator", "app.kubernetes.io/instance": "reranker"}}})
    report = await operator.reconciled()  # it did wake up …
    assert report.gone and report.wrote == []  # … and found nothing to manage
    assert all(operator.get(p, NAMESPACE, "reranker") is None for p in CHILDREN)


def _dig(obj: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        obj = obj[key]
    return obj


async def test_a_child_that_loses_the_watched_label_is_relabelled(operator: Cluster) -> None:
    """The watches select on the managed-by label (server-side): a child that loses it leaves the selection, which
    a watch reports as DELETED, and the operator applies it again."""
    await created(operator)
    await operator.patch("configmaps", NAMESPACE, "reranker", {"metadata": {"labels": {
        "app.kubernetes.io/managed-by": None}}})
    await operator.wait_for(lambda: (operator.get("configmaps", NAMESPACE, "reranker") or {})["metadata"]["labels"].get(
        "app.kubernetes.io/managed-by") == "scorekeeper-operator", what="label restored")
