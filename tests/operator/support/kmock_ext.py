"""KMock 0.8's KubernetesEmulator, extended with the API behaviours the operator relies on.

KMock stores objects, merge-patches them and streams watch events. It lacks (research/operators.md §3.3), and this
subclass adds: server-set metadata (uid, creationTimestamp, resourceVersion, generation); no-op writes that change
nothing and emit no event; status-subresource isolation; server-side apply that creates absent objects, drops fields
its manager stopped applying, merges `ownerReferences` by uid (a map-type list) and keeps approximate managedFields;
at most one controller owner reference (422 otherwise); JSON-patch `test` failures as 422; label selectors on LIST;
ownerReference garbage collection; DeleteOptions uid preconditions; `/api/v1/namespaces` paths; admission hooks (the
CRD's defaults, schema and CEL rules); injected failures; and a log of the calls the operator made (RBAC).
Still missing, and documented in docs/operator.md: exact managedFields and conflicts, the merging of other
associative lists (strategic merge, SSA list keys other than ownerReferences), built-in defaulting and validation,
controllers (Deployment, ReplicaSet, kubelet)."""

from __future__ import annotations

import copy
import datetime
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import yaml
from kmock import KubernetesEmulator, KubernetesError, KubernetesObjectNotFoundError, action, resource
from kmock._internal import rendering
from kmock_semantics import (
    ApiCall,
    api_call,
    apply_list_map,
    drop_unapplied,
    fields_v1,
    matches_selector,
    merge_patch,
    owner_reference_error,
    release_conflicts,
)

HARNESS_HEADER = "X-Test-Harness"  # requests made by the tests themselves, not by the operator
# (new object, old object or None on create) → the (defaulted, canonicalized) object, or raises ValueError (422, as
# the API's own validation) or KubernetesError (as an admission webhook answers)
Admission = Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any]]


@attrs.define
class Failure:
    """What `fail` injects: requests that match get `status` with a Status body of this reason and message."""

    method: str
    plural: str
    status: int
    remaining: int
    reason: str
    message: str
    subresource: str | None = None  # only this subresource ("" for the main resource); None: any
    namespaced: bool = False  # only requests within a namespace (the reconciler's, not kopf's cluster-wide ones)

    def matches(self, request: rendering.Request) -> bool:
        res = request.resource
        return self.remaining > 0 and (self.method, self.plural) == (request.method.value, res and res.plural) \
            and (self.subresource is None or self.subresource == (request.subresource or "")) \
            and (not self.namespaced or request.namespace is not None)


