"""Prometheus scraping as the Prometheus Operator configures it for a ServiceMonitor, without a cluster.

- `scrape_job`: the job the Prometheus Operator generates for one endpoint of a ServiceMonitor
  (generateServiceMonitorConfig, pkg/prometheus/promcfg.go, prometheus-operator v0.93, one shard): `honor_labels`,
  interval, timeout, path, and the `relabel_configs` in the Operator's order. Kubernetes service discovery is replaced
  by a file of targets carrying the labels it would give (file_sd). A ServiceMonitor field this does not translate
  raises, so a rendered ServiceMonitor that starts using one fails the tests until it is handled here.
- `discover`: those labels, for the `endpoints` role: one target per pod and Service port, with the Service's, the
  endpoint's, the pod's and its container port's `__meta_kubernetes_*` labels, from the rendered Service and
  Deployment; `__address__` is where the in-process pod listens.

The relabelling, not the test, then decides every target label (`namespace`, `service`, `pod`, `container`, `job`,
`endpoint`) and whether the worker's own labels survive (`honor_labels`), as in a cluster.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHARD = "0"  # the config reloader substitutes $(SHARD); a Prometheus with one shard is shard 0
MONITOR_FIELDS = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
RelabelConfig = dict[str, Any]


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _label_keeps(selector: dict[str, Any]) -> list[RelabelConfig]:
    """The Service selector as keep/drop rules on the Service's labels (SelectorMechanism Relabel, the default)."""
    rules: list[RelabelConfig] = []
    for key in sorted(selector.get("matchLabels", {})):
        rules.append({"action": "keep", "source_labels": [f"__meta_kubernetes_service_label_{sanitize(key)}",
                                                          f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"],
                      "regex": f"({selector['matchLabels'][key]});true"})
    for expression in selector.get("matchExpressions", []):
        label, present = (f"__meta_kubernetes_service_{kind}_{sanitize(expression['key'])}"
                          for kind in ("label", "labelpresent"))
        values = "|".join(expression.get("values", []))
        rules.append({
            "In": {"action": "keep", "source_labels": [label, present], "regex": f"({values});true"},
            "NotIn": {"action": "drop", "source_labels": [label, present], "regex": f"({values});true"},
            "Exists": {"action": "keep", "source_labels": [present], "regex": "true"},
            "DoesNotExist": {"action": "drop", "source_labels": [present], "regex": "true"},
        }[expression["operator"]])
    return rules


def relabel_configs(monitor: dict[str, Any], endpoint: dict[str, Any]) -> list[RelabelConfig]:
    spec = monitor["spec"]
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    rules: list[RelabelConfig] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    rules += _label_keeps(spec["selector"])
    rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                  "regex": endpoint["port"]})
    rules += [
        {"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}",
         "target_label": "node"},
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
    ]
    for kind, labels in (("service", spec.get("targetLabels", [])), ("pod", spec.get("podTargetLabels", []))):
        rules += [{"source_labels": [f"__meta_kubernetes_{kind}_label_{sanitize(label)}"],
                   "target_label": sanitize(label), "regex": "(.+)", "replacement": "${1}"} for label in labels]
    rules.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"})
    if spec.get("jobLabel"):
        rules.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                      "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    rules += [  # sharding by address, one shard
        {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "regex": "(.+);",
         "replacement": "$1", "action": "replace"},
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": f"{SHARD};|.+;.+", "action": "keep"},
    ]
    return rules


def scrape_job(monitor: dict[str, Any], index: int, targets: list[TargetGroup], workdir: Path) -> dict[str, Any]:
    """The scrape config of endpoint `index`; its file of targets holds those of the namespaces it selects."""
    spec, meta = monitor["spec"], monitor["metadata"]
    if unknown := set(spec) - MONITOR_FIELDS:
        raise ValueError(f"ServiceMonitor {meta['name']}: fields not translated here: {sorted(unknown)}")
    endpoint = spec["endpoints"][index]
    if unknown := set(endpoint) - ENDPOINT_FIELDS:
        raise ValueError(f"ServiceMonitor {meta['name']} endpoint {index}: fields not translated here: "
                         f"{sorted(unknown)}")
    selected = spec.get("namespaceSelector", {})
    namespaces = None if selected.get("any") else set(selected.get("matchNames") or [meta["namespace"]])
    name = f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}"
    path = workdir / f"{sanitize(name)}.json"
    path.write_text(json.dumps([group.as_file_sd() for group in targets
                                if namespaces is None or group.namespace in namespaces]))
    job: dict[str, Any] = {"job_name": name, "honor_labels": bool(endpoint.get("honorLabels", False)),
                           "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}
    keys = {"interval": "scrape_interval", "scrapeTimeout": "scrape_timeout", "path": "metrics_path"}
    job |= {key: endpoint[name] for name, key in keys.items() if name in endpoint}
    return job | {"relabel_configs": relabel_configs(monitor, endpoint)}


@dataclass(frozen=True)
class TargetGroup:
    address: str
    namespace: str
    labels: dict[str, str]

    def as_file_sd(self) -> dict[str, Any]:
        return {"targets": [self.address], "labels": self.labels}


def _labels(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    found = {f"{prefix}_label_{sanitize(k)}": v for k, v in labels.items()}
    return found | {f"{prefix}_labelpresent_{sanitize(k)}": "true" for k in labels}


def discover(service: dict[str, Any], pod_template: dict[str, Any],
             pods: dict[str, dict[str, str]]) -> list[TargetGroup]:
    """What the `endpoints` role finds for `service`: `pods` maps each pod's name to {container port name: the
    address where it listens}; the pods' labels and containers come from the Deployment's pod template."""
    meta = service["metadata"]
    namespace = meta["namespace"]
    containers = {port["name"]: (container, port) for container in pod_template["spec"]["containers"]
                  for port in container.get("ports", [])}
    common = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_service_name": meta["name"],
              "__meta_kubernetes_endpoints_name": meta["name"],
              **_labels("__meta_kubernetes_service", meta.get("labels", {})),
              **_labels("__meta_kubernetes_endpoints", meta.get("labels", {}))}  # Endpoints carry the Service's
    groups = []
    for pod, addresses in pods.items():
        owner = pod.rsplit("-", 1)[0]
        for port in service["spec"]["ports"]:
            container, container_port = containers[port["targetPort"]]
            labels = common | _labels("__meta_kubernetes_pod", pod_template["metadata"]["labels"]) | {
                "__meta_kubernetes_endpoint_port_name": port["name"],
                "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                "__meta_kubernetes_endpoint_ready": "true",
                "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                "__meta_kubernetes_endpoint_address_target_name": pod,
                "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_phase": "Running",
                "__meta_kubernetes_pod_ready": "true",
                "__meta_kubernetes_pod_controller_kind": "ReplicaSet", "__meta_kubernetes_pod_controller_name": owner,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": container_port["name"],
                "__meta_kubernetes_pod_container_port_number": str(container_port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": container_port.get("protocol", "TCP"),
            }
            groups.append(TargetGroup(addresses[port["targetPort"]], namespace, labels))
    return groups
