"""compute_status(): Deployment-like conditions that tell the truth without flapping, and stable timestamps."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from scorekeeper_operator.status.compute import ConfigError, Observed
from status_fixtures import (
    LATER,
    NOW,
    assess,
    at,
    conditions,
    deployment,
    desired,
    event,
    message,
    pod,
    rendered,
    rolled,
    unscheduled,
    worker,
)


def test_ready_when_all_desired_replicas_of_the_current_revision_are_ready() -> None:
    r = rendered()
    status = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [pod("a", r.config_hash),
                                                                        pod("b", r.config_hash)])).status
    assert status["phase"] == "Ready"
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")
    assert conditions(status)["Available"] == ("True", "MinimumReplicasAvailable")
    assert conditions(status)["ModelLoaded"] == ("True", "WorkerReady")
    assert conditions(status)["Progressing"] == ("False", "RolloutComplete")
    assert "Autoscaling" not in conditions(status)
    assert (status["replicas"], status["readyReplicas"], status["observedGeneration"]) == (2, 2, 2)
    assert status["workerArgs"] == r.worker_args and status["configHash"] == r.config_hash
    assert status["endpoint"] == "http://reranker.ml.svc:8000" and status["selector"] == "app=x"


@pytest.mark.parametrize(("dep_kwargs", "ready"), [
    ({"observed": 4, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}, ("True", "AllReplicasReady")),
    ({"replicas": 3, "updatedReplicas": 2, "readyReplicas": 3}, ("True", "AllReplicasReady")),  # an old pod left
    ({"replicas": 2, "updatedReplicas": 1, "readyReplicas": 1}, ("True", "MinimumReplicasAvailable")),
    ({"replicas": 0, "updatedReplicas": 0, "readyReplicas": 0}, ("False", "RollingOut")),  # Recreate: none serve
])
def test_ready_follows_available_during_a_rollout(dep_kwargs: dict[str, Any], ready: tuple[str, str]) -> None:
    """Old pods still serving are capacity: Ready stays as Available says; the rollout is Progressing's business."""
    r = rendered()
    status = assess(desired(r), Observed(deployment(r.config_hash, **dep_kwargs), [])).status
    assert conditions(status)["Ready"] == ready
    assert conditions(status)["Ready"][0] == conditions(status)["Available"][0]
    assert conditions(status)["Progressing"] == ("True", "RollingOut")
    assert status["phase"] == ("Ready" if ready[0] == "True" else "Progressing")


def test_every_condition_carries_the_generation_it_describes() -> None:
    """kstatus and Argo CD compare a condition's observedGeneration with metadata.generation: a condition computed
    for an older spec must say so, each one, not only status.observedGeneration."""
    r = rendered()
    first = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [])).status
    assert {c["type"]: c["observedGeneration"] for c in first["conditions"]} == {c: 2 for c in conditions(first)}
    newer = replace(desired(r), generation=3)
    second = assess(newer, Observed(rolled(r.config_hash, 2, 2), []), first, LATER).status
    assert [c["observedGeneration"] for c in second["conditions"]] == [3] * len(second["conditions"])
    assert second["observedGeneration"] == 3
    # The generation moved, nothing else: the transition times stay.
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [c["lastTransitionTime"]
                                                                       for c in first["conditions"]]


def test_too_few_ready_pods_are_not_available_and_loading_pods_are_progress_not_complete() -> None:
    r = rendered(replicas=3)
    loading = pod("c", r.config_hash, ready=False, containerStatuses=[worker(restarts=0)])
    status = assess(desired(r, 3), Observed(rolled(r.config_hash, 3, 1), [pod("a", r.config_hash), loading])).status
    assert conditions(status)["Ready"] == ("False", "WaitingForReadyReplicas")
    assert conditions(status)["Available"] == ("False", "MinimumReplicasUnavailable")
    assert "1 of 3 pods ready, at least 2 needed" in message(status, "Available")
    assert conditions(status)["Progressing"] == ("True", "PodsStarting")  # never RolloutComplete while loading
    assert "c: Loading" in message(status, "Progressing")


