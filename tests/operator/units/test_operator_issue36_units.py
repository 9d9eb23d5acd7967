"""Issue 36, the pure parts: GPU rollout strategy, /dev/shm, the download init container's exit, waits named at
once, Ready under a configuration error, slots that free on progress, adoption."""

from __future__ import annotations

from typing import Any

import pytest
from harness import NAMESPACE
from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.children import adoptable
from scorekeeper_operator.pacing import PACED_ANNOTATION, PACED_CAPACITY_ANNOTATION, Pacer, progressed
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, MANAGED_BY
from scorekeeper_operator.status.compute import ConfigError, Observed
from spec_helpers import deployment_of, model_from
from status_fixtures import assess, at, conditions, desired, event, message, pod, rendered, rolled, unscheduled

NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_gpu_models_with_more_than_one_replica_replace_pods_without_a_spare_gpu() -> None:
    """maxSurge 1 would need a spare GPU for every rollout; with none free, the rollout deadlocks."""
    for spec in ({"replicas": 2}, {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}}):
        strategy = deployment_of(resources={"gpu": {"count": 1}}, **spec)["spec"]["strategy"]
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def shm(**spec: Any) -> str:
    volumes = deployment_of(**spec)["spec"]["template"]["spec"]["volumes"]
    size: str = next(v for v in volumes if v["name"] == "shm")["emptyDir"]["sizeLimit"]
    return size


@pytest.mark.parametrize(("spec", "size"), [
    ({}, "1Gi"),  # CPU
    ({"resources": {"gpu": {"count": 1}}}, "1Gi"),  # 8192 batch tokens x 128Ki
    ({"resources": {"gpu": {"count": 1}}, "scoring": {"maxBatchTokens": 32768}}, "4Gi"),
    ({"resources": {"gpu": {"count": 1}}, "scoring": {"maxBatchTokens": 12000}}, "1500Mi"),
    ({"resources": {"gpu": {"count": 1}, "shmSize": "6Gi"}}, "6Gi"),
    ({"resources": {"shmSize": 2}}, "2"),
    # issue 49: the floor on a GPU, the CPU size whatever the batch, a size asked for below the floor
    ({"resources": {"gpu": {"count": 1}}, "scoring": {"maxBatchTokens": 2048}}, "1Gi"),  # 256Mi, raised to 1Gi
    ({"scoring": {"maxBatchTokens": 32768}}, "1Gi"),  # CPU: the batch lives in the process, not in /dev/shm
    ({"resources": {"shmSize": "512Mi"}}, "512Mi"),  # below the floor is the user's call
])
def test_shm_size_is_a_field_defaulting_to_the_gpu_batch(spec: dict[str, Any], size: str) -> None:
    assert shm(**spec) == size


def test_the_scheduling_deadline_is_in_the_progress_deadline() -> None:
    assert deployment_of(rollout={"maxStartupSeconds": 600, "schedulingDeadlineSeconds": 120})[
        "spec"]["progressDeadlineSeconds"] == 720


def test_a_failing_download_names_its_exit_code_and_message() -> None:
    r = rendered(model={"uri": "hf://org/name", "revision": "0123456789abcdef0123456789abcdef01234567"}, replicas=1)
    failed = pod("a", r.config_hash, ready=False, phase="Pending", initContainerStatuses=[{
        "name": "download-model", "ready": False, "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": at(5),
                                     "message": "org/name@0123456 has no config.json"}}}])
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [failed])).status
    assert conditions(status)["Degraded"] == ("True", "ModelDownloadFailed")
    assert "exited with code 1" in message(status, "Degraded") and "no config.json" in message(status, "Degraded")


def test_an_unplaceable_pod_is_named_at_once_and_says_the_model_is_down() -> None:
    r = rendered(replicas=1)
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [unscheduled("a", r.config_hash,
                                                                                      at(5), NO_GPU)])).status
    assert conditions(status)["Ready"] == ("False", "PodsUnschedulable")
    assert conditions(status)["Available"] == ("False", "PodsUnschedulable")
    assert "down" in message(status, "Ready") and NO_GPU in message(status, "Ready")
    assert conditions(status)["Degraded"] == ("False", "Healthy")


def test_karpenter_nominated_is_a_node_on_its_way() -> None:
    r = rendered(replicas=1)
    events = {"a": [event("Nominated", "Pod should schedule on: nodeclaim/gpu-1", kind="Normal")]}
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [unscheduled("a", r.config_hash, at(900))],
                                            events)).status
    assert conditions(status)["Ready"] == ("False", "NodeProvisioning") and "nodeclaim/gpu-1" in message(
        status, "Ready")
    assert conditions(status)["Degraded"] == ("False", "Healthy")  # no deadline of ours while a node comes


