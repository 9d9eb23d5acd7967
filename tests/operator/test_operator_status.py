"""compute_status(): Ready only when it is true, Degraded with the reason when pods fail, stable timestamps."""

from __future__ import annotations

from typing import Any

import pytest
from harness import scoring_model
from scorekeeper_operator.render import CONFIG_HASH_ANNOTATION, Rendered, render
from scorekeeper_operator.settings import OperatorSettings
from scorekeeper_operator.spec import ScoringModel
from scorekeeper_operator.status import ConfigError, Desired, Observed, compute_status

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def rendered(**spec: Any) -> Rendered:
    body = scoring_model(**spec)
    body["metadata"].update(uid="u", generation=2)
    return render(ScoringModel.from_body(body), OperatorSettings(), service_monitor_api=False)


def desired(result: Rendered | None, replicas: int | None = 2, error: ConfigError | None = None) -> Desired:
    return Desired(generation=2, selector="app=x", endpoint="http://reranker.ml.svc:8000", rendered=result,
                   fixed_replicas=replicas, config_error=error)


def deployment(config_hash: str, *, spec_replicas: int | None = 2, generation: int = 5, observed: int = 5,
               **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}}
    if spec_replicas is not None:
        spec["replicas"] = spec_replicas
    return {"metadata": {"name": "reranker", "generation": generation}, "spec": spec,
            "status": {"observedGeneration": observed, **status}}


def pod(name: str, config_hash: str, *, ready: bool = True, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *status.pop("conditions", [])]
    return {"metadata": {"name": name, "annotations": {CONFIG_HASH_ANNOTATION: config_hash}},
            "status": {"conditions": conditions, **status}}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_when_all_desired_replicas_of_the_current_revision_are_ready() -> None:
    r = rendered()
    observed = Observed(deployment(r.config_hash, replicas=2, updatedReplicas=2, readyReplicas=2),
                        [pod("a", r.config_hash), pod("b", r.config_hash)])
    status = compute_status(desired(r), observed, {}, NOW)
    assert status["phase"] == "Ready"
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")
    assert conditions(status)["ModelLoaded"] == ("True", "WorkerReady")
    assert conditions(status)["Progressing"] == ("False", "RolloutComplete")
    assert (status["replicas"], status["readyReplicas"], status["observedGeneration"]) == (2, 2, 2)
    assert status["workerArgs"] == r.worker_args and status["configHash"] == r.config_hash
    assert status["endpoint"] == "http://reranker.ml.svc:8000" and status["selector"] == "app=x"


@pytest.mark.parametrize(("dep_kwargs", "reason"), [
    ({"observed": 4, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}, "RollingOut"),  # not seen yet
    ({"replicas": 3, "updatedReplicas": 2, "readyReplicas": 3}, "RollingOut"),  # an old pod still runs
    ({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}, "WaitingForReadyReplicas"),  # model loading
])
def test_not_ready_before_the_rollout_really_finished(dep_kwargs: dict[str, Any], reason: str) -> None:
    r = rendered()
    status = compute_status(desired(r), Observed(deployment(r.config_hash, **dep_kwargs), []), {}, NOW)
    assert conditions(status)["Ready"] == ("False", reason)
    assert status["phase"] == "Progressing"


def test_a_deployment_still_on_the_old_config_hash_is_not_ready() -> None:
    r = rendered()
    old = deployment("0ld", replicas=2, updatedReplicas=2, readyReplicas=2)
    status = compute_status(desired(r), Observed(old, []), {}, NOW)
    assert conditions(status)["Ready"] == ("False", "RollingOut")
    assert conditions(status)["Available"] == ("True", "ReplicasReady")  # the old pods still serve


def test_crash_loop_is_degraded_with_reason_and_last_exit() -> None:
    r = rendered()
    crashing = pod("a", r.config_hash, ready=False, containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 2, "finishedAt": "2026-01-01T00:00:00Z"}}}])
    status = compute_status(desired(r), Observed(deployment(r.config_hash, replicas=2, updatedReplicas=2,
                                                            readyReplicas=1), [crashing]), {}, NOW)
    assert status["phase"] == "Degraded"
    assert conditions(status)["Degraded"] == ("True", "CrashLoopBackOff")
    assert conditions(status)["Ready"] == ("False", "CrashLoopBackOff")
    assert status["lastFailure"] == {"reason": "CrashLoopBackOff", "pod": "a", "container": "worker", "exitCode": 2,
                                     "time": "2026-01-01T00:00:00Z",
                                     "message": "back-off 1m20s restarting failed container; last exit code 2 (Error)"}


