"""Render the Helm chart for real (Helm's own Go library through `helm_python`, no helm binary, no cluster).

Every values set is rendered once per process (`render`, cached) and shared by all chart tests. A module with a
unique name (not conftest.py) so that `from chart_render import ...` cannot pick up another directory's conftest.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "scorekeeper"
RELEASE = "sk"
NAMESPACE = "scorekeeper-system"

# Values sets rendered by the tests: the defaults, everything switched to its non-default branch, and a minimal
# install into a cluster whose CRD, ServiceAccount and RBAC are managed by someone else.
VALUES: dict[str, dict[str, Any]] = {
    "default": {},
    "full": {
        "fullnameOverride": "scorekeeper-operator",
        "image": {"repository": "registry.example.com/ml/scorekeeper-operator",
                  "digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
        "workerImage": {"repository": "registry.example.com/ml/scorekeeper-worker", "tag": "0.1.0-cu128"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {"watchNamespaces": ["ml", "ml-staging"], "logLevel": "debug", "allowHfDownload": False,
                     "retry": {"baseSeconds": 0.5, "maxSeconds": 60}, "healthPort": 8181,
                     "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
                     "huggingFace": {"endpoint": "https://hf-mirror.example.com",
                                     "tokenSecret": {"name": "hub-token", "key": "hf"}},
                     "maxConcurrentUpgrades": 3, "metricsPort": 9191},
        "networkPolicy": {"enabled": True, "monitoringNamespace": "observability"},
        "crds": {"keep": False, "annotations": {"example.com/owner": "ml-platform"}},
        "serviceAccount": {"name": "scorekeeper", "annotations": {"example.com/role": "scorekeeper"}},
        "podAnnotations": {"example.com/scrape": "false"},
        "podLabels": {"team": "ml-platform"},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
        "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 6},
        "terminationGracePeriodSeconds": 60,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "5s",
                           "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "ML"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "external": {
        "crds": {"install": False},
        "serviceAccount": {"create": False, "name": "preexisting"},
        "rbac": {"create": False},
    },
}


@dataclass(frozen=True)
class Rendered:
    """One rendering of the chart: the manifests (parsed) and the raw text per template."""

    templates: dict[str, str]
    manifests: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return containers[0]

    @property
    def env(self) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in self.container.get("env", [])}

    @property
    def operator_cluster_role(self) -> dict[str, Any]:
        """The ClusterRole bound to the operator (the aggregated roles for people are ClusterRoles too)."""
        bound = self.one("ClusterRoleBinding")["roleRef"]["name"]
        (role,) = [r for r in self.of_kind("ClusterRole") if r["metadata"]["name"] == bound]
        return role


@functools.cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render_raw(values: dict[str, Any]) -> dict[str, str]:
    """Helm's own render (values merged over values.yaml, checked against values.schema.json)."""
    return _chart().render(values, name=RELEASE, namespace=NAMESPACE)


@functools.cache
def _render_cached(values_json: str) -> Rendered:
    templates = render_raw(json.loads(values_json))
    manifests = tuple(doc for name, text in sorted(templates.items()) if name.endswith((".yaml", ".yml"))
                      for doc in yaml.safe_load_all(text) if doc)
    return Rendered(templates, manifests)


def render(values: dict[str, Any]) -> Rendered:
    return _render_cached(json.dumps(values, sort_keys=True))


def merged_values(values: dict[str, Any]) -> dict[str, Any]:
    """values.yaml with `values` coalesced over it, as Helm does on install."""
    return _chart().merge_values(values)
