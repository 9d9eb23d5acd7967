"""Every failure issue 15 lists gets its own Degraded reason, read from pod status and the pod's Events."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from scorekeeper_operator.status.compute import SCHEDULING_DEADLINE_SECONDS, Observed
from status_fixtures import (
    NOW,
    assess,
    at,
    conditions,
    desired,
    event,
    message,
    pod,
    rendered,
    rolled,
    unscheduled,
    worker,
)

LOAD_ERROR = ("model /models/qwen3-reranker cannot be loaded: config.json declares architecture Qwen3ForCausalLM,"
              " which this worker does not support (supported: BertModel, LlamaForCausalLM, Qwen2ForCausalLM).")


def degraded(pods: list[dict[str, Any]], *, want: int = 1, ready: int = 0,
             events: dict[str, list[dict[str, Any]]] | None = None,
             seen: dict[str, datetime] | None = None) -> tuple[tuple[str, str], dict[str, Any]]:
    """`seen`: when the operator first saw each pod wait to be placed (absent: now)."""
    r = rendered(replicas=want)
    status = assess(desired(r, want), Observed(rolled(r.config_hash, want, ready), pods, events or {},
                                               unplaced_since=seen or {})).status
    return conditions(status)["Degraded"], status


def _hash() -> str:
    return rendered(replicas=1).config_hash


@pytest.mark.parametrize("state", [
    {"running": {"startedAt": at(5)}},  # the first restart: loading again
    {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
])
def test_a_model_load_failure_is_degraded_with_the_workers_termination_message(state: dict[str, Any]) -> None:
    failed = pod("a", _hash(), ready=False, ready_since=at(400), containerStatuses=[worker(state=state, last={
        "exitCode": 3, "reason": "Error", "message": LOAD_ERROR, "startedAt": at(300), "finishedAt": at(250)})])
    reason, status = degraded([failed])
    assert reason == ("True", "ModelLoadFailed")
    assert message(status, "Degraded") == f"a: {LOAD_ERROR}"
    assert conditions(status)["Ready"] == ("False", "ModelLoadFailed")
    assert conditions(status)["ModelLoaded"] == ("False", "ModelLoadFailed")
    assert message(status, "ModelLoaded") == LOAD_ERROR
    assert status["lastFailure"] == {"reason": "ModelLoadFailed", "pod": "a", "container": "worker", "exitCode": 3,
                                     "time": at(250), "message": LOAD_ERROR}


@pytest.mark.parametrize(("exit_code", "expected", "meaning"), [
    (2, "InvalidWorkerConfig", "the worker refused its configuration"),  # argparse: a usage error
    (1, "WorkerCrashed", "the worker exited with code 1"),  # an unexpected exception
])
def test_only_exit_code_3_is_a_model_load_failure(exit_code: int, expected: str, meaning: str) -> None:
    """The worker reserves exit status 3 for "this model cannot be served" (api/termination.py)."""
    log_tail = "scorekeeper-worker: error: argument --threads: invalid value" if exit_code == 2 else "Traceback …"
    failed = pod("a", _hash(), ready=False, containerStatuses=[worker(last={
        "exitCode": exit_code, "reason": "Error", "message": log_tail, "startedAt": at(60), "finishedAt": at(50)})])
    reason, status = degraded([failed])
    assert reason == ("True", expected)
    assert meaning in message(status, "Degraded") and log_tail in message(status, "Degraded")
    assert conditions(status)["ModelLoaded"][1] != "ModelLoadFailed"


def test_a_terminated_worker_not_yet_restarted_counts_too() -> None:
    failed = pod("a", _hash(), ready=False, containerStatuses=[worker(restarts=0, state={"terminated": {
        "exitCode": 3, "reason": "Error", "message": "  self-check failed:\n scores not finite  "}})])
    reason, status = degraded([failed])
    assert reason == ("True", "ModelLoadFailed")
    assert message(status, "Degraded") == "a: self-check failed: scores not finite"


def test_a_crash_after_serving_is_one_restart_not_a_load_failure() -> None:
    crashed = pod("a", _hash(), ready=False, ready_since=at(30), containerStatuses=[worker(last={
        "exitCode": 1, "reason": "Error", "message": "Traceback …", "startedAt": at(7200), "finishedAt": at(30)})])
    assert degraded([crashed, pod("b", _hash())], want=2, ready=1)[0] == ("False", "Healthy")


@pytest.mark.parametrize(("events", "run_seconds"), [
    ([event("Killing", "Container worker failed startup probe, will be restarted")], 60),  # kubelet says so
    ([], 1800),  # the Events expired: a kill after the whole startup budget says the same
])
def test_a_startup_probe_timeout_has_its_reason(events: list[dict[str, Any]], run_seconds: int) -> None:
    killed = pod("a", _hash(), ready=False, ready_since=at(4000), containerStatuses=[worker(last={
        "exitCode": 137, "reason": "Error", "startedAt": at(run_seconds + 10), "finishedAt": at(10)})])
    reason, status = degraded([killed], events={"a": events})
    assert reason == ("True", "StartupProbeTimeout") and "rollout.maxStartupSeconds (1800s)" in message(
        status, "Degraded")


@pytest.mark.parametrize(("reason", "message_text", "expected"), [
    ("FailedAttachVolume", 'Multi-Attach error for volume "pvc-1" Volume is already used by pod(s) reranker-a',
     "MultiAttach"),
    ("FailedAttachVolume", "AttachVolume.Attach failed for volume pvc-1: rpc error", "FailedAttachVolume"),
    ("FailedMount", "MountVolume.SetUp failed for volume model: persistentvolumeclaim models not found",
     "FailedMount"),
])
def test_volume_failures_come_from_the_pods_events(reason: str, message_text: str, expected: str) -> None:
    creating = pod("b", _hash(), ready=False, phase="Pending", containerStatuses=[worker(
        restarts=0, state={"waiting": {"reason": "ContainerCreating"}})])
    found, status = degraded([creating, pod("a", _hash())], want=2, ready=1,
                             events={"b": [event("Scheduled", "assigned", 300, "Normal"), event(reason, message_text)]})
    assert found == ("True", expected) and message(status, "Degraded") == f"b: {message_text}"


def test_old_mount_events_do_not_outlive_the_mount() -> None:
    loading = pod("b", _hash(), ready=False, containerStatuses=[worker(restarts=0)])
    events = {"b": [event("FailedMount", "MountVolume.SetUp failed: timed out", 120)]}
    assert degraded([loading], events=events)[0] == ("False", "Healthy")


@pytest.mark.parametrize(("pod_reason", "expected"), [("Evicted", "Evicted"),
                                                      ("UnexpectedAdmissionError", "UnexpectedAdmissionError"),
                                                      ("OutOfnvidia.com/gpu", "PodFailed")])
def test_pods_the_kubelet_threw_out_degrade_while_capacity_is_short(pod_reason: str, expected: str) -> None:
    gone = pod("a", _hash(), ready=False, phase="Failed", reason=pod_reason, message=f"{pod_reason}: node says no",
               startTime=at(600))
    replacement = pod("b", _hash(), ready=False, containerStatuses=[worker(restarts=0)])
    found, status = degraded([gone, replacement])
    assert found == ("True", expected) and pod_reason in message(status, "Degraded")
    r = rendered(replicas=1)
    healed = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 1), [gone, pod("b", r.config_hash)]),
                    status).status
    assert conditions(healed)["Degraded"] == ("False", "Healthy") and conditions(healed)["Ready"][0] == "True"
    assert healed["lastFailure"]["reason"] == expected  # history


def test_an_eviction_long_ago_is_history_during_a_scale_up() -> None:
    """Evicted pods stay behind (phase Failed) until the pod garbage collector's threshold: one from yesterday says
    nothing about today's scale-up, whose new pods are simply loading."""
    yesterday = pod("old", _hash(), ready=False, phase="Failed", reason="Evicted", message="low on memory",
                    startTime=at(26 * 3600), ready_since=at(24 * 3600))
    loading = pod("c", _hash(), ready=False, containerStatuses=[worker(restarts=0)])
    found, status = degraded([yesterday, pod("a", _hash()), pod("b", _hash()), loading], want=3, ready=2)
    assert found == ("False", "Healthy") and status["phase"] == "Ready"  # 2 of 3 serve: available
    assert conditions(status)["Progressing"] == ("True", "PodsStarting") and "lastFailure" not in status


