"""What the rest of a cluster does around the operator, played by the tests: the ReplicaSet controller and kubelet
(pods and their status), the Deployment controller (its status), the HPA controller, and the Events they post."""

from __future__ import annotations

import datetime
from typing import Any

from harness import NAMESPACE, Cluster


def timestamp(seconds_ago: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def add_worker_pod(cluster: Cluster, name: str, model: str = "reranker", *, ready: bool = True,
                         namespace: str = NAMESPACE, **status: Any) -> dict[str, Any]:
    """A pod from the Deployment's template, with a status (phase Running unless given). Returns the stored pod."""
    deployment = cluster.get("deployments", namespace, model)
    assert deployment is not None, "no Deployment to make a pod for"
    template = deployment["spec"]["template"]["metadata"]
    created = await cluster.create("pods", namespace, {"metadata": {"name": name, "labels": template["labels"],
                                                                    "annotations": template["annotations"]},
                                                       "spec": deployment["spec"]["template"]["spec"]})
    await set_pod_status(cluster, name, ready=ready, namespace=namespace, **status)
    return created


async def set_pod_status(cluster: Cluster, name: str, *, ready: bool, namespace: str = NAMESPACE,
                         ready_since: str | None = None, **status: Any) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if ready_since:
        condition["lastTransitionTime"] = ready_since
    conditions = [condition, *status.pop("conditions", [])]
    return await cluster.patch("pods", namespace, name, {"status": {"phase": "Running", "conditions": conditions,
                                                                    **status}}, subresource="status")


async def set_deployment_status(cluster: Cluster, ready: int, model: str = "reranker", *,
                                namespace: str = NAMESPACE, **extra: Any) -> dict[str, Any]:
    """What the Deployment controller would report: `ready` pods, all on the newest template."""
    deployment = cluster.get("deployments", namespace, model)
    assert deployment is not None
    want = deployment["spec"].get("replicas", 1)
    status = {"observedGeneration": deployment["metadata"]["generation"], "replicas": want, "updatedReplicas": want,
              "readyReplicas": ready, "availableReplicas": ready, **extra}
    return await cluster.patch("deployments", namespace, model, {"status": status}, subresource="status")


async def post_event(cluster: Cluster, pod: dict[str, Any], reason: str, message: str, *, kind: str = "Warning",
                     seconds_ago: float = 0.0) -> dict[str, Any]:
    """An Event about a pod, as kubelet, the attach-detach controller or the cluster-autoscaler posts it."""
    meta = pod["metadata"]
    return await cluster.create("events", meta["namespace"], {
        "metadata": {"generateName": f"{meta['name']}."}, "reason": reason, "message": message, "type": kind,
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "namespace": meta["namespace"],
                           "uid": meta["uid"]},
        "lastTimestamp": timestamp(seconds_ago), "count": 1})
