"""Add-on APIs with the real operator against the emulator: KEDA's ScaledObject replaces the HPA when KEDA is served
(and the HPA KEDA creates feeds the Autoscaling condition), and a KEDA ScoringModel in a cluster without KEDA says so
instead of silently running unscaled, and looks again by itself."""

from __future__ import annotations

import pytest
from harness import NAMESPACE, running_cluster, running_operator, scoring_model
from model_checks import condition, model_status
from scorekeeper_operator.k8s import DISCOVERY_TTL_SECONDS

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
KEDA = {"enabled": True, "provider": "KEDA", "prometheusAddress": "http://prometheus:9090", "maxReplicas": 5}


async def test_keda_scales_the_deployment_instead_of_an_hpa() -> None:
    async with running_cluster(keda_api=True) as cluster, running_operator(cluster):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling=KEDA))
        scaled = await cluster.wait_for(lambda: cluster.get("scaledobjects", NAMESPACE, "reranker"), what="KEDA")
        assert scaled["spec"]["scaleTargetRef"]["name"] == "reranker"
        deployment = await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker"))
        assert "replicas" not in deployment["spec"]  # KEDA's HPA sets it, not the operator
        assert cluster.get("horizontalpodautoscalers", NAMESPACE, "reranker") is None


async def test_switching_from_hpa_to_keda_completes() -> None:
    """Issue 25: the operator applied the ScaledObject before deleting its own HPA; KEDA's webhook refuses a workload
    another HPA scales, and the HPA was never removed. Ours goes first now."""
    async with running_cluster(keda_api=True) as cluster, running_operator(cluster):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling={"enabled": True}))
        await cluster.wait_for(lambda: cluster.get("horizontalpodautoscalers", NAMESPACE, "reranker"), what="HPA")
        await cluster.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"autoscaling": KEDA}})
        await cluster.wait_for(lambda: cluster.get("scaledobjects", NAMESPACE, "reranker"), what="ScaledObject")
        assert cluster.get("horizontalpodautoscalers", NAMESPACE, "reranker") is None
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("True", "Valid"))
        assert not [p for p in cluster.passes if p.error is not None]  # not even one refusal on the way


async def test_the_keda_webhook_refusing_a_users_hpa_is_named() -> None:
    """A user's own HPA scaling the same Deployment: KEDA's webhook says so, and so does the ScoringModel."""
    async with running_cluster(keda_api=True) as cluster, running_operator(cluster):
        await cluster.create("horizontalpodautoscalers", NAMESPACE, {"metadata": {"name": "by-hand"}, "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker"},
            "minReplicas": 1, "maxReplicas": 3}})
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling=KEDA))
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("False", "AdmissionWebhookDenied"))
        message = next(c["message"] for c in model_status(cluster)["conditions"] if c["type"] == "ConfigValid")
        assert "is already managed by the hpa 'by-hand'" in message
        assert cluster.get("horizontalpodautoscalers", NAMESPACE, "by-hand") is not None  # not ours: left alone


async def test_the_autoscaling_condition_comes_from_the_hpa_keda_creates() -> None:
    async with running_cluster(keda_api=True) as cluster, running_operator(cluster):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling=KEDA))
        scaled = await cluster.wait_for(lambda: cluster.get("scaledobjects", NAMESPACE, "reranker"), what="KEDA")
        await cluster.wait_for(lambda: condition(cluster, "Autoscaling") == ("Unknown", "AutoscalerMissing"))
        # What KEDA does: an HPA of the name the ScaledObject asks for, carrying the ScaledObject's labels.
        name = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["name"]
        await cluster.create("horizontalpodautoscalers", NAMESPACE, {
            "metadata": {"name": name, "labels": scaled["metadata"]["labels"]},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker"},
                     "minReplicas": 1, "maxReplicas": 5}})
        await cluster.patch("horizontalpodautoscalers", NAMESPACE, name, {"status": {
            "currentReplicas": 1, "desiredReplicas": 1, "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
                {"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric",
                 "message": "unable to get external metric s0-prometheus: connection refused"}]}},
            subresource="status")
        await cluster.wait_for(lambda: condition(cluster, "Autoscaling") == ("False", "FailedGetExternalMetric"))
        await cluster.reconciled()
        assert cluster.get("horizontalpodautoscalers", NAMESPACE, name) is not None  # KEDA's: never ours to delete


async def test_without_keda_the_model_reports_it_and_applies_nothing() -> None:
    async with running_cluster(keda_api=False) as cluster, running_operator(cluster):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(autoscaling=KEDA))
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("False", "KedaUnavailable"))
        message = next(c["message"] for c in model_status(cluster)["conditions"] if c["type"] == "ConfigValid")
        assert "install KEDA" in message
        assert cluster.get("deployments", NAMESPACE, "reranker") is None
        report = await cluster.reconciled()  # no event announces KEDA's installation: the pass comes back by itself
        assert report.error == "KedaUnavailable" and report.next_pass_in == DISCOVERY_TTL_SECONDS
