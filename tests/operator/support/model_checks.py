"""What the KMock scenarios read of a ScoringModel (its status, a condition, the worker's args) and how they create
one and wait for its children."""

from __future__ import annotations

from typing import Any

from harness import NAMESPACE, Cluster, scoring_model

CHILDREN = ("configmaps", "services", "deployments")


def model_status(cluster: Cluster, name: str = "reranker") -> dict[str, Any]:
    return (cluster.get("scoringmodels", NAMESPACE, name) or {}).get("status") or {}


def condition(cluster: Cluster, kind: str) -> tuple[str, str] | None:
    found = next((c for c in model_status(cluster).get("conditions", []) if c["type"] == kind), None)
    return (found["status"], found["reason"]) if found else None


def args_of(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


async def created(cluster: Cluster, **spec: Any) -> dict[str, Any]:
    model = await cluster.create("scoringmodels", NAMESPACE, scoring_model(**spec))
    for plural in CHILDREN:
        await cluster.wait_for(lambda p=plural: cluster.get(p, NAMESPACE, "reranker"), what=plural)  # type: ignore[misc]
    return model
