"""render(): two matrices of specs (engine settings; pod variants with every spec.pod knob), every manifest
validated strictly for Kubernetes 1.29 … 1.34; then each rendering decision on its own."""

from __future__ import annotations

import itertools
from typing import Any

import crd_tools
import kubernetes_validate
import pytest
from render_cases import (
    COMMIT,
    K8S_VERSIONS,
    POD_VARIANTS,
    SETTINGS,
    container,
    model_from,
    pod_spec,
    render_all,
    sample_model,
    validate,
    variant_spec,
)
from scorekeeper_operator.render.manifests import (
    CONFIG_HASH_ANNOTATION,
    Rendered,
    render,
    selector_labels,
)

MATRIX = list(itertools.product([0, 1], [False, True], [False, True], [False, True], [1, 3]))


def matrix_spec(gpus: int, mis: bool, graphs: bool, autoscaling: bool, replicas: int) -> dict[str, Any]:
    return {"resources": {"gpu": {"count": gpus}, "memory": "16Gi", "cpu": "2"},
            "scoring": {"multiItem": {"enabled": mis, **({"delimiterTokenId": 151643} if mis else {})}},
            "cudaGraph": {"enabled": graphs, "tokenBuckets": [128, 256], "maxTokens": 512},
            "autoscaling": {"enabled": autoscaling, "minReplicas": 1, "maxReplicas": replicas},
            "replicas": replicas}


def by_kind(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in rendered.manifests}


@pytest.mark.parametrize(("gpus", "mis", "graphs", "autoscaling", "replicas"), MATRIX)
def test_matrix_renders_valid_manifests(gpus: int, mis: bool, graphs: bool, autoscaling: bool, replicas: int) -> None:
    model = model_from(matrix_spec(gpus, mis, graphs, autoscaling, replicas))
    rendered = render(model, SETTINGS, service_monitor_api=True)
    kinds = by_kind(rendered)
    for manifest, version in itertools.product(rendered.manifests, K8S_VERSIONS):
        validate(manifest, version)

    assert {"ConfigMap", "Service", "Deployment", "ServiceMonitor"} <= set(kinds)
    assert ("PodDisruptionBudget" in kinds) == (replicas > 1)
    assert ("HorizontalPodAutoscaler" in kinds) == autoscaling
    deployment = kinds["Deployment"]
    assert ("replicas" in deployment["spec"]) == (not autoscaling)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert ("--multi-item-scoring" in args) == mis and ("--no-multi-item-scoring" in args) == (not mis)
    assert ("--cuda-graph" in args) == graphs and ("--no-cuda-graph" in args) == (not graphs)
    assert args[args.index("--device") + 1] == ("cuda" if gpus else "cpu")
    assert args[args.index("--cuda-graph-token-buckets") + 1] == "128,256"
    limits = container["resources"].get("limits", {})
    assert ("nvidia.com/gpu" in limits) == bool(gpus)
    for manifest in rendered.manifests:
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel", "name": "reranker",
                         "uid": "0b7c-uid", "controller": True, "blockOwnerDeletion": True}
        assert manifest["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize(("source", "knobs", "scaling", "policy"), POD_VARIANTS)
def test_pod_variants_render_valid_manifests(source: str, knobs: str, scaling: str, policy: bool) -> None:
    rendered = render_all(model_from(variant_spec(source, knobs, scaling, policy)))
    for manifest, version in itertools.product(rendered.manifests, K8S_VERSIONS):
        validate(manifest, version)
    kinds = by_kind(rendered)
    assert ("NetworkPolicy" in kinds) == policy
    assert ("ScaledObject" in kinds) == (scaling == "keda") and ("HorizontalPodAutoscaler" in kinds) == (
        scaling == "hpa")
    assert ("replicas" in kinds["Deployment"]["spec"]) == (scaling == "fixed")
    pod = pod_spec(rendered)
    assert [c["name"] for c in pod.get("initContainers", [])] == (["download-model"] if source.startswith("hf") else [])
    if knobs == "full":
        for name in [c["name"] for c in [*pod.get("initContainers", []), *pod["containers"]]]:
            mounts = {m["mountPath"] for m in container(rendered, name)["volumeMounts"]}
            assert {"/etc/ssl/corporate", "/var/run/secrets/vault"} <= mounts  # a CA bundle reaches the download


def test_gpu_pod_resources_probes_and_strategy() -> None:
    rendered = render(model_from({"resources": {"gpu": {"count": 1}, "memory": "32Gi"},
                                  "rollout": {"maxStartupSeconds": 3600, "drainSeconds": 45}}), SETTINGS,
                      service_monitor_api=False)
    deployment = by_kind(rendered)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {"requests": {"ephemeral-storage": "5120Mi", "memory": "32Gi",
                                                   "nvidia.com/gpu": "1"},
                                      "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"}}
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/ready", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600  # the whole model-load budget
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert pod["terminationGracePeriodSeconds"] > 45  # longer than the worker's drain
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one GPU replica: no spare GPU to surge into
    assert deployment["spec"]["progressDeadlineSeconds"] > 3600
    assert deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == rendered.config_hash