def test_oom_outranks_the_crash_loop_it_causes() -> None:
    r = rendered()
    oom = pod("a", r.config_hash, ready=False, containerStatuses=[{
        "name": "worker", "ready": False, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}])
    status = compute_status(desired(r), Observed(deployment(r.config_hash), [oom]), {}, NOW)
    assert conditions(status)["Degraded"] == ("True", "OOMKilled")
    assert "memory limit" in status["lastFailure"]["message"] and status["lastFailure"]["time"] == NOW


def test_no_gpu_to_schedule_on_is_degraded_unschedulable() -> None:
    r = rendered()
    pending = pod("a", r.config_hash, ready=False, conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    status = compute_status(desired(r), Observed(deployment(r.config_hash, replicas=1), [pending]), {}, NOW)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in degraded["message"]


def test_init_container_failures_count() -> None:
    r = rendered(model={"uri": "hf://org/name", "revision": "0123456789abcdef0123456789abcdef01234567"})
    stuck = pod("a", r.config_hash, ready=False, initContainerStatuses=[{
        "name": "download-model", "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
    status = compute_status(desired(r), Observed(deployment(r.config_hash), [stuck]), {}, NOW)
    assert status["lastFailure"]["container"] == "download-model"


def test_a_recovered_container_is_history_not_degradation() -> None:
    r = rendered()
    recovered = pod("a", r.config_hash, containerStatuses=[{
        "name": "worker", "ready": True, "state": {"running": {}},
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}])
    previous = {"lastFailure": {"reason": "OOMKilled", "pod": "a", "container": "worker", "time": NOW}}
    observed = Observed(deployment(r.config_hash, replicas=2, updatedReplicas=2, readyReplicas=2),
                        [recovered, pod("b", r.config_hash)])
    status = compute_status(desired(r), observed, previous, LATER)
    assert conditions(status)["Degraded"] == ("False", "Healthy") and status["phase"] == "Ready"
    assert status["lastFailure"] == previous["lastFailure"]


def test_progress_deadline_is_a_failure() -> None:
    r = rendered()
    stuck = deployment(r.config_hash, replicas=1, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}])
    status = compute_status(desired(r), Observed(stuck, []), {}, NOW)
    assert conditions(status)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert status["phase"] == "Degraded"


def test_autoscaled_desired_count_comes_from_the_deployment() -> None:
    r = rendered(autoscaling={"enabled": True, "maxReplicas": 5})
    hpa_set = deployment(r.config_hash, spec_replicas=4, replicas=4, updatedReplicas=4, readyReplicas=3)
    assert conditions(compute_status(desired(r, None), Observed(hpa_set, []), {}, NOW))["Ready"][0] == "False"
    hpa_set["status"]["readyReplicas"] = 4
    assert conditions(compute_status(desired(r, None), Observed(hpa_set, []), {}, NOW))["Ready"][0] == "True"


def test_config_error_keeps_reporting_what_still_runs() -> None:
    r = rendered()
    previous = compute_status(desired(r), Observed(deployment(r.config_hash, replicas=2, updatedReplicas=2,
                                                              readyReplicas=2), []), {}, NOW)
    error = ConfigError("InvalidSpec", "spec.extraArgs: bad")
    status = compute_status(desired(None, error=error), Observed(deployment(r.config_hash, replicas=2,
                                                                            readyReplicas=2), []), previous, LATER)
    assert status["phase"] == "Failed"
    assert conditions(status)["ConfigValid"] == ("False", "InvalidSpec")
    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert conditions(status)["Available"] == ("True", "ReplicasReady")
    assert status["workerArgs"] == previous["workerArgs"] and "configHash" not in status


def test_transition_times_move_only_when_a_condition_flips() -> None:
    r = rendered()
    first = compute_status(desired(r), Observed(None, []), {}, NOW)
    same = compute_status(desired(r), Observed(None, []), first, LATER)
    assert same == first  # nothing changed: the operator writes nothing
    ready = compute_status(desired(r), Observed(deployment(r.config_hash, replicas=2, updatedReplicas=2,
                                                           readyReplicas=2), []), first, LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == LATER and times["ConfigValid"] == NOW


def test_scaled_to_zero_is_not_ready() -> None:
    r = rendered(replicas=0)
    status = compute_status(desired(r, 0), Observed(deployment(r.config_hash, spec_replicas=0), []), {}, NOW)
    assert conditions(status)["Ready"] == ("False", "ScaledToZero") and status["phase"] == "Pending"
