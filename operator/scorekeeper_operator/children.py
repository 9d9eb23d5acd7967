"""One pass's view of a ScoringModel's children, and converging them to what was rendered.

Reads come from the watch cache (cache.py); a miss, and every read of a `fresh` pass (a spec change, the pass after an
error, the periodic resync), goes to the API and refreshes the cache. So the steady path costs no request here.

Converging: refuse to touch an object of a child's name that this ScoringModel does not own (ChildConflict: a user's
own HPA or PDB named like the model stays theirs); delete the optional children the spec no longer wants *first* (KEDA's
admission webhook refuses a ScaledObject while an HPA still scales the Deployment); then apply what is missing, drifted,
or carries fields we applied before and no longer render. A pod-template change the operator causes waits for a slot
(pacing.py): the ConfigMap and Deployment are then left exactly as they are. Refusals become a ConfigError that names
them: the API's 400/404/422 (`Rejected`), a ResourceQuota (`QuotaExceeded`), an admission webhook such as Gatekeeper's
or KEDA's (`AdmissionWebhookDenied`), anything else forbidden (`Forbidden`, e.g. RBAC).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.k8s import (
    CHILD_KINDS,
    EVENTS,
    FIELD_MANAGER,
    HANDOVER_FIELD_MANAGER,
    PODS,
    ApiError,
    ForbiddenError,
    KubeApi,
    RejectedError,
    TransientApiError,
)
from scorekeeper_operator.pacing import Decision, Pacer, paced_annotations
from scorekeeper_operator.render.drift import applies_field, contains, left_out, owned_by
from scorekeeper_operator.render.manifests import (
    MANAGED_BY,
    MANAGED_SELECTOR,
    OPTIONAL_KINDS,
    Rendered,
    desired_replicas,
    owner_reference,
    selector_string,
)
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.status.compute import ConfigError, Observed
from scorekeeper_operator.status.pods import needs_events

# Children whose API exists only once an add-on (Prometheus Operator, KEDA) is installed.
CUSTOM_KINDS = ("ServiceMonitor", "ScaledObject")
# Refusals that can heal without a spec edit (the foreign object is deleted, a quota raised, a policy changed): the
# pass is repeated with backoff.
REFUSALS = ("Rejected", "QuotaExceeded", "AdmissionWebhookDenied", "Forbidden")
# What the pod runs: a waiting model keeps these two as they are (pacing.py).
POD_KINDS = ("ConfigMap", "Deployment")
EVENT_PODS_PER_PASS = 5  # Events are read per pod (by uid), for at most this many pods that are not ready


def refusal(action: str, kind: str, name: str, error: ApiError) -> ConfigError:
    """The API refused a write: a condition that names the refusal, with the API's own message."""
    if isinstance(error, RejectedError):
        return ConfigError("Rejected", f"the API rejected {kind} {name}: {error.message}")
    reason = "QuotaExceeded" if "exceeded quota" in error.message \
        else "AdmissionWebhookDenied" if "admission webhook" in error.message else "Forbidden"
    return ConfigError(reason, f"the API refused to {action} {kind} {name} (HTTP 403): {error.message}")


@dataclass
class Converged:
    error: ConfigError | None = None
    held: dict[str, Any] | None = None  # the live Deployment of a model waiting for a rollout slot
    adopted: list[str] = field(default_factory=list)  # kinds of the children this pass adopted from a stale owner


