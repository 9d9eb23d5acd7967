"""What GitOps tools see: the shipped Argo CD health check (Lua 5.1, as Argo CD runs it) on statuses the operator
computes, for the situations issue 15 found flapping or hidden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lupa import lua51
from scorekeeper_operator.status.compute import ConfigError, Observed
from status_fixtures import assess, at, desired, event, pod, rendered, rolled, unscheduled, worker

HEALTH_CHECK = Path(__file__).resolve().parents[3] / "deploy" / "argocd" / "scoringmodel-health.lua"


def argo_health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run the health check as Argo CD does: `obj` is the live object as a Lua table; it returns {status, message}."""
    runtime = lua51.LuaRuntime()
    runtime.globals().obj = runtime.table_from(json.loads(json.dumps(obj)), recursive=True)
    result = runtime.execute(HEALTH_CHECK.read_text())
    return str(result["status"]), str(result["message"])


def model(status: dict[str, Any] | None, generation: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": "reranker", "generation": generation}, "status": status}


def test_a_ready_model_is_healthy() -> None:
    r = rendered()
    status = assess(desired(r), Observed(rolled(r.config_hash, 2, 2), [pod("a", r.config_hash)])).status
    assert argo_health(model(status)) == ("Healthy", f"AllReplicasReady: {_message(status, 'Ready')}")


def test_a_scale_up_onto_a_new_node_stays_healthy() -> None:
    r = rendered(autoscaling={"enabled": True, "minReplicas": 2})
    pending = unscheduled("c", r.config_hash, since=at(60))
    scaling = assess(desired(r, None, min_replicas=2), Observed(rolled(r.config_hash, 4, 2), [pending], {
        "c": [event("TriggeredScaleUp", "pod triggered scale-up", kind="Normal")]})).status
    assert argo_health(model(scaling))[0] == "Healthy"


def test_a_model_load_failure_is_degraded_with_its_message() -> None:
    r = rendered(replicas=1)
    failed = pod("a", r.config_hash, ready=False, containerStatuses=[worker(last={
        "exitCode": 3, "message": "unsupported architecture Qwen3ForCausalLM"})])
    status = assess(desired(r, 1), Observed(rolled(r.config_hash, 1, 0), [failed])).status
    health, message = argo_health(model(status))
    assert health == "Degraded" and message == "ModelLoadFailed: a: unsupported architecture Qwen3ForCausalLM"


def test_an_unservable_spec_is_degraded() -> None:
    r = rendered()
    status = assess(desired(None, error=ConfigError("ChildConflict", "Service ml/reranker exists")),
                    Observed(rolled(r.config_hash, 2, 2), [])).status
    assert argo_health(model(status)) == ("Degraded", "ChildConflict: Service ml/reranker exists")


@pytest.mark.parametrize("obj", [model(None), model({"observedGeneration": 1, "conditions": []}, generation=2)])
def test_before_the_operator_reported_on_this_spec_it_is_progressing(obj: dict[str, Any]) -> None:
    assert argo_health(obj)[0] == "Progressing"


def test_a_rollout_is_progressing() -> None:
    """Ready follows Available (old pods serve), but Argo CD waits for a rollout, as for a Deployment."""
    r = rendered()
    status = assess(desired(r), Observed(rolled("0ld", 2, 2), [])).status
    assert argo_health(model(status)) == ("Progressing", f"RollingOut: {_message(status, 'Progressing')}")


def _message(status: dict[str, Any], kind: str) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == kind))
