"""The worker pod, decision by decision: shutdown timing, disk, the spec.pod knobs, NetworkPolicy, KEDA, images."""

from __future__ import annotations

import ast
import copy
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import crd_tools
import kubernetes_validate
import pytest
from harness import scoring_model
from render_cases import COMMIT, FULL_POD, K8S_VERSIONS, SETTINGS, container, model_from, pod_spec, render_all
from scorekeeper_operator.render import optional as render_optional
from scorekeeper_operator.render.manifests import (
    CONFIG_HASH_ANNOTATION,
    GENERATION_ANNOTATION,
    common_labels,
    render,
)
from scorekeeper_operator.render.pod import SHUTDOWN_MARGIN_SECONDS
from scorekeeper_operator.spec import pod_layout
from scorekeeper_operator.spec.model import InvalidSpec, ScoringModel
from scorekeeper_operator.spec.quantity import quantity_bytes


# -- shutdown: preStop pause, drain, grace period ----------------------------------------------------------------------
@pytest.mark.parametrize(("pre_stop", "drain"), [(0, 0), (5, 30), (15, 20), (0, 45), (300, 3600)])
def test_grace_period_is_pause_plus_drain_plus_margin(pre_stop: int, drain: int) -> None:
    rendered = render_all(model_from({"rollout": {"preStopSeconds": pre_stop, "drainSeconds": drain}}))
    worker = container(rendered)
    grace = pod_spec(rendered)["terminationGracePeriodSeconds"]
    assert grace == pre_stop + drain + SHUTDOWN_MARGIN_SECONDS
    assert float(worker["args"][worker["args"].index("--drain-timeout-seconds") + 1]) == drain
    if pre_stop == 0:
        assert "lifecycle" not in worker
        return
    command = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    call = ast.parse(command[2]).body[-1].value  # type: ignore[attr-defined]
    assert ast.unparse(call.func) == "time.sleep" and call.args[0].value == pre_stop  # the pause, exactly


# -- disk: emptyDirs, the download, the cache PVC, the ephemeral-storage request ---------------------------------------
def _volumes(rendered: Any) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(rendered)["volumes"]}


def _mounts(rendered: Any, name: str) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(rendered, name)["volumeMounts"]}


@pytest.mark.parametrize(("source", "download"), [
    ({"uri": "pvc://models/x"}, None),
    ({"uri": "hf://org/name", "revision": COMMIT}, "20Gi"),
    ({"uri": "hf://org/name", "revision": COMMIT, "downloadSizeLimit": "3Gi"}, "3Gi"),
    ({"uri": "hf://org/name", "revision": COMMIT, "downloadSizeLimit": 1500000000}, "1500000000"),
    ({"uri": "hf://org/name", "revision": COMMIT, "cache": {"claimName": "hub"}}, None),
])
def test_ephemeral_storage_request_covers_every_disk_backed_empty_dir(source: dict[str, Any],
                                                                      download: str | None) -> None:
    rendered = render_all(model_from({"model": source}))
    volumes = _volumes(rendered)
    disk = [v["emptyDir"]["sizeLimit"] for v in volumes.values()
            if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"]
    assert sorted(disk) == sorted([pod_layout.TMP_SIZE_LIMIT, pod_layout.CACHE_SIZE_LIMIT, *([download] if download
                                                                                             else [])])
    requested = container(rendered)["resources"]["requests"]["ephemeral-storage"]
    assert 0 <= quantity_bytes(requested) - sum(quantity_bytes(size) for size in disk) < 2**20  # whole MiB, rounded up
    if download is not None:
        assert volumes["model"]["emptyDir"] == {"sizeLimit": download}
        init_env = {e["name"]: e.get("value") for e in container(rendered, "download-model")["env"]}
        assert int(init_env["HF_SIZE_LIMIT_BYTES"]) == quantity_bytes(download)  # checked before downloading


def test_both_containers_report_why_they_failed_in_the_termination_message() -> None:
    """status reads the reason from there (ModelLoadFailed, a failed download's CrashLoopBackOff message)."""
    rendered = render_all(model_from({"model": {"uri": "hf://org/name", "revision": COMMIT}}))
    for name in ("worker", "download-model"):
        assert container(rendered, name)["terminationMessagePolicy"] == "FallbackToLogsOnError", name


def test_the_cache_pvc_is_written_by_the_download_and_read_only_for_the_worker() -> None:
    rendered = render_all(model_from({"model": {"uri": "hf://org/name", "revision": COMMIT,
                                                "cache": {"claimName": "hub"}}}))
    assert _volumes(rendered)["model"] == {"name": "model", "persistentVolumeClaim": {"claimName": "hub"}}
    assert _mounts(rendered, "worker")["model"]["readOnly"] is True
    assert "readOnly" not in _mounts(rendered, "download-model")["model"]
    assert pod_spec(rendered)["securityContext"]["fsGroup"] == pod_layout.WORKER_GID  # the PVC is writable for it


def test_writable_paths_are_empty_dirs_and_the_caches_point_into_them() -> None:
    rendered = render_all(model_from({}))
    worker = container(rendered)
    mounted = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    volumes = _volumes(rendered)
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["value"] for e in worker["env"]}
    for variable in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                     "CUDA_CACHE_PATH"):
        root = next(path for path in mounted if env[variable] == path or env[variable].startswith(path + "/"))
        assert "emptyDir" in volumes[mounted[root]], variable


