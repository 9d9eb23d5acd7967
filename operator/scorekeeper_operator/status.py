"""Pure: observed children → ScoringModel status (conditions, phase, replica counts, endpoint, last failure).

Ready is strict: the Deployment has observed its latest spec, runs our current config hash, has no pods of an older
revision left, has the desired number of ready pods, and no pod is failing. Anything less is reported with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scorekeeper_operator.render import CONFIG_HASH_ANNOTATION, Rendered
from scorekeeper_operator.status_pods import PodFailure, is_ready, last_failure, pod_failures

CONDITION_TYPES = ("Ready", "Available", "Progressing", "ConfigValid", "ModelLoaded", "Degraded")


@dataclass(frozen=True)
class ConfigError:
    reason: str  # InvalidSpec | ModelSourceUnavailable | ChildConflict | Rejected
    message: str


@dataclass(frozen=True)
class Desired:
    """What the operator wants (rendered), or why it cannot want anything (config_error)."""

    generation: int
    selector: str
    endpoint: str
    rendered: Rendered | None
    fixed_replicas: int | None  # None: the HPA decides
    config_error: ConfigError | None = None
    model_source: dict[str, str] | None = None  # status.model: the hf:// revision and the commit it resolved to
    pending_image: str | None = None  # a newer default worker image this model waits to roll out


@dataclass(frozen=True)
class Observed:
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]] = field(default_factory=list)


def _conditions(values: dict[str, tuple[bool, str, str]], previous: list[dict[str, Any]], generation: int,
                now: str) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    result = []
    for kind in CONDITION_TYPES:
        flag, reason, message = values[kind]
        status = "True" if flag else "False"
        old = before.get(kind, {})
        since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now
        result.append({"type": kind, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": since, "observedGeneration": generation})
    return result


def _deployment_condition(deployment: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (deployment.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def _deployment_failure(deployment: dict[str, Any] | None) -> PodFailure | None:
    if deployment is None:
        return None
    name = deployment["metadata"]["name"]
    progressing = _deployment_condition(deployment, "Progressing")
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        return PodFailure("ProgressDeadlineExceeded", progressing.get("message", ""), name)
    replica_failure = _deployment_condition(deployment, "ReplicaFailure")
    if replica_failure.get("status") == "True":  # e.g. a ResourceQuota refuses the pods
        return PodFailure(replica_failure.get("reason") or "ReplicaFailure", replica_failure.get("message", ""), name)
    return None


def _progressing(exists: bool, rolled_out: bool, worst: PodFailure | None, error: ConfigError | None,
                 counts: str) -> tuple[bool, str, str]:
    if error is not None:
        return False, error.reason, "nothing new is rolled out until the spec is fixed"
    if rolled_out:
        return False, "RolloutComplete", counts
    if worst is not None and worst.reason == "ProgressDeadlineExceeded":
        return False, worst.reason, worst.message
    return exists, "RollingOut" if exists else "DeploymentMissing", counts


def compute_status(desired: Desired, observed: Observed, previous: dict[str, Any], now: str) -> dict[str, Any]:
    dep = observed.deployment
    dep_status = (dep or {}).get("status") or {}
    total, updated = dep_status.get("replicas", 0), dep_status.get("updatedReplicas", 0)
    ready = dep_status.get("readyReplicas", 0)
    want = desired.fixed_replicas
    if want is None:  # autoscaled: whatever the HPA set (the API defaults an absent count to 1)
        want = (dep or {}).get("spec", {}).get("replicas", 1) if dep else 1
    config_hash = desired.rendered.config_hash if desired.rendered else None
    template = (dep or {}).get("spec", {}).get("template", {}).get("metadata", {})
    current = bool(dep) and config_hash is not None \
        and (template.get("annotations") or {}).get(CONFIG_HASH_ANNOTATION) == config_hash \
        and dep_status.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    rolled_out = current and updated >= want and total == updated
    failures = pod_failures(observed.pods)
    if (dep_failure := _deployment_failure(dep)) is not None:
        failures.append(dep_failure)
    worst = failures[0] if failures else None
    loaded = [p for p in observed.pods if is_ready(p)
              and (p["metadata"].get("annotations") or {}).get(CONFIG_HASH_ANNOTATION) == config_hash]

    error = desired.config_error
    if error is not None:
        ready_state = (False, error.reason, f"{error.message} (still serving the last applied configuration:"
                                            f" {ready} ready replicas)")
    elif dep is None:
        ready_state = (False, "DeploymentMissing", "the worker Deployment does not exist yet")
    elif want == 0:
        ready_state = (False, "ScaledToZero", "replicas is 0: nothing serves requests")
    elif worst is not None:
        ready_state = (False, worst.reason, f"{worst.pod}: {worst.message}")
    elif not rolled_out:
        ready_state = (False, "RollingOut", f"{updated} of {want} pods run the current configuration")
    elif ready < want:
        ready_state = (False, "WaitingForReadyReplicas", f"{ready} of {want} pods are ready (model load, warm-up)")
    else:
        ready_state = (True, "AllReplicasReady", f"{ready} of {want} pods ready on the current configuration")

    values = {
        "Ready": ready_state,
        "Available": (ready > 0, "ReplicasReady" if ready else "NoReadyReplicas", f"{ready} ready replicas"),
        "Progressing": _progressing(dep is not None, rolled_out, worst, error, f"{updated} of {want} pods updated,"
                                                                             f" {total} in total"),
        "ConfigValid": (error is None, error.reason if error else "Valid", error.message if error else "spec accepted"),
        "ModelLoaded": (bool(loaded), "WorkerReady" if loaded else ("Loading" if observed.pods else "NoPods"),
                        f"{len(loaded)} pods on the current configuration have the model loaded and warm"),
        "Degraded": (worst is not None, worst.reason if worst else "Healthy",
                     f"{worst.pod}: {worst.message}" if worst else "no failing pods"),
    }
    if error is not None:
        phase = "Failed"
    elif worst is not None:
        phase = "Degraded"
    elif ready_state[0]:
        phase = "Ready"
    else:
        phase = "Progressing" if dep is not None and want > 0 else "Pending"

    status: dict[str, Any] = {
        "observedGeneration": desired.generation,
        "phase": phase,
        "conditions": _conditions(values, previous.get("conditions") or [], desired.generation, now),
        "replicas": total,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "selector": desired.selector,
        "endpoint": desired.endpoint,
    }
    if desired.rendered is not None:
        status["configHash"] = desired.rendered.config_hash
        status["workerArgs"] = desired.rendered.worker_args
        status["workerImage"] = desired.rendered.worker_image
    else:  # what the pods still run
        status.update({k: previous[k] for k in ("workerArgs", "workerImage") if previous.get(k)})
    if desired.model_source:
        status["model"] = desired.model_source
    if desired.pending_image:
        status["pendingWorkerImage"] = desired.pending_image
    failure = last_failure([f for f in failures if f.pod], previous.get("lastFailure"))
    if failure is not None:
        status["lastFailure"] = failure if failure.get("time") else {**failure, "time": now}
    return status
