"""What the KMock scenarios read of a ScoringModel (its status, a condition, the worker's args), how they create one
and wait for its children, and how they wait for a status: every condition they assert, in one status at once."""

from __future__ import annotations

from typing import Any

from harness import NAMESPACE, Cluster, scoring_model

CHILDREN = ("configmaps", "services", "deployments")


def model_status(cluster: Cluster, name: str = "reranker") -> dict[str, Any]:
    return (cluster.get("scoringmodels", NAMESPACE, name) or {}).get("status") or {}


def condition(cluster: Cluster, kind: str) -> tuple[str, str] | None:
    found = next((c for c in model_status(cluster).get("conditions", []) if c["type"] == kind), None)
    return (found["status"], found["reason"]) if found else None


def conditions_in(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}


async def reached(cluster: Cluster, name: str = "reranker", *, phase: str | None = None, timeout: float = 30.0,
                  **expected: tuple[str, str]) -> dict[str, Any]:
    """Wait for one status that shows the phase and every condition (type=(status, reason)) at once, and return it.
    A pass that saw only part of a change (a pod's new status, not yet the Deployment's) may write a status that
    matches one condition and not its neighbours: asserting those after waiting for one fails under load."""

    def matching() -> dict[str, Any] | None:
        status = model_status(cluster, name)
        found = conditions_in(status)
        ok = all(found.get(kind) == want for kind, want in expected.items())
        return status if ok and (phase is None or status.get("phase") == phase) else None

    try:
        return await cluster.wait_for(matching, timeout, what=f"{name}: phase {phase}, {expected}")
    except AssertionError as timeout_error:
        last = model_status(cluster, name)
        raise AssertionError(f"{timeout_error}; the last status: phase {last.get('phase')},"
                             f" {conditions_in(last)}") from None


def args_of(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


async def created(cluster: Cluster, **spec: Any) -> dict[str, Any]:
    model = await cluster.create("scoringmodels", NAMESPACE, scoring_model(**spec))
    for plural in CHILDREN:
        await cluster.wait_for(lambda p=plural: cluster.get(p, NAMESPACE, "reranker"), what=plural)  # type: ignore[misc]
    return model
