"""The real operator against the emulated API: invalid specs, autoscaling, optional children, restarts, namespaces."""

from __future__ import annotations

import crd_tools
import pytest
from cluster_actors import set_deployment_status
from harness import NAMESPACE, Cluster, running_cluster, running_operator, scoring_model
from model_checks import condition, created, model_status

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
WRITES = ("create", "patch", "delete", "update")


async def test_a_spec_only_the_operator_can_reject_gives_config_valid_false(operator: Cluster) -> None:
    # The API accepts it (argparse would read --served as --served-name; CEL cannot see abbreviations).
    await operator.create("scoringmodels", NAMESPACE, scoring_model(extraArgs=["--served", "x"]))
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("False", "InvalidSpec"), what="invalid")
    status = model_status(operator)
    assert status["phase"] == "Failed" and "--served-name" in status["conditions"][3]["message"]
    await operator.wait_for(lambda: any(c.resource == "events" and c.verb == "create" for c in operator.emulator.calls),
                            what="a warning event")
    report = await operator.reconciled()
    assert report.error == "InvalidSpec" and report.next_pass_in == 600  # only the resync: no retry loop
    assert operator.get("deployments", NAMESPACE, "reranker") is None
    assert not any(c.resource == "deployments" and c.verb in WRITES for c in operator.emulator.calls)
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"extraArgs": ["--log-level", "debug"]}})
    await operator.wait_for(lambda: operator.get("deployments", NAMESPACE, "reranker"), what="fixed → deployed")
    await operator.wait_for(lambda: condition(operator, "ConfigValid") == ("True", "Valid"))


async def test_the_api_rejects_what_the_crd_can_catch(operator: Cluster) -> None:
    """Every invalid sample, through the API as `kubectl apply` sends it: refused on create with its own message,
    refused as an update of a valid model (which keeps its stored spec), and the operator never acts on either."""
    await created(operator)
    stored = operator.get("scoringmodels", NAMESPACE, "reranker") or {}
    samples = crd_tools.invalid_samples()
    for sample in samples:
        annotations = sample["metadata"]["annotations"]
        # CEL runs on valid schemas
        expected = annotations.get(f"{crd_tools.EXPECT}schema") or annotations[f"{crd_tools.EXPECT}cel"]
        body = {**sample, "metadata": {"name": sample["metadata"]["name"]}}
        with pytest.raises(AssertionError, match="422") as refused:
            await operator.create("scoringmodels", NAMESPACE, body)
        assert expected in str(refused.value), (sample["metadata"]["name"], refused.value)
        if sample["metadata"]["name"] in ("1st-model", "no-model"):
            continue  # about the name, or a spec without a model: not an update of this object
        with pytest.raises(AssertionError, match="422"):
            await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": sample["spec"]})
    after = operator.get("scoringmodels", NAMESPACE, "reranker") or {}
    assert (after["spec"], after["metadata"]["generation"]) == (stored["spec"], 1)  # no refused change stored
    report = await operator.reconciled()
    assert report.wrote == [] and {p.key[1] for p in operator.passes} == {"reranker"}
    assert len(samples) >= 30


