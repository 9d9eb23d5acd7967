"""The emulator the operator tests run against: kmock_ext's RealisticEmulator plus what a big, unreliable cluster does.

Adds: label and field selectors on WATCH (server-side filtering) and field selectors on LIST; paged LISTs
(`limit`/`continue`); the scale subresource of custom resources (`kubectl scale` writes spec.replicas through the
CRD's validation, transition rules included); and faults: dropping every watch stream (as an API server restart or a
load balancer does), holding requests (to stop the operator mid-pass). It counts what each watch stream delivered to
the operator, so tests can assert on what the operator was sent, not only on what it did.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
from kmock import KubernetesError, KubernetesObjectNotFoundError
from kmock._internal import rendering
from kmock_ext import HARNESS_HEADER, RealisticEmulator
from kmock_semantics import matches_fields, matches_selector

DROP = "DROP"  # the bus item that ends every watch stream open at the time


@attrs.define
class Hold:
    """Requests with this method on this resource wait, unanswered, until released. `watch`: only watch requests;
    `cluster_wide`: only requests across all namespaces (kopf's LISTs and WATCHes, not the reconciler's reads);
    `subresource`: only requests to it ("" for the main resource)."""

    method: str
    plural: str
    watch: bool = False
    cluster_wide: bool = False
    subresource: str | None = None
    held: int = 0  # requests that arrived while holding
    fail_with: int | None = None  # released with this HTTP status instead of being served
    released: asyncio.Event = attrs.field(factory=asyncio.Event)

    def release(self, fail_with: int | None = None) -> None:
        self.fail_with = fail_with
        self.released.set()


@attrs.define(kw_only=True)
class ClusterEmulator(RealisticEmulator):
    # plural → the names of the objects in every watch event sent to the operator, in order
    delivered: collections.defaultdict[str, list[str]] = attrs.field(factory=lambda: collections.defaultdict(list))
    _holds: list[Hold] = attrs.field(factory=list)

    def hold(self, method: str, plural: str, *, watch: bool = False, cluster_wide: bool = False,
             subresource: str | None = None) -> Hold:
        hold = Hold(method.upper(), plural, watch, cluster_wide, subresource)
        self._holds.append(hold)
        return hold

    async def seed(self, plural: str, namespace: str, body: dict[str, Any]) -> None:
        """Store an object without a request (KMock matches every request against its whole request log, which
        makes thousands of POSTs slow): watchers get its ADDED event as for a create."""
        res = next(r for r in self.resources if r.plural == plural and self.resources[r].kind)
        meta = {**body["metadata"], "namespace": namespace, "uid": str(uuid.uuid4()),
                "resourceVersion": self._next_revision(), "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
        obj = {**body, "metadata": meta}
        async with self._lock:
            self._objects[res, namespace, meta["name"]] = obj
            await self._emit(res, "ADDED", obj)

    def keda_webhook(self, obj: dict[str, Any], _old: dict[str, Any] | None = None) -> dict[str, Any]:
        """KEDA's validating webhook for ScaledObjects (vscaledobject.kb.io, verifyHpas): a workload another HPA
        already scales cannot get a ScaledObject; the webhook answers 403 (an admission denial)."""
        namespace, target = obj["metadata"].get("namespace"), obj["spec"]["scaleTargetRef"]["name"]
        own = obj["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get(
            "name", f"keda-hpa-{obj['metadata']['name']}")
        for (res, ns, name), stored in self._objects.items():
            if res.plural == "horizontalpodautoscalers" and ns == namespace and not stored.deleted and name != own \
                    and stored.raw["spec"]["scaleTargetRef"]["name"] == target:
                raise KubernetesError(status=403, reason="Forbidden", message=(
                    'admission webhook "vscaledobject.kb.io" denied the request: the workload'
                    f" '{target}' of type 'apps/v1.Deployment' is already managed by the hpa '{name}'"))
        return obj

    async def drop_watches(self) -> None:
        """End every open watch stream; clients must re-list and watch again (kopf does)."""
        for bus in list(self._buses.values()):
            await bus.put({"type": DROP})

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is not None and request.headers.get(HARNESS_HEADER) is None:
            watch = request.params.get("watch") in ("true", "1")
            cluster_wide = request.namespace is None and request.name is None
            for hold in self._holds:
                if (request.method.value, res.plural) == (hold.method, hold.plural) and not hold.released.is_set() \
                        and (watch or not hold.watch) and (cluster_wide or not hold.cluster_wide) \
                        and hold.subresource in (None, request.subresource or ""):
                    hold.held += 1
                    await hold.released.wait()
                    if hold.fail_with is not None:
                        raise KubernetesError(status=hold.fail_with, reason="InjectedFailure", message="held, failed")
        return await super()._handle(request)

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        """GET by name: a key lookup (KMock's own scans every stored object, slow in the footprint test)."""
        async with self._lock:
            obj = self._live((request.resource, request.namespace, request.name))
        if obj is None:
            raise KubernetesObjectNotFoundError()
        return obj

    def _wanted(self, request: rendering.Request, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return (request.namespace is None or meta.get("namespace") == request.namespace) \
            and matches_selector(request.params.get("labelSelector", ""), meta.get("labels") or {}) \
            and matches_fields(request.params.get("fieldSelector", ""), obj)

    async def _list(self, request: rendering.Request) -> dict[str, Any]:
        listing = await super()._list(request)
        items = [item for item in listing["items"] if matches_fields(request.params.get("fieldSelector", ""), item)]
        start = int(base64.b64decode(request.params["continue"])) if request.params.get("continue") else 0
        limit = int(request.params.get("limit") or 0) or len(items)
        page, rest = items[start:start + limit], items[start + limit:]
        listing["items"] = page
        if rest:
            listing["metadata"]["continue"] = base64.b64encode(str(start + limit).encode()).decode()
        return listing

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # headers first: a watch with nothing to say yet is still a stream
        res = request.resource
        assert res is not None
        to_operator = request.headers.get(HARNESS_HEADER) is None
        bus = self._buses[res]
        async with self._lock:  # writes emit under this lock: nothing falls between the snapshot and the mark
            marker = await bus.mark()
            existing = [{"type": "ADDED", "object": obj.raw} for (r, _, _), obj in self._objects.items()
                        if r == res and not obj.deleted and self._wanted(request, obj.raw)]
        visible = {(e["object"]["metadata"].get("namespace"), e["object"]["metadata"]["name"]) for e in existing}
        try:
            for event in existing:
                self._count(res.plural, event, to_operator)
                yield event
            async for event in bus.stream(since=marker):
                if event.get("type") == DROP:
                    return
                obj = event.get("object") or {}
                key = ((obj.get("metadata") or {}).get("namespace"), (obj.get("metadata") or {}).get("name"))
                if not self._wanted(request, obj):
                    if key not in visible:
                        continue
                    event = {"type": "DELETED", "object": obj}  # it left the selection: gone, as the API server says
                if event["type"] == "DELETED":
                    visible.discard(key)
                else:
                    visible.add(key)
                self._count(res.plural, event, to_operator)
                yield event
        finally:
            await bus.unmark(marker)

    def _count(self, plural: str | None, event: dict[str, Any], to_operator: bool) -> None:
        if to_operator:
            self.delivered[plural or ""].append(event["object"]["metadata"]["name"])

    async def _update(self, request: rendering.Request) -> dict[str, Any]:
        res = request.resource
        if request.subresource != "scale" or res is None or "scale" not in self.resources[res].subresources:
            return await super()._update(request)
        # The CRD's scale subresource maps onto .spec.replicas and goes through the object's own validation.
        replicas = ((request.data or {}).get("spec") or {}).get("replicas")
        updated = await super()._update(attrs.evolve(request, subresource=None, data={"spec": {"replicas": replicas}},
                                                     headers={**request.headers,
                                                              "Content-Type": "application/merge-patch+json"}))
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": updated["metadata"],
                "spec": {"replicas": updated["spec"].get("replicas")},
                "status": {"replicas": (updated.get("status") or {}).get("replicas", 0),
                           "selector": (updated.get("status") or {}).get("selector", "")}}