# -- spec.pod ----------------------------------------------------------------------------------------------------------
def test_pod_knobs_reach_the_pod() -> None:
    spec = {"model": {"uri": "hf://org/name", "revision": COMMIT}, "pod": FULL_POD}
    rendered = render_all(model_from(spec))
    pod, template = pod_spec(rendered), rendered.get("Deployment")["spec"]["template"]  # type: ignore[index]
    assert pod["serviceAccountName"] == "scorer" and pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["runtimeClassName"] == "nvidia"
    for name in ("worker", "download-model"):
        env = [e["name"] for e in container(rendered, name)["env"]]
        assert env[-2:] == ["HTTPS_PROXY", "POD_IP"]  # after the operator's own
        assert container(rendered, name)["envFrom"] == FULL_POD["envFrom"]
    assert [v["name"] for v in pod["volumes"]][-3:] == ["ca", "vault", "scratch"]
    assert template["metadata"]["labels"] == {"team": "search", **common_labels("reranker")}
    assert template["metadata"]["annotations"] == {"example.com/owner": "search",
                                                   CONFIG_HASH_ANNOTATION: rendered.config_hash}
    spread = pod["topologySpreadConstraints"]
    assert spread[0]["labelSelector"] == {"matchLabels": rendered.get("Deployment")["spec"]["selector"][  # type: ignore[index]
        "matchLabels"]}  # no selector given: this model's pods
    assert spread[1]["labelSelector"] == FULL_POD["topologySpreadConstraints"][1]["labelSelector"]


def test_a_pod_knob_change_rolls_the_pods() -> None:
    base = render_all(model_from({})).config_hash
    assert render_all(model_from({"pod": {"labels": {"team": "b"}}})).config_hash != base
    assert render_all(model_from({"pod": {"env": [{"name": "A", "value": "1"}]}})).config_hash != base