def test_cpu_rolls_with_surge_and_service_exposes_http_and_metrics() -> None:
    kinds = by_kind(render(model_from({"replicas": 3}), SETTINGS, service_monitor_api=True))
    assert kinds["Deployment"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    ports = {p["name"]: p for p in kinds["Service"]["spec"]["ports"]}
    # Each Service port reaches the container port of its name: the API, and /metrics alone (--metrics-port).
    assert {name: p["targetPort"] for name, p in ports.items()} == {"http": "http", "metrics": "metrics"}
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "metrics": 9090}
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == "9090" and ports["metrics"]["port"] == 9090
    assert container["readinessProbe"]["httpGet"]["port"] == "http"  # probes stay on the API port, open
    assert kinds["Service"]["spec"]["selector"] == selector_labels("reranker")
    assert kinds["ServiceMonitor"]["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics",
                                                               "interval": "30s"}
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("key", [None, "api-keys.txt"])
def test_api_key_secret_is_mounted_read_only_and_passed_to_the_worker(key: str | None) -> None:
    ref = {"name": "scorer-keys", **({"key": key} if key else {})}
    rendered = render(model_from({"auth": {"apiKeySecretRef": ref}}), SETTINGS, service_monitor_api=True)
    kinds = by_kind(rendered)
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--api-key-file") + 1] == "/etc/scorekeeper-auth/keys"
    assert "api_key_file: /etc/scorekeeper-auth/keys" in kinds["ConfigMap"]["data"]["worker.yaml"]
    volume = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert volume["secret"] == {"secretName": "scorer-keys", "items": [{"key": key or "keys", "path": "keys"}]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": "/etc/scorekeeper-auth", "readOnly": True}  # no subPath
    for manifest, version in itertools.product(rendered.manifests[:3], K8S_VERSIONS[::5]):
        validate(manifest, version)
    # A different Secret rolls the pods (it is part of the pod template); without auth nothing is mounted.
    other = render(model_from({"auth": {"apiKeySecretRef": {"name": "other"}}}), SETTINGS, service_monitor_api=True)
    assert other.config_hash != rendered.config_hash
    plain = by_kind(render(model_from({}), SETTINGS, service_monitor_api=True))["Deployment"]
    assert "--api-key-file" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all(v["name"] != "api-keys" for v in plain["spec"]["template"]["spec"]["volumes"])


def test_hpa_scales_the_deployment_on_the_queue_metric() -> None:
    model = model_from({"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 9, "target": 7}})
    hpa = by_kind(render(model, SETTINGS, service_monitor_api=False))["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reranker"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 9)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "scorekeeper_queue_depth"}, "target": {"type": "AverageValue", "averageValue": "7"}}}]