def test_ready_follows_available_under_a_configuration_error() -> None:
    r = rendered(replicas=1)
    refused = ConfigError("QuotaExceeded", "the API refused to apply NetworkPolicy reranker (HTTP 403): quota")
    status = assess(desired(r, 1, error=refused), Observed(rolled(r.config_hash, 1, 1))).status
    found = conditions(status)
    assert found["Ready"] == ("True", "AllReplicasReady") and status["phase"] == "Degraded"
    assert found["ConfigValid"] == ("False", "QuotaExceeded") and found["ChildrenReady"] == ("False", "QuotaExceeded")
    down = assess(desired(r, 1, error=refused), Observed(rolled(r.config_hash, 1, 0))).status
    assert conditions(down)["Ready"] == ("False", "QuotaExceeded") and down["phase"] == "Failed"
    invalid = assess(desired(None, 1, error=ConfigError("InvalidSpec", "no")), Observed(rolled("x", 1, 1))).status
    assert conditions(invalid)["Ready"][0] == "True" and conditions(invalid)["ChildrenReady"][0] == "Unknown"


def paced(name: str, *, want: int, capacity: int, total: int, updated: int, ready: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE, "generation": 3,
                         "annotations": {PACED_ANNOTATION: "h", PACED_CAPACITY_ANNOTATION: str(capacity)}},
            "spec": {"replicas": want, "template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: "h"}}}},
            "status": {"observedGeneration": 3, "replicas": total, "updatedReplicas": updated, "readyReplicas": ready}}


@pytest.mark.parametrize(("deployment", "expected"), [
    (paced("a", want=3, capacity=1, total=3, updated=3, ready=2), True),  # the HPA wants one more than fits
    (paced("a", want=2, capacity=2, total=2, updated=1, ready=1), False),  # the one ready pod is the old one
    (paced("a", want=2, capacity=2, total=2, updated=2, ready=2), True),
    (paced("a", want=1, capacity=1, total=1, updated=1, ready=0), False),  # the new pod cannot be placed
])
def test_a_slot_frees_on_progress(deployment: dict[str, Any], expected: bool) -> None:
    assert progressed(deployment) is expected


def test_a_model_that_failed_for_want_of_room_frees_its_slot_and_the_wait_names_the_holder() -> None:
    cache = WatchCache()
    holder = paced("alpha", want=1, capacity=1, total=1, updated=1, ready=0)
    cache.put("deployments", holder)
    pacer = Pacer(1, cache)
    pacer.report((NAMESPACE, "alpha"), holder, "", "PodsUnschedulable")
    assert "ml/alpha holds one and is held up (PodsUnschedulable)" in pacer.wait_note() and pacer.next_up() == []
    assert pacer.news() is True
    pacer.report((NAMESPACE, "alpha"), holder, "", "PodsUnschedulable")
    assert pacer.news() is False  # nothing new
    pacer.waiting[(NAMESPACE, "bravo")] = None
    pacer.report((NAMESPACE, "alpha"), holder, "Unschedulable", "Unschedulable")
    assert pacer.next_up() == [(NAMESPACE, "bravo")] and pacer.news() is True
    pacer.report((NAMESPACE, "alpha"), holder, "CrashLoopBackOff", "CrashLoopBackOff")
    assert pacer.news() is False and "alpha" not in pacer.wait_note()  # no longer in a slot


def test_a_child_is_adoptable_only_from_an_older_scoring_model_of_the_same_name() -> None:
    model = model_from()
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/instance": "reranker"}
    owner = {"kind": "ScoringModel", "name": "reranker", "uid": "old"}

    def child(meta: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "reranker", "labels": labels, "ownerReferences": [owner], **meta}}

    assert adoptable(child({}), model)
    assert not adoptable(child({"ownerReferences": [{**owner, "uid": "u"}]}), model)  # already ours
    assert not adoptable(child({"ownerReferences": [{**owner, "name": "other"}]}), model)
    assert not adoptable(child({"ownerReferences": [owner, {"kind": "Deployment", "name": "x", "uid": "z"}]}), model)
    assert not adoptable(child({"labels": {}}), model)  # a user's object of that name
    assert not adoptable(child({"ownerReferences": []}), model)