def test_a_deployment_still_on_the_old_config_hash_is_ready_and_progressing() -> None:
    r = rendered()
    status = assess(desired(r), Observed(rolled("0ld", 2, 2), [])).status
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")  # the old pods still serve
    assert conditions(status)["Available"] == ("True", "MinimumReplicasAvailable")
    assert conditions(status)["Progressing"] == ("True", "RollingOut")
    assert "0 of 2 pods run the current configuration" in message(status, "Ready")


def test_hpa_scale_up_onto_a_node_being_added_keeps_ready_and_says_progressing() -> None:
    """Issue 15: Ready went False on every HPA scale-up, and Degraded (Unschedulable) while a node was added."""
    r = rendered(autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    pending = [unscheduled(n, r.config_hash, since=at(60)) for n in ("c", "d")]
    events = {n: [event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 1->2 (max: 4)}]", kind="Normal")]
              for n in ("c", "d")}
    scaled = rolled(r.config_hash, 4, 2)  # the HPA set 4; two pods serve, two wait for a node
    assessment = assess(desired(r, None, min_replicas=2), Observed(scaled, [pod("a", r.config_hash),
                                                                           pod("b", r.config_hash), *pending],
                                                                   events))
    status = assessment.status
    assert conditions(status)["Ready"] == ("True", "MinimumReplicasAvailable")
    assert conditions(status)["Progressing"] == ("True", "PodsStarting")
    assert "NodeProvisioning" in message(status, "Progressing") and "gpu-pool" in message(status, "Progressing")
    assert conditions(status)["Degraded"] == ("False", "Healthy") and status["phase"] == "Ready"
    # No deadline of ours while a node is on its way (the autoscaler says when it gives up): poll the Events.
    assert assessment.recheck_in is None and assessment.waiting


def test_one_pod_restarting_keeps_ready() -> None:
    """It served, was restarted (a node hiccup, a liveness kill), and is loading again: normal operation."""
    r = rendered()
    restarted = pod("b", r.config_hash, ready=False, ready_since=at(20), containerStatuses=[worker(
        last={"exitCode": 137, "reason": "Error", "startedAt": at(3600), "finishedAt": at(20)})])
    status = assess(desired(r), Observed(rolled(r.config_hash, 2, 1), [pod("a", r.config_hash), restarted])).status
    assert conditions(status)["Ready"] == ("True", "MinimumReplicasAvailable")
    assert conditions(status)["Degraded"] == ("False", "Healthy")
    assert conditions(status)["Progressing"] == ("True", "PodsStarting")
    assert "b: Restarting" in message(status, "Progressing")


def test_one_failing_pod_of_many_is_degraded_while_the_rest_keeps_it_ready() -> None:
    r = rendered()
    crashing = pod("b", r.config_hash, ready=False, containerStatuses=[worker(
        state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
        last={"exitCode": 139, "reason": "Error"})])
    status = assess(desired(r), Observed(rolled(r.config_hash, 2, 1), [pod("a", r.config_hash), crashing])).status
    assert conditions(status)["Ready"] == ("True", "MinimumReplicasAvailable")
    assert conditions(status)["Degraded"] == ("True", "CrashLoopBackOff")
    assert status["phase"] == "Degraded"


def test_a_single_crash_looping_replica_is_not_ready_with_the_reason() -> None:
    r = rendered(replicas=1)
    crashing = pod("a", r.config_hash, ready=False, containerStatuses=[worker(
        restarts=4, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting"}},
        last={"exitCode": 139, "reason": "Error", "finishedAt": "2026-01-01T00:00:00Z"})])
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [crashing])).status
    assert status["phase"] == "Degraded"
    assert conditions(status)["Degraded"] == ("True", "CrashLoopBackOff")
    assert conditions(status)["Ready"] == ("False", "CrashLoopBackOff")
    assert status["lastFailure"] == {"reason": "CrashLoopBackOff", "pod": "a", "container": "worker", "exitCode": 139,
                                     "time": "2026-01-01T00:00:00Z",
                                     "message": "back-off 1m20s restarting; last exit code 139 (Error)"}


