"""What the render tests share: ScoringModels built from specs, a matrix of pod variants (model sources × the
spec.pod knobs × autoscalers × NetworkPolicy), and strict validation of every rendered manifest: `kubernetes-validate`
(unknown fields are errors) for built-in kinds, for each supported Kubernetes version, and the subset of KEDA's
ScaledObject schema that the operator writes."""

from __future__ import annotations

import itertools
import json
from typing import Any

import crd_tools
import jsonschema
import kubernetes_validate
from harness import scoring_model
from scorekeeper_operator.render.manifests import Rendered, render
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings

K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
SETTINGS = OperatorSettings(worker_image="registry.example/worker:1")
COMMIT = "0123456789abcdef0123456789abcdef01234567"

SOURCES: dict[str, dict[str, Any]] = {
    "pvc": {"uri": "pvc://models/qwen3"},
    "file": {"uri": "file:///opt/models/all-MiniLM-L6-v2"},
    "hf": {"uri": "hf://BAAI/bge-reranker-v2-m3", "revision": COMMIT, "tokenSecretRef": {"name": "hf"}},
    "hf-cache": {"uri": "hf://Qwen/Qwen3-Reranker-0.6B", "revision": COMMIT, "cache": {"claimName": "hub-cache"},
                 "downloadSizeLimit": "4Gi"},
    "hf-gguf": {"uri": "hf://org/name-GGUF/quant/m-Q4_K_M.gguf", "revision": COMMIT},
}
FULL_POD: dict[str, Any] = {
    "serviceAccountName": "scorer",
    "imagePullSecrets": [{"name": "regcred"}],
    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    "envFrom": [{"configMapRef": {"name": "scorer-env"}},
                {"prefix": "S_", "secretRef": {"name": "s", "optional": True}}],
    "volumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}},
                {"name": "vault", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}],
    "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True},
                     {"name": "vault", "mountPath": "/var/run/secrets/vault", "readOnly": True},
                     {"name": "scratch", "mountPath": "/scratch"}],
    "labels": {"team": "search"},
    "annotations": {"example.com/owner": "search"},
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"app.kubernetes.io/part-of": "scorekeeper"}},
         "matchLabelKeys": ["pod-template-hash"], "minDomains": 2, "nodeAffinityPolicy": "Ignore"}],
}
KNOBS: dict[str, dict[str, Any]] = {"none": {}, "full": FULL_POD}
SCALING: dict[str, dict[str, Any]] = {
    "fixed": {"replicas": 2},
    "hpa": {"autoscaling": {"enabled": True, "maxReplicas": 5}},
    "keda": {"autoscaling": {"enabled": True, "maxReplicas": 5, "provider": "KEDA",
                             "prometheusAddress": "http://prometheus.monitoring.svc:9090"}},
}
POD_VARIANTS = list(itertools.product(SOURCES, KNOBS, SCALING, [False, True]))


def model_from(spec: dict[str, Any], name: str = "reranker", status: dict[str, Any] | None = None) -> ScoringModel:
    body = scoring_model(name, **spec)
    body["metadata"].update(uid="0b7c-uid", generation=3)
    if status is not None:
        body["status"] = status
    return ScoringModel.from_body(body)


def sample_model(doc: dict[str, Any]) -> ScoringModel:
    """A sample or example as the API stores it (CRD defaults applied) and as the operator sees it once an hf://
    revision is resolved (status.model)."""
    body = crd_tools.apply_defaults(crd_tools.version_schema(), doc)
    body["metadata"] = {"namespace": "ml", **body["metadata"], "uid": "uid-1"}
    source = body["spec"]["model"]
    if source["uri"].startswith("hf://"):
        body["status"] = {"model": {**source, "resolvedRevision": COMMIT}}
    return ScoringModel.from_body(body)


def variant_spec(source: str, knobs: str, scaling: str, policy: bool) -> dict[str, Any]:
    return {"model": SOURCES[source], "pod": KNOBS[knobs], **SCALING[scaling],
            "networkPolicy": {"enabled": policy, "from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}}


def render_all(model: ScoringModel, **apis: bool) -> Rendered:
    return render(model, SETTINGS, service_monitor_api=apis.get("service_monitor_api", True),
                  keda_api=apis.get("keda_api", True))


_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name", "namespace"]}
# keda.sh/v1alpha1 ScaledObject (kedacore/keda config/crd/bases/keda.sh_scaledobjects.yaml), the fields rendered.
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"}, "metadata": _META,
        "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                 "properties": {
                     "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                       "name": {"type": "string"}}},
                     "minReplicaCount": {"type": "integer", "minimum": 0},
                     "maxReplicaCount": {"type": "integer", "minimum": 1},
                     "pollingInterval": {"type": "integer", "minimum": 1},
                     "advanced": {"type": "object", "additionalProperties": False, "properties": {
                         "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False,
                                                           "properties": {"name": {"type": "string"},
                                                                          "behavior": {"type": "object"}}}}},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                         "properties": {"type": {"type": "string"},
                                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                        "metadata": {**_STRING_MAP, "required": ["serverAddress", "query",
                                                                                 "threshold"]}}}},
                 }},
    },
}
_VALIDATED: set[tuple[str, str]] = set()


def validate(manifest: dict[str, Any], version: str) -> None:
    """Strict validation; identical manifests (a Service is the same across most specs) only once per version."""
    key = (json.dumps(manifest, sort_keys=True), version)
    if key in _VALIDATED:
        return
    if manifest["kind"] == "ScaledObject":
        jsonschema.validate(manifest, SCALED_OBJECT_SCHEMA)
        # The HPA KEDA creates takes the behavior as is: it must be a valid autoscaling/v2 behavior.
        behavior = manifest["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
               "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2, "behavior": behavior}}
        kubernetes_validate.validate(hpa, version, strict=True)
    elif manifest["kind"] != "ServiceMonitor":  # a CRD without a bundled schema (the chart tests check its fields)
        kubernetes_validate.validate(manifest, version, strict=True)
    _VALIDATED.add(key)


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    deployment = rendered.get("Deployment")
    assert deployment is not None
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(rendered: Rendered, name: str = "worker") -> dict[str, Any]:
    pod = pod_spec(rendered)
    return next(c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] == name)
