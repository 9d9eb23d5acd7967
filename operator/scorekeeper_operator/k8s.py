"""The only module that talks to the Kubernetes API (the `kubernetes` client's transport, raw REST paths).

Writes are server-side apply under one field manager, so fields other managers own (the HPA's replicas,
`kubectl rollout restart`'s annotation) are left alone. Errors come out as TransientApiError (retry with backoff),
ForbiddenError (a 403: a ResourceQuota, a policy or admission webhook such as Gatekeeper's or KEDA's, or RBAC refused
the request; retried too, and reported in status when a write meets it) or RejectedError (the API refuses this object:
retrying the same spec cannot help).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions

FIELD_MANAGER = "scorekeeper-operator"
# Applies spec.replicas once, with the live value, before we stop applying it, so that it is not reset to the
# default (1) between our giving it up and the HPA's first write (Kubernetes docs: SSA, "Transferring ownership").
HANDOVER_FIELD_MANAGER = "scorekeeper-operator-handover"
DISCOVERY_TTL_SECONDS = 60.0
# LISTs come in pages (limit/continue), for the operator's own reads and for kopf's (settings.watching.chunk_size).
LIST_PAGE_SIZE = 500


@dataclass(frozen=True)
class ResourceRef:
    api_version: str  # "apps/v1", "v1"
    plural: str

    @property
    def group_version_path(self) -> str:
        return f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        scope = ["namespaces", namespace] if namespace else []
        parts = [self.group_version_path, *scope, self.plural, name, subresource]
        return "/".join(p for p in parts if p)


SCORING_MODELS = ResourceRef("scorekeeper.dev/v1alpha1", "scoringmodels")
PODS = ResourceRef("v1", "pods")
EVENTS = ResourceRef("v1", "events")
CHILD_KINDS: dict[str, ResourceRef] = {
    "ConfigMap": ResourceRef("v1", "configmaps"),
    "Service": ResourceRef("v1", "services"),
    "Deployment": ResourceRef("apps/v1", "deployments"),
    "PodDisruptionBudget": ResourceRef("policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ResourceRef("autoscaling/v2", "horizontalpodautoscalers"),
    "ServiceMonitor": ResourceRef("monitoring.coreos.com/v1", "servicemonitors"),
    "NetworkPolicy": ResourceRef("networking.k8s.io/v1", "networkpolicies"),
    "ScaledObject": ResourceRef("keda.sh/v1alpha1", "scaledobjects"),
}


def load_configuration() -> kubernetes.client.Configuration:
    """In-cluster service account, else the kubeconfig. KUBECONFIG is read now, not when the client was imported.
    kopf logs in through the same function (handlers.login), so both clients always talk to the same server."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                           client_configuration=config)
    return config


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class TransientApiError(ApiError):
    """Timeouts, 5xx, 429, 409, 403: worth retrying with backoff."""


class ForbiddenError(TransientApiError):
    """403: a quota, a policy, an admission webhook or RBAC refused the request. It may heal without a spec edit (the
    quota is raised, the policy or the webhook's reason goes away), so it is retried; on a write it is also reported."""


class RejectedError(ApiError):
    """400/404/422 on a write: the API refuses the object as rendered."""


def _error(status: int, data: bytes) -> ApiError:
    try:
        body = json.loads(data)
    except ValueError:
        body = {}
    reason, message = body.get("reason") or str(status), body.get("message") or data.decode(errors="replace")[:500]
    kind = RejectedError if status in (400, 404, 422) else ForbiddenError if status == 403 else TransientApiError
    return kind(status, reason, message)


class KubeApi:
    def __init__(self, client: kubernetes.client.ApiClient, timeout_seconds: float = 30.0) -> None:
        self._client = client
        self._timeout = timeout_seconds
        self._discovery: dict[str, tuple[float, bool]] = {}

    @classmethod
    def from_environment(cls, timeout_seconds: float = 30.0) -> KubeApi:
        return cls(kubernetes.client.ApiClient(load_configuration()), timeout_seconds)

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                 body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        """(status, parsed body); raises ApiError for >= 400 and TransientApiError for transport failures."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self._client.param_serialize(
            method=method, resource_path=path, query_params=query or None, header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            response = self._client.call_api(method, url, header_params=headers, body=body,
                                             _request_timeout=self._timeout)
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise TransientApiError(0, type(error).__name__, str(error)) from error
        if response.status >= 400:
            raise _error(response.status, data)
        return response.status, json.loads(data) if data else None

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        # The kubernetes client is synchronous: keep the event loop (and kopf's watches) free.
        _, data = await asyncio.to_thread(self._request, method, path, **kwargs)
        return data

    async def get(self, ref: ResourceRef, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", ref.path(namespace, name))
        except RejectedError as error:
            if error.status == 404:
                return None
            raise

    async def list(self, ref: ResourceRef, namespace: str, *, label_selector: str = "",
                   field_selector: str = "") -> list[dict[str, Any]]:
        """Every matching object, read in pages of LIST_PAGE_SIZE."""
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        query.append(("limit", str(LIST_PAGE_SIZE)))
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            data = await self._call("GET", ref.path(namespace), query=query + ([("continue", token)] if token else []))
            items += data.get("items") or []
            token = (data.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    async def apply(self, manifest: dict[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply (creates when absent); force: this operator is the authority for fields it sets."""
        ref = CHILD_KINDS[manifest["kind"]]
        meta = manifest["metadata"]
        query = [("fieldManager", field_manager), ("force", "true")]
        # JSON is YAML, and the client serializes dict bodies as JSON for the apply-patch content type.
        result: dict[str, Any] = await self._call("PATCH", ref.path(meta["namespace"], meta["name"]), query=query,
                                                  body=manifest, content_type="application/apply-patch+yaml")
        return result

    async def json_patch(self, ref: ResourceRef, namespace: str, name: str,
                         operations: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902); its `test` operations make it conditional on what was read (422 otherwise)."""
        result: dict[str, Any] = await self._call("PATCH", ref.path(namespace, name),
                                                  query=[("fieldManager", FIELD_MANAGER)], body=operations,
                                                  content_type="application/json-patch+json")
        return result

    async def create(self, ref: ResourceRef, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", ref.path(namespace), body=body)
        return result

    async def delete(self, ref: ResourceRef, namespace: str, name: str, uid: str) -> None:
        """Delete exactly that object (uid precondition); already gone or replaced is fine."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid},
                "propagationPolicy": "Background"}
        try:
            await self._call("DELETE", ref.path(namespace, name), body=body)
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    async def patch_status(self, ref: ResourceRef, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._call("PATCH", ref.path(namespace, name, "status"), body={"status": status},
                         content_type="application/merge-patch+json")

    async def serves(self, ref: ResourceRef) -> bool:
        """Is this resource served (e.g. ServiceMonitor, once the Prometheus operator is installed)? Cached a while."""
        cached = self._discovery.get(ref.api_version)
        if cached is not None and time.monotonic() - cached[0] < DISCOVERY_TTL_SECONDS:
            return cached[1]
        try:
            data = await self._call("GET", ref.group_version_path)
            served = any(r.get("name") == ref.plural for r in (data or {}).get("resources", []))
        except RejectedError as error:
            if error.status != 404:
                raise
            served = False
        self._discovery[ref.api_version] = (time.monotonic(), served)
        return served