def test_a_recent_eviction_becomes_history_once_a_replacement_could_have_started() -> None:
    """Current while a replacement may still be on its way (the startup budget plus the scheduling deadline);
    after that it is history, and the operator looks again at that moment (nothing else would announce it)."""
    window = 1800 + SCHEDULING_DEADLINE_SECONDS
    evicted = pod("old", _hash(), ready=False, phase="Failed", reason="Evicted", message="low on memory",
                  startTime=at(7200), ready_since=at(100))
    loading = pod("b", _hash(), ready=False, containerStatuses=[worker(restarts=0)])
    r = rendered(replicas=1)
    assessment = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [evicted, loading]))
    assert conditions(assessment.status)["Degraded"] == ("True", "Evicted")
    assert assessment.recheck_in == pytest.approx(window - 100)
    later = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [evicted, loading]), assessment.status,
                   NOW + timedelta(seconds=window))
    assert conditions(later.status)["Degraded"] == ("False", "Healthy")
    assert later.status["lastFailure"]["reason"] == "Evicted"  # remembered


def test_one_oom_kill_of_a_pod_that_served_is_a_restart() -> None:
    """Killed for memory under load, restarted, loading again: one restart, like any other, while Ready holds."""
    restarted = pod("b", _hash(), ready=False, ready_since=at(20), containerStatuses=[worker(
        last={"exitCode": 137, "reason": "OOMKilled", "startedAt": at(3600), "finishedAt": at(20)})])
    found, status = degraded([pod("a", _hash()), restarted], want=2, ready=1)
    assert found == ("False", "Healthy") and status["phase"] == "Ready"
    assert conditions(status)["Ready"][0] == "True" and "b: Restarting" in message(status, "Progressing")