def test_a_recovered_container_is_history_not_degradation() -> None:
    r = rendered()
    recovered = pod("a", r.config_hash, containerStatuses=[worker(
        ready=True, last={"reason": "OOMKilled", "exitCode": 137})])
    previous = {"lastFailure": {"reason": "OOMKilled", "pod": "a", "container": "worker", "time": at(0)}}
    status = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [recovered, pod("b", r.config_hash)]),
                    previous, LATER).status
    assert conditions(status)["Degraded"] == ("False", "Healthy") and status["phase"] == "Ready"
    assert status["lastFailure"] == previous["lastFailure"]


def test_progress_deadline_is_a_failure() -> None:
    r = rendered()
    stuck = deployment(r.config_hash, replicas=1, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}])
    status = assess(desired(r), Observed(stuck, [])).status
    assert conditions(status)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert status["phase"] == "Degraded" and "lastFailure" not in status  # a Deployment failure, not a pod's


def test_autoscaled_capacity_is_guaranteed_at_min_replicas() -> None:
    r = rendered(autoscaling={"enabled": True, "minReplicas": 3, "maxReplicas": 8})
    want = desired(r, None, min_replicas=3)
    assert conditions(assess(want, Observed(rolled(r.config_hash, 6, 2), [])).status)["Ready"][0] == "True"
    assert conditions(assess(want, Observed(rolled(r.config_hash, 6, 1), [])).status)["Ready"] == (
        "False", "WaitingForReadyReplicas")  # below minReplicas minus the PDB's one: capacity is missing


def test_config_error_keeps_reporting_what_still_runs() -> None:
    r = rendered()
    previous = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [])).status
    error = ConfigError("InvalidSpec", "spec.extraArgs: bad")
    status = assess(desired(None, error=error), Observed(rolled(r.config_hash, 2, 2), []), previous, LATER).status
    assert status["phase"] == "Degraded"  # issue 36: never Failed while the pods serve
    assert conditions(status)["ConfigValid"] == ("False", "InvalidSpec")
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")  # Ready follows Available
    assert "last applied configuration" in next(c["message"] for c in status["conditions"] if c["type"] == "Ready")
    assert conditions(status)["Available"] == ("True", "MinimumReplicasAvailable")
    assert status["workerArgs"] == previous["workerArgs"] and "configHash" not in status


def test_transition_times_move_only_when_a_condition_flips() -> None:
    r = rendered()
    first = assess(desired(r), Observed(None, [])).status
    assert assess(desired(r), Observed(None, []), first, LATER).status == first  # nothing changed: no write
    ready = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), []), first, LATER).status
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == "2026-01-01T12:05:00Z" and times["ConfigValid"] == "2026-01-01T12:00:00Z"


def test_scaled_to_zero_is_not_ready() -> None:
    r = rendered(replicas=0)
    status = assess(desired(r, 0), Observed(deployment(r.config_hash, spec_replicas=0), [])).status
    assert conditions(status)["Ready"] == ("False", "ScaledToZero") and status["phase"] == "Pending"


def test_a_steady_model_needs_no_recheck() -> None:
    r = rendered()
    assessment = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [pod("a", r.config_hash),
                                                                          pod("b", r.config_hash)]))
    assert assessment.recheck_in is None and not assessment.waiting


def test_the_deadline_re_check_comes_when_the_first_wait_runs_out() -> None:
    """Issue 49: what is left of each scheduling wait, on the operator's clock (seen 400 s and 100 s ago, of 600),
    and the earliest of them: nothing else announces a wait turning into a failure, and Event polling every 0.3 s
    in the cluster tests would hide a re-check that comes too late."""
    r = rendered(replicas=2)
    pending = [unscheduled(name, r.config_hash, at(900)) for name in ("a", "b")]
    seen = {"a": NOW - timedelta(seconds=400), "b": NOW - timedelta(seconds=100)}
    assessment = assess(desired(r, 2), Observed(rolled(r.config_hash, 2, 0), pending, unplaced_since=seen))
    assert conditions(assessment.status)["Degraded"] == ("False", "Healthy")
    assert assessment.recheck_in == pytest.approx(200)