@attrs.define(kw_only=True)
class RealisticEmulator(KubernetesEmulator):
    admission: dict[str, Admission] = attrs.field(factory=dict)  # plural → hook
    calls: list[ApiCall] = attrs.field(factory=list)
    _failures: list[Failure] = attrs.field(factory=list)
    _applied: dict[tuple[Any, ...], dict[str, Any]] = attrs.field(factory=dict)  # (key, manager) → last applied
    _revision: int = 0

    def fail(self, method: str, plural: str, status: int = 500, times: int = 1, *, reason: str = "InjectedFailure",
             message: str = "injected by the test", subresource: str | None = None, namespaced: bool = False) -> None:
        """The next `times` requests with this method on this resource get HTTP `status` (and a Status body with
        this reason and message, as the API server, a quota or a webhook words it); `subresource` and `namespaced`
        narrow which requests (see Failure)."""
        self._failures.append(Failure(method.upper(), plural, status, times, reason, message, subresource, namespaced))

    def heal(self) -> None:
        self._failures.clear()

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or res.plural is None:
            return await super()._handle(request)  # discovery and non-API paths
        if request.headers.get(HARNESS_HEADER) is None:
            self.calls.append(api_call(request))
        for failure in self._failures:
            if failure.matches(request):
                failure.remaining -= 1
                raise KubernetesError(status=failure.status, reason=failure.reason, message=failure.message)
        handler = {action.LIST: self._list, action.CREATE: self._create, action.UPDATE: self._update,
                   action.DELETE: self._delete}.get(request.action)  # type: ignore[arg-type]
        if handler is None or (request.action is action.DELETE and request.name is None):
            return await super()._handle(request)  # watch, get: KMock's own (it serves our stored objects)
        async with self._lock:
            return aiohttp.web.json_response(await handler(request))

    # -- helpers -------------------------------------------------------------------------------------------------
    def _has_status(self, res: resource) -> bool:
        return res in self.resources and "status" in self.resources[res].subresources

    def _live(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        return self._objects[key].raw if key in self._objects and not self._objects[key].deleted else None

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    async def _emit(self, res: resource, kind: str, obj: dict[str, Any]) -> None:
        await self._buses[res].put({"type": kind, "object": copy.deepcopy(obj)})

    def _admit(self, res: resource, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        if (invalid := owner_reference_error(obj)) is not None:  # the API's own validation, before any webhook
            raise KubernetesError(status=422, reason="Invalid", message=invalid)
        hook = self.admission.get(res.plural or "")
        if hook is None:
            return obj
        try:
            return hook(obj, old)
        except ValueError as error:
            raise KubernetesError(status=422, reason="Invalid", message=str(error)) from error

    # -- verbs ---------------------------------------------------------------------------------------------------
    async def _list(self, request: rendering.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        if res not in self._get_resources():
            raise KubernetesError(status=404, reason="NotFound", message=f"the server does not serve {res.plural}")
        selector = request.params.get("labelSelector", "")
        items = [obj.raw for (r, ns, _), obj in self._objects.items()
                 if r == res and not obj.deleted and (request.namespace is None or ns == request.namespace)
                 and matches_selector(selector, obj.raw.get("metadata", {}).get("labels") or {})]
        kind = self.resources[res].kind if res in self.resources else None
        return {"apiVersion": f"{res.group}/{res.version}".lstrip("/"), "kind": f"{kind or 'Object'}List",
                "metadata": {"resourceVersion": str(self._revision)}, "items": items}

    async def _create(self, request: rendering.Request, body: dict[str, Any] | None = None) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        obj = copy.deepcopy(body if body is not None else request.data)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", meta.get("generateName", "object-") + uuid.uuid4().hex[:5])
        if request.namespace:
            meta["namespace"] = request.namespace
        key = (res, meta.get("namespace"), meta["name"])
        if self._live(key) is not None:
            raise KubernetesError(status=409, reason="AlreadyExists", message=f"{meta['name']} already exists")
        if self._has_status(res):
            obj.pop("status", None)  # status is written through /status only
        obj = self._admit(res, obj, None)
        meta = obj["metadata"]
        self._record_implied(request, meta)
        meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_revision(), generation=1,
                    creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        await self._emit(res, "ADDED", obj)
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if owners and not owners & self._live_uids():
            await self._remove(key, obj)  # every owner is already gone: the garbage collector removes it
        return obj

    def _record_implied(self, request: rendering.Request, meta: dict[str, Any]) -> None:
        """Setting blockOwnerDeletion needs `update` on the owner's finalizers subresource wherever the
        OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened clusters): record it, for
        creates and for the updates that send the reference (an apply does, every time)."""
        if request.headers.get(HARNESS_HEADER) is not None:
            return
        for ref in meta.get("ownerReferences") or []:
            group = ref["apiVersion"].rpartition("/")[0]
            owners = [r for r in self.resources if r.group == group and self.resources[r].kind == ref["kind"]]
            if ref.get("blockOwnerDeletion") and owners:
                self.calls.append(ApiCall("PUT", group, owners[0].plural or "", "finalizers", "update"))

    def _managed_fields(self, key: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"manager": manager, "operation": "Apply", "apiVersion": "v1", "fieldsV1": fields_v1(cfg)}
                for (k, manager), cfg in sorted(self._applied.items(), key=lambda item: item[0][1]) if k == key]

    def _live_uids(self) -> set[str]:
        return {obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted}

    async def _update(self, request: rendering.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        key = (res, request.namespace, request.name)
        content_type = request.headers.get("Content-Type", "")
        patch = request.data if request.data is not None else yaml.safe_load(request.text or "null")
        old = self._live(key)
        if old is None:
            if "apply-patch" not in content_type:
                raise KubernetesObjectNotFoundError()
            manager = request.params.get("fieldManager", "")
            self._applied[(key, manager)] = copy.deepcopy(patch)
            try:
                created = await self._create(request, body={**patch, "metadata": {
                    **patch.get("metadata", {}), "managedFields": self._managed_fields(key)}})  # apply creates …
            except KubernetesError:
                del self._applied[(key, manager)]
                raise
            if request.headers.get(HARNESS_HEADER) is None:  # … which RBAC authorizes as `create`, not `patch`
                self.calls.append(api_call(request)._replace(verb="create"))
            return created
        if isinstance(patch, list):
            try:
                new = jsonpatch.apply_patch(old, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise KubernetesError(status=422, reason="Invalid", message=str(error)) from error
        else:
            new = merge_patch(old, patch)
        managers = {k: copy.deepcopy(v) for k, v in self._applied.items() if k[0] == key}  # kept if refused
        if "apply-patch" in content_type:
            self._record_implied(request, patch.get("metadata") or {})
            manager = request.params.get("fieldManager", "")
            others = [cfg for (k, m), cfg in self._applied.items() if k == key and m != manager]
            previous = self._applied.get((key, manager), {})
            drop_unapplied(new, previous=previous, applied=patch, co_owned=others)
            refs = apply_list_map(old["metadata"].get("ownerReferences"), applied=_owners(patch),
                                  previous=_owners(previous), co_owned=[_owners(other) for other in others])
            new.setdefault("metadata", {}).pop("ownerReferences", None)
            if refs:
                new["metadata"]["ownerReferences"] = refs
            for other in others:
                release_conflicts(other, patch)
            self._applied[(key, manager)] = copy.deepcopy(patch)
            new.setdefault("metadata", {})["managedFields"] = self._managed_fields(key)
        if request.subresource == "status":
            new = {**old, "status": new.get("status")}
        elif self._has_status(res):
            new["status"] = old.get("status")
        new = {k: v for k, v in new.items() if v is not None}
        new["metadata"] = {**new.get("metadata", {}), **{k: old["metadata"][k] for k in
                           ("uid", "creationTimestamp", "generation", "resourceVersion") if k in old["metadata"]}}
        if new == old:
            return old  # a no-op write: no new resourceVersion, no watch event
        if request.subresource is None:
            try:
                new = self._admit(res, new, old)
            except KubernetesError:
                for entry in [k for k in self._applied if k[0] == key]:  # a refused write changes nothing, …
                    del self._applied[entry]
                self._applied.update(managers)  # … its field managers included
                raise
            if new == old:
                return old  # equal once admitted (e.g. `0.5` stored as `500m`): still a no-op
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._next_revision()
        self._objects[key].create(new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._remove(key, new)
        else:
            await self._emit(res, "MODIFIED", new)
        return new

    async def _delete(self, request: rendering.Request) -> dict[str, Any]:
        res = request.resource
        assert res is not None
        key = (res, request.namespace, request.name)
        obj = self._live(key)
        if obj is None:
            raise KubernetesObjectNotFoundError()
        wanted_uid = ((request.data or {}).get("preconditions") or {}).get("uid")
        if wanted_uid and wanted_uid != obj["metadata"]["uid"]:
            raise KubernetesError(status=409, reason="Conflict", message="Precondition failed: UID mismatch")
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(obj)
                obj["metadata"].update(deletionTimestamp=datetime.datetime.now(datetime.UTC).isoformat(),
                                       resourceVersion=self._next_revision())
                self._objects[key].create(obj)
                await self._emit(res, "MODIFIED", obj)
            return obj
        await self._remove(key, obj)
        return obj

    async def _remove(self, key: tuple[Any, ...], obj: dict[str, Any]) -> None:
        """Delete, then garbage-collect dependents (background propagation) as kube-controller-manager would."""
        self._objects[key].delete()
        for applied in [k for k in self._applied if k[0] == key]:
            del self._applied[applied]  # a re-created object starts without field managers
        await self._emit(key[0], "DELETED", obj)
        uid = obj["metadata"]["uid"]
        for dep_key, dependent in list(self._objects.items()):
            refs = [] if dependent.deleted else dependent.raw["metadata"].get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            if dependent.raw["metadata"].get("finalizers"):  # finalizers hold it: mark it, as a DELETE would
                now = datetime.datetime.now(datetime.UTC).isoformat()
                marked = merge_patch(dependent.raw, {"metadata": {"deletionTimestamp": now}})
                self._objects[dep_key].create(marked)
                await self._emit(dep_key[0], "MODIFIED", marked)
            else:
                await self._remove(dep_key, dependent.raw)


def _owners(config: dict[str, Any]) -> list[dict[str, Any]]:
    return list((config.get("metadata") or {}).get("ownerReferences") or [])