def test_an_oom_kill_while_loading_is_a_failure() -> None:
    """Killed before it ever served: the model does not fit its memory limit; it will not on the next try either."""
    loading = pod("a", _hash(), ready=False, ready_since=at(400), containerStatuses=[worker(
        last={"exitCode": 137, "reason": "OOMKilled", "startedAt": at(300), "finishedAt": at(250)})])
    assert degraded([loading])[0] == ("True", "OOMKilled")


def test_unschedulable_is_a_wait_until_the_deadline() -> None:
    """Counted from when the operator first saw the wait (its own clock), not from the scheduler's timestamp."""
    pending = unscheduled("a", _hash(), since=at(SCHEDULING_DEADLINE_SECONDS * 2))
    young = NOW - timedelta(seconds=SCHEDULING_DEADLINE_SECONDS - 1)
    assert degraded([pending], seen={"a": young})[0] == ("False", "Healthy")
    found, status = degraded([pending], seen={"a": NOW - timedelta(seconds=SCHEDULING_DEADLINE_SECONDS)})
    assert found == ("True", "Unschedulable") and "Insufficient nvidia.com/gpu" in message(status, "Degraded")


def test_a_node_on_its_way_is_a_wait_past_the_deadline() -> None:
    """GPU nodes often take longer than 600 s: while the cluster-autoscaler's newest word is that it is adding one,
    the pod is provisioning, not failing (it says NotTriggerScaleUp or FailedScaleUp when it gives up)."""
    waiting = unscheduled("a", _hash(), since=at(SCHEDULING_DEADLINE_SECONDS + 900))
    events = {"a": [event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 0->1 (max: 2)}]",
                          SCHEDULING_DEADLINE_SECONDS + 890, "Normal")]}
    found, status = degraded([waiting], events=events)
    assert found == ("False", "Healthy")
    assert conditions(status)["Progressing"] == ("True", "PodsStarting")
    assert "NodeProvisioning" in message(status, "Progressing")


