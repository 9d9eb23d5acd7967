"""Pure rendering: ScoringModel → the child manifests (plain dicts, complete enough for server-side apply).

No I/O here. What the cluster can do (is the ServiceMonitor API served?) comes in as an argument.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scorekeeper_operator.render import children as render_children
from scorekeeper_operator.render import optional as render_optional
from scorekeeper_operator.render import pod as render_pod
from scorekeeper_operator.spec import flags, worker_contract
from scorekeeper_operator.spec.model import AutoscalerProvider, RolloutStrategy, ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings

API_VERSION = "scorekeeper.dev/v1alpha1"
KIND = "ScoringModel"
MANAGED_BY = "scorekeeper-operator"
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"  # on every child and worker pod
CONFIG_HASH_ANNOTATION = "scorekeeper.dev/config-hash"
# On the Deployment (not its pods, so writing it rolls nothing): the ScoringModel generation it was rendered from. A
# template change at the same generation is the operator's, and is paced (pacing.py); a spec change is not.
GENERATION_ANNOTATION = "scorekeeper.dev/generation"
# Kinds that exist only for some specs; when a spec stops wanting one, the reconciler deletes it.
OPTIONAL_KINDS = ("PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor", "NetworkPolicy", "ScaledObject")


@dataclass(frozen=True)
class Rendered:
    manifests: list[dict[str, Any]]
    config_hash: str
    worker_args: list[str]
    worker_image: str

    def get(self, kind: str) -> dict[str, Any] | None:
        return next((m for m in self.manifests if m["kind"] == kind), None)


def selector_labels(name: str) -> dict[str, str]:
    """Immutable once a Deployment exists: never add to these."""
    return {"app.kubernetes.io/name": "scorekeeper-worker", "app.kubernetes.io/instance": name}


def common_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), "app.kubernetes.io/component": "scorer",
            "app.kubernetes.io/part-of": "scorekeeper", "app.kubernetes.io/managed-by": MANAGED_BY}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def endpoint(name: str, namespace: str) -> str:
    """The in-cluster URL of the Service (the CR name is also the Service name)."""
    return f"http://{name}.{namespace}.svc:{worker_contract.WORKER_PORT}"


def owner_reference(model: ScoringModel) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": model.name, "uid": model.uid,
            "controller": True, "blockOwnerDeletion": True}


def event_about(meta: dict[str, Any], kind: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """An Event about the ScoringModel with this metadata (`kind`: Normal or Warning)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": kind, "reason": reason, "message": message[:1024],
            "source": {"component": MANAGED_BY}, "reportingComponent": MANAGED_BY,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}


def desired_replicas(model: ScoringModel) -> int | None:
    """None when an autoscaler owns the replica count (then the Deployment is applied without spec.replicas)."""
    return None if model.spec.autoscaling.enabled else model.spec.replicas


def autoscaler_name(model: ScoringModel) -> str | None:
    """The HorizontalPodAutoscaler that sets the replica count: ours, or the one KEDA creates; None: no autoscaling."""
    scaling = model.spec.autoscaling
    if not scaling.enabled:
        return None
    return render_optional.keda_hpa_name(model.name) if scaling.provider is AutoscalerProvider.KEDA else model.name


def _wants_pdb(model: ScoringModel) -> bool:
    scaling = model.spec.autoscaling
    return scaling.max_replicas > 1 if scaling.enabled else model.spec.replicas > 1


def _strategy(model: ScoringModel) -> dict[str, Any]:
    if model.spec.rollout_strategy is RolloutStrategy.RECREATE:
        return {"type": "Recreate"}
    # A GPU rollout cannot surge without a spare GPU: replace pods one at a time instead.
    surge, unavailable = (0, 1) if model.spec.uses_gpu else (1, 0)
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}


def _config_hash(template: dict[str, Any], configmap: dict[str, Any]) -> str:
    text = json.dumps([template, configmap["data"]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def deployment(model: ScoringModel, meta: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(model.name)},
        "strategy": _strategy(model),
        "revisionHistoryLimit": 3,
        # Beyond the scheduling and startup budgets, so a slow but healthy placement and model load is not reported
        # as a stuck rollout.
        "progressDeadlineSeconds": model.spec.startup_seconds + model.spec.rollout.scheduling_deadline_seconds,
        "template": template,
    }
    replicas = desired_replicas(model)
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def render(model: ScoringModel, settings: OperatorSettings, *, service_monitor_api: bool,
           keda_api: bool = False) -> Rendered:
    """Every child this ScoringModel should have right now, in apply order (ConfigMap before the pods need it)."""
    labels = common_labels(model.name)

    def meta() -> dict[str, Any]:
        return {"name": model.name, "namespace": model.namespace, "labels": dict(labels),
                "ownerReferences": [owner_reference(model)]}

    selector = selector_labels(model.name)
    image = model.spec.image or settings.worker_image
    configmap = render_children.configmap(model, meta())
    template = render_pod.pod_template(model, settings, dict(labels), selector, image)
    config_hash = _config_hash(template, configmap)
    template["metadata"]["annotations"] = {**template["metadata"].get("annotations", {}),
                                           CONFIG_HASH_ANNOTATION: config_hash}
    deployment_meta = {**meta(), "annotations": {GENERATION_ANNOTATION: str(model.generation)}}
    service = render_children.service(meta(), selector)
    manifests = [configmap, service, deployment(model, deployment_meta, template)]
    if _wants_pdb(model):
        manifests.append(render_children.pod_disruption_budget(meta(), selector))
    scaling = model.spec.autoscaling
    if scaling.enabled and scaling.provider is AutoscalerProvider.HPA:
        manifests.append(render_children.horizontal_pod_autoscaler(model, meta()))
    if scaling.enabled and scaling.provider is AutoscalerProvider.KEDA and keda_api:
        manifests.append(render_optional.scaled_object(model, meta()))
    if model.spec.monitoring.service_monitor and service_monitor_api:
        manifests.append(render_children.service_monitor(model, meta(), selector))
    if model.spec.network_policy.enabled:
        manifests.append(render_optional.network_policy(model, meta(), selector, service))
    return Rendered(manifests=manifests, config_hash=config_hash, worker_args=flags.worker_args(model),
                    worker_image=image)