class Children:
    def __init__(self, api: KubeApi, cache: WatchCache, pacer: Pacer, namespace: str, name: str,
                 fresh: bool) -> None:
        self.api, self.cache, self.pacer = api, cache, pacer
        self.namespace, self.name, self.fresh = namespace, name, fresh

    async def get(self, kind: str, name: str | None = None) -> dict[str, Any] | None:
        ref, name = CHILD_KINDS[kind], name or self.name
        cached = None if self.fresh else self.cache.get(ref.plural, self.namespace, name)
        if cached is not None:
            return cached
        live = await self.api.get(ref, self.namespace, name)
        if live is None:
            self.cache.discard(ref.plural, self.namespace, name)
        elif owned_by_label(live):  # a foreign object is never cached: it would hide a model's own next time
            self.cache.put(ref.plural, live)
        return live

    async def _optional(self, kind: str) -> dict[str, Any] | None:
        """A child the spec does not want: in the cache if it is ours; read fresh when the pass is."""
        if not self.fresh:
            return self.cache.get(CHILD_KINDS[kind].plural, self.namespace, self.name)
        if kind in CUSTOM_KINDS and not await self.api.serves(CHILD_KINDS[kind]):
            return None
        return await self.get(kind)

    async def pods(self) -> list[dict[str, Any]]:
        if self.fresh:
            listed = await self.api.list(PODS, self.namespace,
                                         label_selector=f"{selector_string(self.name)},{MANAGED_SELECTOR}")
            self.cache.replace_instance(PODS.plural, self.namespace, self.name, listed)
        return self.cache.of_instance(PODS.plural, self.namespace, self.name)

    async def observe(self, autoscaler: str | None) -> tuple[Observed, ConfigError | None]:
        """`autoscaler`: the name of the HPA that sets the replica count (ours, or KEDA's); None: no autoscaling.
        The Deployment, the pods and the HPA come from the cache; only the Events of pods on their way are listed.
        A LIST the API forbids (RBAC) is named, and the pass goes on with what it could read."""
        deployment = await self.get("Deployment")
        try:
            pods = await self.pods()
        except ForbiddenError as error:
            return Observed(deployment), refusal("list", "Pods", "in this namespace", error)
        events: dict[str, list[dict[str, Any]]] = {}
        refused = None
        for pod in [p for p in pods if needs_events(p)][:EVENT_PODS_PER_PASS]:
            about = f"involvedObject.uid={pod['metadata']['uid']}"
            try:
                events[pod["metadata"]["name"]] = await self.api.list(EVENTS, self.namespace, field_selector=about)
            except ForbiddenError as error:
                refused = refusal("list", "Events", "in this namespace", error)
                break
        hpa = None if autoscaler is None else await self.get("HorizontalPodAutoscaler", autoscaler)
        return Observed(deployment, pods, events, hpa), refused

    async def converge(self, model: ScoringModel, rendered: Rendered, wrote: list[str]) -> Converged:
        live: dict[str, dict[str, Any] | None] = {}
        for manifest in rendered.manifests:
            try:
                live[manifest["kind"]] = await self.get(manifest["kind"])
            except ForbiddenError as error:  # RBAC: the operator's role lacks a read
                return Converged(refusal("read", manifest["kind"], model.name, error))
        adopted = [kind for kind, obj in live.items() if obj is not None and adoptable(obj, model)]
        for kind, obj in live.items():
            if obj is not None and not owned_by(obj, model.uid) and kind not in adopted:
                return Converged(ConfigError("ChildConflict", f"{kind} {model.namespace}/{model.name} exists and is"
                                             " not owned by this ScoringModel; rename the ScoringModel or remove that"
                                             " object (the operator looks again, with backoff)"))
        for kind in adopted:
            try:
                live[kind] = await self._adopt(kind, live[kind], model)  # type: ignore[arg-type]
            except ForbiddenError as error:
                return Converged(refusal("adopt", kind, model.name, error))
            wrote.append(f"adopt {kind}")
        wanted = {m["kind"] for m in rendered.manifests}
        for kind in OPTIONAL_KINDS:  # first: an HPA of ours must be gone before KEDA's webhook admits a ScaledObject
            stale = None if kind in wanted else await self._optional(kind)
            if stale is not None and owned_by(stale, model.uid):
                try:
                    await self.api.delete(CHILD_KINDS[kind], model.namespace, model.name, stale["metadata"]["uid"])
                except ForbiddenError as error:
                    return Converged(refusal("delete", kind, model.name, error))
                self.cache.discard(CHILD_KINDS[kind].plural, model.namespace, model.name)
                wrote.append(f"delete {kind}")
        key = (model.namespace, model.name)
        decision = self.pacer.decide(key, model.generation, live["Deployment"], rendered.config_hash)
        try:
            error = await self._apply(model, rendered, live, decision, wrote)
        finally:
            self.pacer.settle(key)
        return Converged(error, live["Deployment"] if decision.hold else None, adopted)

    async def _apply(self, model: ScoringModel, rendered: Rendered, live: dict[str, dict[str, Any] | None],
                     decision: Decision, wrote: list[str]) -> ConfigError | None:
        for manifest in rendered.manifests:
            kind, current = manifest["kind"], live[manifest["kind"]]
            if decision.hold and kind in POD_KINDS and current is not None:
                continue  # waiting for a rollout slot: the pods keep running what they run
            if kind == "Deployment":
                finished = current is not None and self.pacer.finished(current)
                paced = paced_annotations(current, rendered.config_hash, decision, guaranteed(model), finished)
                manifest = {**manifest, "metadata": {**manifest["metadata"], "annotations": {
                    **manifest["metadata"].get("annotations", {}), **paced}}}
            handover = current is not None and kind == "Deployment" \
                and "replicas" not in manifest["spec"] and applies_field(current, FIELD_MANAGER, ("spec", "replicas"))
            if not (current is None or handover or not contains(current, manifest)
                    or left_out(current, manifest, FIELD_MANAGER)):
                continue
            try:
                if handover:
                    await self._hand_over_replicas(current)  # type: ignore[arg-type]
                applied = await self.api.apply(manifest)
            except (RejectedError, ForbiddenError) as error:
                return refusal("apply", kind, self.name, error)
            self.cache.put(CHILD_KINDS[kind].plural, applied)
            wrote.append(f"apply {kind}")
        return None

    async def _adopt(self, kind: str, obj: dict[str, Any], model: ScoringModel) -> dict[str, Any]:
        """Replace the stale owner references with ours, guarded by a `test` that they are still what was read.
        An apply alone cannot: ownerReferences merge by uid under server-side apply, so a stale reference another
        manager wrote (a restore, kubectl, Argo CD) stays beside ours, and two controller references are invalid
        (422). The guard also makes one of two operator replicas adopt (and post the Event), not both."""
        ref = CHILD_KINDS[kind]
        operations = [{"op": "test", "path": "/metadata/ownerReferences", "value": obj["metadata"]["ownerReferences"]},
                      {"op": "replace", "path": "/metadata/ownerReferences", "value": [owner_reference(model)]}]
        try:
            adopted = await self.api.json_patch(ref, self.namespace, self.name, operations)
        except RejectedError as error:  # changed or gone since it was read: a fresh pass looks again
            raise TransientApiError(error.status, "Conflict", f"{kind} {self.namespace}/{self.name} changed while"
                                    f" being adopted: {error.message}") from error
        self.cache.put(ref.plural, adopted)
        return adopted

    async def _hand_over_replicas(self, deployment: dict[str, Any]) -> None:
        """Autoscaling was just switched on: keep the live replica count until the HPA takes it over (then apply, to
        give up our ownership of replicas now)."""
        meta = deployment["metadata"]
        await self.api.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                              "spec": {"replicas": deployment["spec"].get("replicas", 1)}}, HANDOVER_FIELD_MANAGER)


def guaranteed(model: ScoringModel) -> int:
    """The capacity the model guarantees: its replicas, or with autoscaling its minReplicas."""
    replicas = desired_replicas(model)
    return model.spec.autoscaling.min_replicas if replicas is None else replicas


def adoptable(obj: dict[str, Any], model: ScoringModel) -> bool:
    """Ours before, by its labels, but its owner is an older ScoringModel of the same name (a backup restored, the
    model re-created while the garbage collector lagged): adopted, not a conflict. Nothing else owns it."""
    meta = obj.get("metadata") or {}
    labels, owners = meta.get("labels") or {}, meta.get("ownerReferences") or []
    return (owned_by_label(obj) and labels.get("app.kubernetes.io/instance") == model.name and bool(owners)
            and all(ref.get("kind") == "ScoringModel" and ref.get("name") == model.name
                    and ref.get("uid") != model.uid for ref in owners))


def owned_by_label(obj: dict[str, Any]) -> bool:
    """Carries the label the watches select on, so that the cache is kept current for it."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == MANAGED_BY
