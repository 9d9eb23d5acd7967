"""Pure: observed children → ScoringModel status (conditions, phase, replica counts, endpoint, last failure).

Modelled on the Deployment controller's conditions, so that status does not flap during normal operation:
- Available: at least the guaranteed replicas minus the disruption the PDB allows serve (any revision). Guaranteed
  is `replicas`, or with autoscaling `minReplicas`: pods the HPA adds are capacity on its way, not missing.
- Ready: follows Available (pods of an older revision that still serve count), always: a spec the operator cannot
  serve or a child it cannot apply is ConfigValid's and ChildrenReady's business, and so are an HPA scale-up, one pod
  restarting, a node being added or a rollout (Progressing's). While nothing serves, Ready says why at once: a pod
  the scheduler cannot place (its reason: no free GPU, a taint, a quota) or a node on its way (Karpenter, the
  cluster-autoscaler) is named in the first pass that sees it.
- ChildrenReady: False while the API refuses a child or another object holds its name (optional ones too).
- UpgradePending: only while the model waits for a rollout slot: which models hold the slots, and why.
- Progressing: a rollout or pods starting (scale-up, restart); False when complete or past the progress deadline.
- Degraded: a pod fails now in a way that needs a human (pods.SEVERITY), with a specific reason and message; history
  (an eviction long ago, one restart of a pod that served) is lastFailure, not Degraded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scorekeeper_operator.render.children import MAX_UNAVAILABLE
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, Rendered
from scorekeeper_operator.status.autoscaler import autoscaling_condition
from scorekeeper_operator.status.events import pod_events
from scorekeeper_operator.status.pods import PodFailure, PodState, last_failure, pod_state

CONDITION_TYPES = ("Ready", "Available", "Progressing", "ConfigValid", "ChildrenReady", "ModelLoaded", "Degraded",
                   "Autoscaling", "UpgradePending")
# An unschedulable pod is a wait (a node may be on its way) for this long, then a failure; at once when the
# cluster-autoscaler says it cannot add a node. The default of spec.rollout.schedulingDeadlineSeconds; the
# Deployment's progress deadline includes it.
SCHEDULING_DEADLINE_SECONDS = 600.0
# ConfigErrors about a child (a refusal of the API, another object under its name), not about the spec.
CHILD_REASONS = frozenset({"ChildConflict", "Rejected", "QuotaExceeded", "AdmissionWebhookDenied", "Forbidden"})
SCHEDULING_WAITS = ("Scheduling", "NodeProvisioning")
Condition = tuple[bool | None, str, str]  # (True/False/None=Unknown, reason, message)


@dataclass(frozen=True)
class ConfigError:
    reason: str  # InvalidSpec | ModelSourceUnavailable | RevisionNotFound | HubAccessDenied | KedaUnavailable |
    #              ChildConflict | Rejected
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
    min_replicas: int | None = None  # with autoscaling: the guaranteed capacity
    startup_seconds: int = 1800
    model_source: dict[str, str] | None = None  # status.model: the hf:// revision and the commit it resolved to
    # A model waiting for a rollout slot (pacing.py): the configuration it waits to roll out, and its image if another
    pending_config_hash: str | None = None
    pending_image: str | None = None
    slot_wait: str | None = None  # while pending: which models hold the rollout slots, and why
    scheduling_deadline: float = SCHEDULING_DEADLINE_SECONDS


@dataclass(frozen=True)
class Observed:
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pod name → its Events
    autoscaler: dict[str, Any] | None = None
    # pod name → when the operator first saw it wait to be placed (pods.placement_clock); absent: now
    unplaced_since: dict[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class Assessment:
    status: dict[str, Any]
    recheck_in: float | None  # seconds until a wait turns into a failure, without any event to say so
    waiting: bool  # some pod is on its way: its Events may change without a watch event


def _conditions(values: dict[str, Condition], previous: list[dict[str, Any]], generation: int,
                now: str) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    result = []
    for kind in CONDITION_TYPES:
        if kind not in values:
            continue
        flag, reason, message = values[kind]
        status = "Unknown" if flag is None else "True" if flag else "False"
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


def _for_want_of_room(failure: PodFailure | None, states: list[PodState],
                      config_hash: str | None) -> PodFailure | None:
    """Past the Deployment's progress deadline with nothing wrong but pods that wait to be placed (Karpenter keeps
    nominating a node that never comes, and a node on its way has no deadline of ours): the rollout failed for want
    of room, like Unschedulable, not because of what it rolls out."""
    if failure is None or failure.reason != "ProgressDeadlineExceeded":
        return failure
    stuck = [s for s in states if not s.ready and not s.terminal and s.config_hash in (config_hash, None)]
    waits = [s.wait for s in stuck if s.wait is not None and s.wait.reason in SCHEDULING_WAITS]
    if not stuck or len(waits) < len(stuck):
        return failure
    places = "; ".join(f"{w.pod}: {w.message}" for w in waits[:3])
    return PodFailure("Unschedulable", f"past its progress deadline the rollout's pods still wait to be placed:"
                      f" {places} ({failure.message})".replace(" ()", ""), failure.pod)


def _summary(states: list[PodState]) -> str:
    waits = [s.wait for s in states if s.wait is not None]
    return "; ".join(f"{w.pod}: {w.reason} ({w.message})" for w in waits[:3]) + ("; …" if len(waits) > 3 else "")


def _phase(error: ConfigError | None, worst: PodFailure | None, ready: bool, exists: bool) -> str:
    if error is not None and not ready:
        return "Failed"
    if worst is not None or error is not None:  # serving, but not as asked
        return "Degraded"
    return "Ready" if ready else "Progressing" if exists else "Pending"


def _children_ready(error: ConfigError | None) -> Condition:
    if error is None:
        return True, "Applied", "every child is applied as rendered"
    if error.reason in CHILD_REASONS:
        return False, error.reason, error.message
    return None, "NotApplied", f"nothing new is applied until the spec can be served ({error.reason})"


def compute_status(desired: Desired, observed: Observed, previous: dict[str, Any], now: datetime) -> Assessment:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    dep = observed.deployment
    dep_status = (dep or {}).get("status") or {}
    total, updated = dep_status.get("replicas", 0), dep_status.get("updatedReplicas", 0)
    ready = dep_status.get("readyReplicas", 0)
    want = desired.fixed_replicas
    if want is None:  # autoscaled: whatever the HPA set (the API defaults an absent count to 1)
        want = (dep or {}).get("spec", {}).get("replicas", 1) if dep else 1
    guaranteed = want if desired.min_replicas is None else min(want, desired.min_replicas)
    needed = max(1, guaranteed - (MAX_UNAVAILABLE if guaranteed > 1 else 0)) if want > 0 else 0
    available = want > 0 and ready >= needed
    config_hash = desired.rendered.config_hash if desired.rendered else None
    template = (dep or {}).get("spec", {}).get("template", {}).get("metadata", {})
    current = bool(dep) and config_hash is not None \
        and (template.get("annotations") or {}).get(CONFIG_HASH_ANNOTATION) == config_hash \
        and dep_status.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    rolled_out = current and updated >= want and total == updated

    earlier = previous.get("lastFailure") or {}
    failed_unplaced = earlier.get("pod") if earlier.get("reason") == "Unschedulable" else None
    states = [pod_state(p, pod_events(observed.events.get(p["metadata"]["name"], [])), CONFIG_HASH_ANNOTATION,
                        now=now, startup_seconds=desired.startup_seconds,
                        scheduling_deadline=desired.scheduling_deadline,
                        unplaced_since=observed.unplaced_since.get(p["metadata"]["name"]),
                        failed_before=p["metadata"]["name"] == failed_unplaced)
              for p in observed.pods if not p["metadata"].get("deletionTimestamp")]
    # A pod the kubelet evicted or refused stays behind as phase Failed (for days); its replacement is another pod.
    # It matters while capacity is short and a replacement may still be on its way, then it is history (lastFailure).
    recent = [s for s in states if s.terminal and (s.current_for is None or s.current_for > 0)]
    pod_failures = sorted((s.failure for s in states if s.failure is not None
                           and (not s.terminal or (ready < want and s in recent))), key=lambda f: f.severity)
    dep_failure = _for_want_of_room(_deployment_failure(dep), states, config_hash)
    failures = [*pod_failures, *([dep_failure] if dep_failure else [])]
    worst = failures[0] if failures else None
    loaded = [s for s in states if s.ready and s.config_hash == config_hash]
    pods_note = _summary(states)

    error = desired.config_error
    counts = f"{ready} of {want} pods ready, at least {needed} needed"
    unplaced = [s.wait for s in states if s.wait is not None and s.wait.reason in SCHEDULING_WAITS]
    availability: Condition = (available, "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                               counts)
    if unplaced and not available and want > 0:  # named at once: the scheduler's reason, or the node on its way
        reason = "PodsUnschedulable" if any(w.reason == "Scheduling" for w in unplaced) else "NodeProvisioning"
        down = "the model is down: no pod serves" if ready == 0 else f"below its capacity: {counts}"
        places = "; ".join(f"{w.pod}: {w.message}" for w in unplaced[:3])
        what = "pods that cannot be placed" if reason == "PodsUnschedulable" else "pods waiting for a node being added"
        availability = (False, reason, f"{down}; {what}: {places}")
    ready_state: Condition
    if dep is None:
        ready_state = (False, error.reason if error else "DeploymentMissing",
                       error.message if error else "the worker Deployment does not exist yet")
    elif want == 0:
        ready_state = (False, "ScaledToZero", "replicas is 0: nothing serves requests")
    elif available:  # Ready follows Available: old pods that still serve are capacity; the rollout is Progressing's
        reason = "AllReplicasReady" if ready >= want else "MinimumReplicasAvailable"
        rollout = "on the current configuration" if rolled_out \
            else f"; rolling out: {updated if current else 0} of {want} pods run the current configuration"
        if error is not None:
            rollout = f"on the last applied configuration ({error.reason}: see ConfigValid)"
        ready_state = (True, reason, f"{counts} {rollout}".replace(" ;", ";"))
    elif error is not None:
        ready_state = (False, error.reason, f"{error.message} (the last applied configuration: {ready} ready"
                                            " replicas)")
    elif worst is not None:
        ready_state = (False, worst.reason, f"{worst.pod}: {worst.message}")
    elif unplaced:
        ready_state = availability
    elif not rolled_out:
        ready_state = (False, "RollingOut", f"{updated if current else 0} of {want} pods run the current"
                                            f" configuration; {pods_note}".rstrip("; "))
    else:
        ready_state = (False, "WaitingForReadyReplicas", f"{counts}; {pods_note}".rstrip("; "))

    deadline = _deployment_condition(dep or {}, "Progressing").get("reason") == "ProgressDeadlineExceeded"
    progressing: Condition
    if error is not None:
        progressing = (False, error.reason, "nothing new is rolled out until the spec is fixed")
    elif dep is None:
        progressing = (False, "DeploymentMissing", "the worker Deployment does not exist yet")
    elif deadline:
        progressing = (False, "ProgressDeadlineExceeded", _deployment_condition(dep, "Progressing").get("message", ""))
    elif not rolled_out:
        progressing = (True, "RollingOut", f"{updated} of {want} pods updated, {total} in total; {pods_note}"
                       .rstrip("; "))
    elif ready < want:
        progressing = (True, "PodsStarting", f"{ready} of {want} pods ready; {pods_note}".rstrip("; "))
    elif desired.pending_config_hash:
        progressing = (False, "WaitingForRolloutSlot", desired.slot_wait or "waiting for a rollout slot")
    else:
        progressing = (False, "RolloutComplete", f"{ready} of {want} pods ready on the current configuration")

    load_failed = next((f for f in failures if f.reason == "ModelLoadFailed"), None)
    values: dict[str, Condition] = {
        "Ready": ready_state,
        "Available": availability,
        "Progressing": progressing,
        "ConfigValid": (error is None, error.reason if error else "Valid", error.message if error else "spec accepted"),
        "ChildrenReady": _children_ready(error),
        "ModelLoaded": (bool(loaded), "WorkerReady" if loaded else "ModelLoadFailed" if load_failed else
                        "Loading" if states else "NoPods",
                        load_failed.message if load_failed and not loaded else
                        f"{len(loaded)} pods on the current configuration have the model loaded and warm"),
        "Degraded": (worst is not None, worst.reason if worst else "Healthy",
                     f"{worst.pod}: {worst.message}" if worst else "no failing pods"),
    }
    if desired.min_replicas is not None:
        values["Autoscaling"] = autoscaling_condition(observed.autoscaler)
    if desired.pending_config_hash:
        values["UpgradePending"] = (True, "WaitingForRolloutSlot", desired.slot_wait or "waiting for a rollout slot")

    status: dict[str, Any] = {
        "observedGeneration": desired.generation,
        "phase": _phase(error, worst, bool(ready_state[0]), dep is not None and want > 0),
        "conditions": _conditions(values, previous.get("conditions") or [], desired.generation, stamp),
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
    if desired.pending_config_hash:
        status["pendingConfigHash"] = desired.pending_config_hash
    if desired.pending_image:
        status["pendingWorkerImage"] = desired.pending_image
    failure = last_failure(pod_failures, previous.get("lastFailure"))
    if failure is not None:
        status["lastFailure"] = failure if failure.get("time") else {**failure, "time": stamp}
    deadlines = [s.wait.deadline_in for s in states if s.wait is not None and s.wait.deadline_in is not None]
    if ready < want:  # a recent eviction turns into history with no event to say so
        deadlines += [s.current_for for s in recent if s.current_for is not None]
    return Assessment(status, min(deadlines, default=None), any(s.wait is not None for s in states))
