"""Pure rendering of the children around the Deployment: ConfigMap, Service, PDB, HPA, ServiceMonitor."""

from __future__ import annotations

from typing import Any

import yaml

from scorekeeper_operator.spec import flags, worker_contract
from scorekeeper_operator.spec.model import ScoringModel

# Exposed by the worker as a gauge; the Prometheus adapter must serve it as a Pods metric for the HPA.
QUEUE_METRIC = "scorekeeper_queue_depth"
# The PDB's disruption allowance; status counts a model with this many pods short as still Available.
MAX_UNAVAILABLE = 1
# The Service label the ServiceMonitor copies onto every target (render/manifests.py selector_labels).
SERVICE_NAME_LABEL = "app.kubernetes.io/name"


def scaling_behavior() -> dict[str, Any]:
    """Scale up at once (queues grow fast); scale down slowly, since a new pod pays a full model load (HPA, KEDA)."""
    return {"scaleUp": {"stabilizationWindowSeconds": 0},
            "scaleDown": {"stabilizationWindowSeconds": 300,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}


def configmap(model: ScoringModel, meta: dict[str, Any]) -> dict[str, Any]:
    config = yaml.safe_dump(flags.worker_config(model), sort_keys=True)
    data = {worker_contract.CONFIG_FILE: config, **flags.config_files(model)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def service(meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    # `metrics` reaches the worker's --metrics-port, which serves /metrics alone (no API key, nothing else exposed);
    # it is the port a ServiceMonitor selects.
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": "http", "port": worker_contract.WORKER_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": worker_contract.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def pod_disruption_budget(meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    # maxUnavailable (not minAvailable) so a drain can always make progress, one pod at a time.
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"maxUnavailable": MAX_UNAVAILABLE, "selector": {"matchLabels": selector}}}


def deployment_scaler(model: ScoringModel, meta: dict[str, Any], api_version: str, kind: str,
                      replica_keys: tuple[str, str], **spec: Any) -> dict[str, Any]:
    """An autoscaler of the model's Deployment (our HPA, KEDA's ScaledObject): between spec.autoscaling's least and
    most replicas (under `replica_keys`), then its own `spec` fields."""
    scaling = model.spec.autoscaling
    least, most = replica_keys
    return {
        "apiVersion": api_version, "kind": kind, "metadata": meta,
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": model.name},
                 least: scaling.min_replicas, most: scaling.max_replicas, **spec},
    }


def horizontal_pod_autoscaler(model: ScoringModel, meta: dict[str, Any]) -> dict[str, Any]:
    target = {"type": "AverageValue", "averageValue": str(model.spec.autoscaling.target)}
    queue = {"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC}, "target": target}}
    return deployment_scaler(model, meta, "autoscaling/v2", "HorizontalPodAutoscaler", ("minReplicas", "maxReplicas"),
                             metrics=[queue], behavior=scaling_behavior())


def service_monitor(model: ScoringModel, meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    labeled = {**meta, "labels": {**model.spec.monitoring.labels, **meta["labels"]}}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": labeled,
        "spec": {
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [model.namespace]},
            # Every target, `up` included, then says it is a worker (app_kubernetes_io_name="scorekeeper-worker"): the
            # alert on a worker that keeps exiting finds its targets by it, with no worker series to go by. honorLabels
            # stays false, so a worker cannot overwrite its namespace or pod; no worker label is a target label.
            "targetLabels": [SERVICE_NAME_LABEL],
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": model.spec.monitoring.interval}],
        },
    }