@pytest.mark.parametrize(("pod", "message"), [
    ({"volumeMounts": [{"name": "missing", "mountPath": "/data"}]}, "names no volume"),
    ({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/models/x"}]},
     "overlaps a path the operator mounts"),
    ({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/var/cache"}]},
     "overlaps a path the operator mounts"),
    ({"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "secret": {"secretName": "s"}}]}, "unique"),
    ({"volumes": [{"name": "d", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "exactly one source"),
    ({"env": [{"name": "SCOREKEEPER_LOG_LEVEL", "value": "debug"}]}, "SCOREKEEPER_*"),
    ({"env": [{"name": "HOME", "value": "/root"}]}, "the operator sets these"),
    ({"labels": {"app.kubernetes.io/name": "x"}}, "selector and identity labels"),
    ({"annotations": {"scorekeeper.dev/config-hash": "x"}}, "belongs to the operator"),
])
def test_pod_knobs_cannot_undo_the_operators_settings(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message.replace("*", r"\*")):
        ScoringModel.from_body(scoring_model(pod=pod))


def test_reserved_names_agree_with_the_renderer_and_the_crd() -> None:
    assert set(common_labels("x")) == pod_layout.RESERVED_LABELS
    pod = pod_spec(render_all(model_from({"model": {"uri": "hf://o/n", "revision": COMMIT,
                                                    "tokenSecretRef": {"name": "t"}},
                                          "auth": {"apiKeySecretRef": {"name": "keys"}}})))
    assert {v["name"] for v in pod["volumes"]} == pod_layout.RESERVED_VOLUMES
    set_env = {e["name"] for c in [*pod["initContainers"], *pod["containers"]] for e in c["env"]}
    assert set_env <= pod_layout.RESERVED_ENV | set(pod_layout.NO_GPUS_ENV)
    schema = crd_tools.version_schema()["properties"]["spec"]["properties"]["pod"]["properties"]
    env_rule, nvidia_rule = (rule["rule"] for rule in schema["env"]["x-kubernetes-validations"])
    assert f"'{pod_layout.NVIDIA_ENV_PREFIX}'" in nvidia_rule and all(name.startswith(pod_layout.NVIDIA_ENV_PREFIX)
                                                                      for name in pod_layout.NO_GPUS_ENV)
    assert env_rule.count("'") // 2 == len(pod_layout.RESERVED_ENV) + 1  # the names, and the SCOREKEEPER_ prefix
    assert all(f"'{name}'" in env_rule for name in pod_layout.RESERVED_ENV)
    assert all(f"'{label}'" in schema["labels"]["x-kubernetes-validations"][0]["rule"]
               for label in pod_layout.RESERVED_LABELS)


# -- NetworkPolicy -----------------------------------------------------------------------------------------------------
def _policy(spec: dict[str, Any]) -> dict[str, Any]:
    policy = render_all(model_from({"networkPolicy": {"enabled": True, **spec}})).get("NetworkPolicy")
    assert policy is not None
    return policy


def test_network_policy_defaults_to_the_namespace_and_the_monitoring_namespace() -> None:
    policy = _policy({})
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "scorekeeper-worker",
                                                             "app.kubernetes.io/instance": "reranker"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: the download needs the Hub
    scoring, metrics = policy["spec"]["ingress"]  # the API port from this namespace, metrics from monitoring
    assert scoring == {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": "http"}]}
    assert metrics == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                       "ports": [{"protocol": "TCP", "port": "metrics"}]}


def test_network_policy_follows_the_services_ports() -> None:
    """Scoring and metrics have their own container ports, so they get separate sources; a Service whose metrics
    port shared the API port would get one rule with both sources."""
    model = model_from({"networkPolicy": {"enabled": True, "monitoringNamespace": "obs", "from": [
        {"namespaceSelector": {"matchLabels": {"team": "search"}}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]}})
    service = copy.deepcopy(render_all(model).get("Service"))
    assert service is not None
    shared = copy.deepcopy(service)
    shared["spec"]["ports"][1]["targetPort"] = "http"
    (rule,) = render_optional.network_policy(model, {"name": "reranker"}, {"a": "b"}, shared)["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "http"}] and len(rule["from"]) == 3
    policy = render_optional.network_policy(model, {"name": "reranker"}, {"a": "b"}, service)
    scoring, metrics = policy["spec"]["ingress"]
    assert scoring == {"from": [{"namespaceSelector": {"matchLabels": {"team": "search"}}},
                                {"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"protocol": "TCP", "port": "http"}]}
    assert metrics == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}],
                       "ports": [{"protocol": "TCP", "port": "metrics"}]}
    for version in K8S_VERSIONS:
        kubernetes_validate.validate({**policy, "apiVersion": "networking.k8s.io/v1"}, version, strict=True)


# -- KEDA --------------------------------------------------------------------------------------------------------------
KEDA = {"enabled": True, "provider": "KEDA", "prometheusAddress": "http://prom:9090", "minReplicas": 2,
        "maxReplicas": 7, "target": 64}


def test_keda_scaled_object_replaces_the_hpa() -> None:
    rendered = render_all(model_from({"autoscaling": KEDA}))
    scaled = rendered.get("ScaledObject")
    assert scaled is not None and rendered.get("HorizontalPodAutoscaler") is None
    assert "replicas" not in rendered.get("Deployment")["spec"]  # type: ignore[index]  # KEDA's HPA owns it
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker"}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 7)
    # status reads the Autoscaling condition from the HPA KEDA creates: its name is fixed, not left to KEDA
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["name"] == "keda-hpa-reranker"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger == {"type": "prometheus", "metricType": "AverageValue", "metadata": {
        "serverAddress": "http://prom:9090", "threshold": "64",
        "query": 'sum(scorekeeper_queue_depth{namespace="ml",service="reranker"})'}}
    custom = render_all(model_from({"autoscaling": {**KEDA, "prometheusQuery": "sum(up)"}})).get("ScaledObject")
    assert custom is not None and custom["spec"]["triggers"][0]["metadata"]["query"] == "sum(up)"
    assert render_all(model_from({"autoscaling": KEDA}), keda_api=False).get("ScaledObject") is None


# -- images, GPUs, revisions -------------------------------------------------------------------------------------------
def test_the_deployment_records_the_generation_it_was_rendered_from() -> None:
    """What tells a spec change (rolled at once) from an operator change (paced, pacing.py); on the Deployment, not
    its pod template, so that writing it rolls nothing."""
    rendered = render(model_from({}), SETTINGS, service_monitor_api=False)
    deployment = rendered.get("Deployment")
    assert deployment is not None and rendered.worker_image == SETTINGS.worker_image
    assert deployment["metadata"]["annotations"] == {GENERATION_ANNOTATION: "3"}
    assert GENERATION_ANNOTATION not in deployment["spec"]["template"]["metadata"].get("annotations", {})
    own = render(model_from({"image": "mine:2"}), SETTINGS, service_monitor_api=False)
    assert container(own)["image"] == "mine:2" and own.worker_image == "mine:2"


def test_more_than_one_gpu_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidSpec, match="reserved and idle; scale out with replicas"):
        ScoringModel.from_body(scoring_model(resources={"gpu": {"count": 2}}))


def test_a_recorded_resolution_counts_only_for_the_same_uri_and_revision() -> None:
    source = {"uri": "hf://org/name", "revision": "main"}
    recorded = {"model": {**source, "resolvedRevision": COMMIT}}
    assert model_from({"model": source}, status=recorded).hf_commit == COMMIT
    assert model_from({"model": {**source, "revision": "v2"}}, status=recorded).hf_commit is None
    assert model_from({"model": {**source, "uri": "hf://org/other"}}, status=recorded).hf_commit is None
    pinned = model_from({"model": {"uri": "hf://org/name", "revision": COMMIT}})
    assert pinned.hf_commit == COMMIT and pinned.model_status() == {"uri": "hf://org/name", "revision": COMMIT,
                                                                    "resolvedRevision": COMMIT}


def test_status_reports_the_revision_and_the_images() -> None:
    from scorekeeper_operator.status.compute import ConfigError, Desired, Observed, compute_status

    now_utc = datetime(2026, 1, 1, tzinfo=UTC)
    model = model_from({"model": {"uri": "hf://org/name", "revision": COMMIT}})
    result = replace(render(model, SETTINGS, service_monitor_api=False), worker_image="old:1")  # what runs

    def status(rendered: Any, previous: dict[str, Any], **fields: Any) -> dict[str, Any]:
        desired = Desired(generation=1, selector="s", endpoint="e", rendered=rendered, fixed_replicas=1, **fields)
        return compute_status(desired, Observed(None), previous, now_utc).status

    now = status(result, {}, model_source=model.model_status(), pending_image="new:2", pending_config_hash="c0ffee")
    assert now["model"] == {"uri": "hf://org/name", "revision": COMMIT, "resolvedRevision": COMMIT}
    assert (now["workerImage"], now["pendingWorkerImage"], now["pendingConfigHash"]) == ("old:1", "new:2", "c0ffee")
    broken = status(None, now, config_error=ConfigError("InvalidSpec", "x"), model_source=now["model"])
    assert broken["workerImage"] == "old:1" and broken["model"] == now["model"]  # what the pods still run
    assert "pendingWorkerImage" not in broken and "pendingConfigHash" not in broken