def test_unschedulable_is_a_failure_at_once_when_no_node_can_come() -> None:
    young = unscheduled("a", _hash(), since=at(30))
    events = {"a": [event("TriggeredScaleUp", "pod triggered scale-up", 25, "Normal"),
                    event("NotTriggerScaleUp", "pod didn't trigger scale-up: 2 max node group size reached", 5,
                          "Normal")]}
    found, status = degraded([young], events=events)
    assert found == ("True", "Unschedulable") and "max node group size reached" in message(status, "Degraded")


@pytest.mark.parametrize(("waiting", "expected"), [("ImagePullBackOff", "ImagePullBackOff"),
                                                   ("ErrImagePull", "ErrImagePull"),
                                                   ("CreateContainerConfigError", "CreateContainerConfigError")])
def test_image_and_config_failures_keep_their_kubelet_reason(waiting: str, expected: str) -> None:
    stuck = pod("a", _hash(), ready=False, phase="Pending", containerStatuses=[worker(
        restarts=0, state={"waiting": {"reason": waiting, "message": "registry says 404"}})])
    assert degraded([stuck])[0] == ("True", expected)


def test_oom_outranks_the_crash_loop_it_causes() -> None:
    oom = pod("a", _hash(), ready=False, containerStatuses=[worker(
        restarts=2, state={"waiting": {"reason": "CrashLoopBackOff"}}, last={"reason": "OOMKilled", "exitCode": 137})])
    found, status = degraded([oom])
    assert found == ("True", "OOMKilled") and "memory limit" in status["lastFailure"]["message"]


def test_init_container_failures_count() -> None:
    r = rendered(model={"uri": "hf://org/name", "revision": "0123456789abcdef0123456789abcdef01234567"}, replicas=1)
    stuck = pod("a", r.config_hash, ready=False, initContainerStatuses=[{
        "name": "download-model", "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [stuck])).status
    assert status["lastFailure"]["container"] == "download-model"


@pytest.mark.parametrize(("hpa", "expected"), [
    (None, ("Unknown", "AutoscalerMissing")),
    ({"status": {}}, ("Unknown", "AwaitingAutoscaler")),
    ({"status": {"conditions": [
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
         "message": "unable to get metric scorekeeper_queue_depth: no custom metrics API registered"}]}},
     ("False", "FailedGetPodsMetric")),
    ({"status": {"conditions": [{"type": "AbleToScale", "status": "False", "reason": "FailedGetScale",
                                 "message": "deployments/scale forbidden"}]}}, ("False", "FailedGetScale")),
    ({"status": {"conditions": [{"type": "AbleToScale", "status": "False", "reason": "BackoffBoth"},
                                {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}]}},
     ("True", "ScalingActive")),
    ({"spec": {"maxReplicas": 4}, "status": {"currentReplicas": 4, "desiredReplicas": 4, "conditions": [
        {"type": "ScalingActive", "status": "True"},
        {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas",
         "message": "the desired replica count is more than the maximum replica count"}]}},
     ("True", "ScalingLimited")),
])
def test_the_hpas_own_conditions_reach_the_scoring_model(hpa: dict[str, Any] | None,
                                                         expected: tuple[str, str]) -> None:
    r = rendered(autoscaling={"enabled": True})
    status = assess(desired(r, None, min_replicas=1), Observed(rolled(r.config_hash, 2, 2), [], {}, hpa)).status
    assert conditions(status)["Autoscaling"] == expected
    assert conditions(status)["Ready"][0] == "True"  # the model still serves; the HPA's trouble is its own condition
    if expected[1] == "FailedGetPodsMetric":
        assert "no custom metrics API registered" in message(status, "Autoscaling")
