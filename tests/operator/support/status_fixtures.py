"""Builders for the pure status tests: a rendered model, what it wants, and what kubelet and the controllers report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harness import scoring_model
from scorekeeper_operator.render.manifests import CONFIG_HASH_ANNOTATION, Rendered, render
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_operator.status.compute import Assessment, ConfigError, Desired, Observed, compute_status

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)


def at(seconds_before_now: float) -> str:
    return (NOW - timedelta(seconds=seconds_before_now)).strftime("%Y-%m-%dT%H:%M:%SZ")


def rendered(**spec: Any) -> Rendered:
    body = scoring_model(**spec)
    body["metadata"].update(uid="u", generation=2)
    return render(ScoringModel.from_body(body), OperatorSettings(), service_monitor_api=False)


def desired(result: Rendered | None, replicas: int | None = 2, error: ConfigError | None = None,
            min_replicas: int | None = None) -> Desired:
    return Desired(generation=2, selector="app=x", endpoint="http://reranker.ml.svc:8000", rendered=result,
                   fixed_replicas=replicas, config_error=error, min_replicas=min_replicas, startup_seconds=1800)


def deployment(config_hash: str, *, spec_replicas: int | None = 2, generation: int = 5, observed: int = 5,
               **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: config_hash}}}}
    if spec_replicas is not None:
        spec["replicas"] = spec_replicas
    return {"metadata": {"name": "reranker", "generation": generation}, "spec": spec,
            "status": {"observedGeneration": observed, **status}}


def rolled(config_hash: str, want: int, ready: int, **kwargs: Any) -> dict[str, Any]:
    """A Deployment that has rolled out `want` pods of the current template, `ready` of them ready."""
    return deployment(config_hash, spec_replicas=kwargs.pop("spec_replicas", want), replicas=want,
                      updatedReplicas=want, readyReplicas=ready, **kwargs)


def pod(name: str, config_hash: str, *, ready: bool = True, phase: str = "Running", ready_since: str | None = None,
        **status: Any) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if ready_since:
        condition["lastTransitionTime"] = ready_since
    return {"metadata": {"name": name, "annotations": {CONFIG_HASH_ANNOTATION: config_hash}},
            "status": {"phase": phase, "conditions": [condition, *status.pop("conditions", [])], **status}}


def worker(*, ready: bool = False, restarts: int = 1, state: dict[str, Any] | None = None,
           last: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "worker", "ready": ready, "restartCount": restarts,
                              "state": state or {"running": {"startedAt": at(5)}}}
    if last is not None:
        status["lastState"] = {"terminated": last}
    return status


def unscheduled(name: str, config_hash: str, since: str, message: str = "0/3 nodes are available: 3 Insufficient"
                " nvidia.com/gpu.") -> dict[str, Any]:
    return pod(name, config_hash, ready=False, phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastTransitionTime": since}])


def event(reason: str, message: str, seconds_ago: float = 10, kind: str = "Warning") -> dict[str, Any]:
    return {"reason": reason, "message": message, "type": kind, "lastTimestamp": at(seconds_ago)}


def assess(want: Desired, observed: Observed, previous: dict[str, Any] | None = None,
           now: datetime = NOW) -> Assessment:
    return compute_status(want, observed, previous or {}, now)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def message(status: dict[str, Any], kind: str) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == kind))
