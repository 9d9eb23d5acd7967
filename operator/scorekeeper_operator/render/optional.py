"""Pure rendering of the opt-in children: the NetworkPolicy (spec.networkPolicy) and the KEDA ScaledObject
(autoscaling.provider: KEDA, rendered only while keda.sh/v1alpha1 is served)."""

from __future__ import annotations

from typing import Any

from scorekeeper_operator.render.children import QUEUE_METRIC, deployment_scaler, scaling_behavior
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.pod import LabelSelector

# KEDA asks Prometheus every this many seconds; HPA behaviour (scale-down pace) stays the same as with our HPA.
KEDA_POLLING_SECONDS = 15


def keda_hpa_name(name: str) -> str:
    """The HPA KEDA creates for the ScaledObject: named explicitly (KEDA's default name), so that status can read its
    conditions (the Autoscaling condition) as it reads those of the operator's own HPA."""
    return f"keda-hpa-{name}"


def _selector(selector: LabelSelector) -> dict[str, Any]:
    dumped: dict[str, Any] = selector.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return dumped


def _peer(peer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.pod_selector is not None:
        out["podSelector"] = _selector(peer.pod_selector)
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = _selector(peer.namespace_selector)
    if peer.ip_block is not None:
        out["ipBlock"] = peer.ip_block.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return out


def network_policy(model: ScoringModel, meta: dict[str, Any], selector: dict[str, str],
                   service: dict[str, Any]) -> dict[str, Any]:
    """Ingress to the worker pods: the scoring port from `from` (default: this namespace's pods), the metrics port
    from the monitoring namespace. The ports are the Service's target ports, so the two cannot disagree."""
    policy = model.spec.network_policy
    targets = {port["name"]: port["targetPort"] for port in service["spec"]["ports"]}
    scoring_peers = [_peer(p) for p in policy.from_] or [{"podSelector": {}}]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": policy.monitoring_namespace}}}
    rules = [{"from": scoring_peers, "ports": [{"protocol": "TCP", "port": targets["http"]}]}]
    if targets["metrics"] != targets["http"]:
        rules.append({"from": [monitoring], "ports": [{"protocol": "TCP", "port": targets["metrics"]}]})
    else:  # one port serves both: Prometheus must reach it too
        rules[0]["from"] = [*scoring_peers, monitoring]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
            "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"], "ingress": rules}}


def queue_query(model: ScoringModel) -> str:
    """Total queued work of this model's pods; KEDA divides by the replica count (metricType AverageValue)."""
    return f'sum({QUEUE_METRIC}{{namespace="{model.namespace}",service="{model.name}"}})'


def scaled_object(model: ScoringModel, meta: dict[str, Any]) -> dict[str, Any]:
    scaling = model.spec.autoscaling
    trigger = {"type": "prometheus", "metricType": "AverageValue",
               "metadata": {"serverAddress": scaling.prometheus_address,
                            "query": scaling.prometheus_query or queue_query(model), "threshold": str(scaling.target)}}
    hpa = {"name": keda_hpa_name(model.name), "behavior": scaling_behavior()}
    return deployment_scaler(model, meta, "keda.sh/v1alpha1", "ScaledObject", ("minReplicaCount", "maxReplicaCount"),
                             pollingInterval=KEDA_POLLING_SECONDS, advanced={"horizontalPodAutoscalerConfig": hpa},
                             triggers=[trigger])