def test_service_monitor_only_when_the_api_exists_and_is_wanted() -> None:
    assert "ServiceMonitor" not in by_kind(render(model_from({}), SETTINGS, service_monitor_api=False))
    unwanted = model_from({"monitoring": {"serviceMonitor": False}})
    assert "ServiceMonitor" not in by_kind(render(unwanted, SETTINGS, service_monitor_api=True))
    labeled = model_from({"monitoring": {"labels": {"release": "kps"}}})
    monitor = by_kind(render(labeled, SETTINGS, service_monitor_api=True))["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"


@pytest.mark.parametrize(("uri", "model_flag", "volume"), [
    ("pvc://store/qwen/v1", "/models/qwen/v1", {"claimName": "store", "readOnly": True}),
    ("pvc://store", "/models", {"claimName": "store", "readOnly": True}),
    ("file:///opt/models/minilm", "/opt/models/minilm", None),
    ("hf://BAAI/bge-reranker-v2-m3", f"/models/BAAI/bge-reranker-v2-m3/{COMMIT}", None),
    ("hf://org/m-GGUF/q/m.Q4.gguf", f"/models/org/m-GGUF/{COMMIT}/q/m.Q4.gguf", None),
])
def test_model_sources(uri: str, model_flag: str, volume: dict[str, Any] | None) -> None:
    source = {"uri": uri, **({"revision": COMMIT} if uri.startswith("hf://") else {})}
    deployment = by_kind(render(model_from({"model": source}), SETTINGS, service_monitor_api=False))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--model") + 1] == model_flag
    volumes = {v["name"]: v for v in pod["volumes"]}
    if volume is not None:
        assert volumes["model"]["persistentVolumeClaim"] == volume
    assert ("initContainers" in pod) == uri.startswith("hf://")  # the worker itself names a model path not there
    if uri.startswith("file://"):
        assert "model" not in volumes


def test_hf_download_init_container_takes_inputs_from_env_and_secret() -> None:
    spec = {"model": {"uri": "hf://org/name", "revision": "v2", "tokenSecretRef": {"name": "hf", "key": "t"}}}
    status = {"model": {"uri": "hf://org/name", "revision": "v2", "resolvedRevision": COMMIT}}
    pod = by_kind(render(model_from(spec, status=status), SETTINGS, service_monitor_api=False))["Deployment"][
        "spec"]["template"]
    (init,) = pod["spec"]["initContainers"]
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_REPO_ID"]["value"] == "org/name" and env["HF_REVISION"]["value"] == COMMIT  # the commit, pinned
    assert env["HF_TARGET"]["value"] == f"/models/org/name/{COMMIT}"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "t"}}
    assert env["HF_ENDPOINT"]["value"] == SETTINGS.hf_endpoint
    assert init["command"] == ["python", "-m", "scorekeeper_worker.hub_download"]  # no spec text in a script
    assert init["image"] == SETTINGS.worker_image
    worker_env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert worker_env["HF_HUB_OFFLINE"] == "1"


def test_an_unresolved_hf_revision_cannot_be_rendered() -> None:
    """The reconciler resolves first; rendering a moving branch would let replicas serve different commits."""
    with pytest.raises(ValueError, match="not resolved to a commit"):
        render(model_from({"model": {"uri": "hf://org/name", "revision": "main"}}), SETTINGS,
               service_monitor_api=False)


def test_config_hash_follows_the_spec_and_nothing_else() -> None:
    assert render(model_from({}), SETTINGS, service_monitor_api=False, keda_api=True).config_hash == \
        render(model_from({}), SETTINGS, service_monitor_api=False).config_hash
    base = render(model_from({}), SETTINGS, service_monitor_api=False).config_hash
    assert render(model_from({}), SETTINGS, service_monitor_api=True).config_hash == base
    assert render(model_from({"scoring": {"maxBatchTokens": 4096}}), SETTINGS,
                  service_monitor_api=False).config_hash != base
    assert render(model_from({"image": "other:2"}), SETTINGS, service_monitor_api=False).config_hash != base


def test_image_defaults_to_the_operator_setting() -> None:
    pod = by_kind(render(model_from({}), SETTINGS, service_monitor_api=False))["Deployment"]["spec"]["template"]
    assert pod["spec"]["containers"][0]["image"] == "registry.example/worker:1"
    custom = by_kind(render(model_from({"image": "mine:3"}), SETTINGS, service_monitor_api=False))["Deployment"]
    assert custom["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:3"


def test_scheduling_passes_through() -> None:
    spec = {"scheduling": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "inference",
                           "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
                           "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                               {"weight": 1, "preference": {"matchExpressions": [
                                   {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}}
    deployment = by_kind(render(model_from(spec), SETTINGS, service_monitor_api=False))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["priorityClassName"] == "inference"
    assert pod["affinity"] == spec["scheduling"]["affinity"]
    assert pod["tolerations"] == spec["scheduling"]["tolerations"]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)


@pytest.mark.parametrize("doc", crd_tools.valid_samples(), ids=lambda d: d["metadata"]["name"])
def test_every_valid_sample_and_example_renders_valid_manifests(doc: dict[str, Any]) -> None:
    rendered = render_all(sample_model(doc))
    for manifest, version in itertools.product(rendered.manifests, K8S_VERSIONS):
        validate(manifest, version)