async def test_autoscaling_leaves_replicas_to_the_hpa(operator: Cluster) -> None:
    await created(operator, replicas=2, autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 5})
    hpa = await operator.wait_for(lambda: operator.get("horizontalpodautoscalers", NAMESPACE, "reranker"))
    assert hpa["spec"]["maxReplicas"] == 5
    assert "replicas" not in (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]
    await operator.patch("deployments", NAMESPACE, "reranker", {"spec": {"replicas": 4}})  # the HPA scales
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"autoscaling": {"target": 3}}})
    await operator.wait_for(lambda: (operator.get("horizontalpodautoscalers", NAMESPACE, "reranker") or {})[
        "spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "3", what="new target")
    report = await operator.reconciled()
    assert "apply Deployment" not in report.wrote
    assert (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"]["replicas"] == 4  # not fought over
    await set_deployment_status(operator, ready=4)
    await operator.wait_for(lambda: model_status(operator).get("readyReplicas") == 4)
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {"autoscaling": {"enabled": False}}})
    await operator.wait_for(lambda: operator.get("horizontalpodautoscalers", NAMESPACE, "reranker") is None,
                            what="HPA deleted")
    await operator.wait_for(lambda: (operator.get("deployments", NAMESPACE, "reranker") or {})["spec"].get(
        "replicas") == 2, what="fixed replicas back")


async def test_switching_autoscaling_on_keeps_the_live_replica_count(operator: Cluster) -> None:
    """Without the hand-over, dropping spec.replicas from our apply would reset it to 1 until the HPA acts."""
    await created(operator, replicas=3)
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {
        "autoscaling": {"enabled": True, "maxReplicas": 6}}})
    await operator.wait_for(lambda: operator.get("horizontalpodautoscalers", NAMESPACE, "reranker"), what="HPA")
    await operator.reconciled()
    deployment = operator.get("deployments", NAMESPACE, "reranker") or {}
    assert deployment["spec"].get("replicas") == 3
    managers = {f["manager"]: f["fieldsV1"] for f in deployment["metadata"]["managedFields"]}
    assert "f:replicas" not in managers["scorekeeper-operator"]["f:spec"]  # ours no longer …
    assert "f:replicas" in managers["scorekeeper-operator-handover"]["f:spec"]  # … until the HPA writes it


async def test_optional_children_follow_the_spec(operator: Cluster) -> None:
    await created(operator, replicas=3)
    await operator.wait_for(lambda: operator.get("poddisruptionbudgets", NAMESPACE, "reranker"))
    await operator.wait_for(lambda: operator.get("servicemonitors", NAMESPACE, "reranker"))
    await operator.patch("scoringmodels", NAMESPACE, "reranker", {"spec": {
        "replicas": 1, "monitoring": {"serviceMonitor": False}}})
    await operator.wait_for(lambda: operator.get("poddisruptionbudgets", NAMESPACE, "reranker") is None)
    await operator.wait_for(lambda: operator.get("servicemonitors", NAMESPACE, "reranker") is None)


async def test_hf_models_without_downloads_are_config_errors(cluster: Cluster) -> None:
    async with running_operator(cluster, env={"SCOREKEEPER_ALLOW_HF_DOWNLOAD": "false"}):
        await cluster.create("scoringmodels", NAMESPACE, scoring_model(model={"uri": "hf://org/name"}))
        await cluster.wait_for(lambda: condition(cluster, "ConfigValid") == ("False", "ModelSourceUnavailable"))
        assert cluster.get("deployments", NAMESPACE, "reranker") is None


async def test_without_the_monitoring_api_there_is_no_service_monitor() -> None:
    async with running_cluster(service_monitor_api=False) as cluster, running_operator(cluster):
        await created(cluster)
        await cluster.reconciled()
        assert condition(cluster, "ConfigValid") == ("True", "Valid")
        assert not any(c.resource == "servicemonitors" and c.verb != "watch" for c in cluster.emulator.calls)


async def test_resume_after_downtime_and_idempotent_restart(cluster: Cluster) -> None:
    await cluster.create("scoringmodels", NAMESPACE, scoring_model(replicas=2))  # while no operator runs
    async with running_operator(cluster):
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker"), what="resumed")
        await cluster.reconciled()
    before = len(cluster.emulator.calls)
    async with running_operator(cluster):
        report = await cluster.reconciled()
    assert report.wrote == []
    again = cluster.emulator.calls[before:]
    assert [c for c in again if c.verb in WRITES and c.resource != "events"
            and not (c.resource == "scoringmodels" and c.subresource == "")] == []  # kopf's own annotations aside


async def test_namespaced_mode_watches_only_its_namespaces(cluster: Cluster) -> None:
    async with running_operator(cluster, namespaces=(NAMESPACE,)):
        await cluster.create("scoringmodels", "elsewhere", scoring_model(namespace="elsewhere"))
        await created(cluster)
        await cluster.reconciled()
        assert cluster.get("deployments", "elsewhere", "reranker") is None
    operators = [r for r in cluster.emulator if r.resource is not None and r.headers.get("X-Test-Harness") is None]
    assert operators and not any(r.namespace == "elsewhere" for r in operators)
