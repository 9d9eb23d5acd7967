"""`kubectl scale sm` with autoscaling on is refused by the CRD (a CEL transition rule on spec), not ignored.

The scale subresource writes spec.replicas and goes through the object's full validation, transition rules included
(apiextensions-apiserver: ScaleREST.Update → the custom resource strategy's ValidateUpdate). The emulator does the
same, and the real kubectl is pointed at it where it is installed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

import crd_tools
import pytest
from harness import NAMESPACE, Cluster, scoring_model

REFUSED = "spec.replicas cannot change while autoscaling is enabled"


def spec(replicas: int, autoscaling: bool, **extra: Any) -> dict[str, Any]:
    body = scoring_model(replicas=replicas, autoscaling={"enabled": autoscaling, "maxReplicas": 8}, **extra)
    defaulted: dict[str, Any] = crd_tools.apply_defaults(crd_tools.version_schema(), body)
    return defaulted


@pytest.mark.parametrize(("old", "new", "refused"), [
    (spec(2, True), spec(3, True), True),  # kubectl scale while the HPA owns the count
    (spec(2, True), spec(2, True, image="other:1"), False),  # any other change is fine
    (spec(2, True), spec(3, False), False),  # switching autoscaling off and setting the count
    (spec(2, False), spec(3, True), False),  # switching it on (replicas is ignored from now on)
    (spec(2, False), spec(5, False), False),  # plain scaling
])
def test_replicas_cannot_change_under_an_autoscaler(old: dict[str, Any], new: dict[str, Any], refused: bool) -> None:
    errors = crd_tools.cel_errors(new, old)
    assert any(REFUSED in error for error in errors) is refused, errors


def test_transition_rules_do_not_run_on_create() -> None:
    assert crd_tools.cel_errors(spec(3, True)) == []


async def scale(cluster: Cluster, replicas: int) -> dict[str, Any]:
    """What `kubectl scale sm/reranker --replicas=N` sends (kubectl -v=6 shows it): a merge patch of the scale."""
    return await cluster._send("PATCH", f"/apis/scorekeeper.dev/v1alpha1/namespaces/{NAMESPACE}/scoringmodels/reranker"
                               "/scale", {"spec": {"replicas": replicas}}, "application/merge-patch+json")


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_the_scale_subresource_scales_or_refuses(operator: Cluster) -> None:
    await operator.create("scoringmodels", NAMESPACE, scoring_model(replicas=1))
    result = await scale(operator, 3)
    assert result["kind"] == "Scale" and result["spec"]["replicas"] == 3
    await operator.wait_for(lambda: (operator.get("deployments", NAMESPACE, "reranker") or {}).get("spec", {}).get(
        "replicas") == 3, what="the Deployment scaled")
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"autoscaling": {"enabled": True}}})
    with pytest.raises(AssertionError, match=f"422.*{REFUSED}"):
        await scale(operator, 5)
    assert (operator.get("scoringmodels", NAMESPACE, "reranker") or {})["spec"]["replicas"] == 3


@pytest.mark.asyncio
@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs the kubectl binary")
async def test_kubectl_scale_says_why_it_is_refused(cluster: Cluster) -> None:
    await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling={"enabled": True}))
    command = ["kubectl", "scale", "scoringmodel/reranker", "--replicas=3", "-n", NAMESPACE]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, env=os.environ,
                                   timeout=50)
    assert done.returncode != 0 and REFUSED in done.stderr, done.stderr
    assert (cluster.get("scoringmodels", NAMESPACE, "reranker") or {})["spec"]["replicas"] == 1
