"""parse → render → apply → observe for one ScoringModel, serialized per object and level-based.

Every trigger (the ScoringModel changed, a child changed or vanished, a pod crashed) runs the same idempotent pass
on fresh reads, so the status is always written from the newest observation, whoever triggered it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from scorekeeper_operator import metrics
from scorekeeper_operator.drift import applies_field, contains, owned_by
from scorekeeper_operator.hub import HubUnavailable, Unresolvable, resolve_revision
from scorekeeper_operator.image_rollout import RECHECK_SECONDS, ImageRollout
from scorekeeper_operator.k8s import (
    CHILD_KINDS,
    DISCOVERY_TTL_SECONDS,
    FIELD_MANAGER,
    HANDOVER_FIELD_MANAGER,
    PODS,
    SCORING_MODELS,
    KubeApi,
    RejectedError,
    TransientApiError,
)
from scorekeeper_operator.render import OPTIONAL_KINDS, Rendered, desired_replicas, endpoint, render, selector_string
from scorekeeper_operator.settings import OperatorSettings
from scorekeeper_operator.spec import AutoscalerProvider, InvalidSpec, ScoringModel
from scorekeeper_operator.status import ConfigError, Desired, Observed, compute_status

logger = logging.getLogger(__name__)
# Children whose API exists only once an add-on (Prometheus Operator, KEDA) is installed.
CUSTOM_KINDS = ("ServiceMonitor", "ScaledObject")
KEDA_UNAVAILABLE = "KedaUnavailable"
Key = tuple[str, str]  # (namespace, name)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(self, api: KubeApi, settings: OperatorSettings, clock: Callable[[], str] = utc_now) -> None:
        self.api, self.settings, self._clock = api, settings, clock
        self._locks: defaultdict[Key, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self.image_rollout = ImageRollout(api, settings)
        self._rechecks: dict[Key, asyncio.TimerHandle] = {}

    @metrics.instrumented
    async def reconcile(self, namespace: str, name: str) -> ConfigError | None:
        """One full pass. Returns the configuration error written to status, if any; raises TransientApiError."""
        async with self._locks[(namespace, name)]:
            body = await self.api.get(SCORING_MODELS, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None  # gone or going: ownerReferences let the garbage collector remove the children
            model, error = self._parse(body)
            if model is not None:
                model, error = await self._pin_revision(model)
            keda_api = False
            if model is not None:
                keda_api, error = await self._keda_api(model)
            rendered: Rendered | None = None
            pending: str | None = None
            if model is not None and error is None:
                monitor_api = model.spec.monitoring.service_monitor \
                    and await self.api.serves(CHILD_KINDS["ServiceMonitor"])
                async with self.image_rollout.decide(model) as image:
                    rendered = render(model, self.settings, service_monitor_api=monitor_api, keda_api=keda_api,
                                      worker_image=image.image)
                    error = await self._converge(model, rendered)
                pending = image.pending
            desired = Desired(
                generation=int(body["metadata"].get("generation") or 0), selector=selector_string(name),
                endpoint=endpoint(name, namespace), rendered=rendered if error is None else None,
                fixed_replicas=desired_replicas(model) if model is not None else None, config_error=error,
                model_source=model.model_status() if model is not None else (body.get("status") or {}).get("model"),
                pending_image=pending)
            observed = Observed(await self.api.get(CHILD_KINDS["Deployment"], namespace, name),
                                await self.api.list(PODS, namespace, selector_string(name)))
            await self._write_status(body, compute_status(desired, observed, body.get("status") or {}, self._clock()))
            self._schedule_followups((namespace, name), pending, error, observed.deployment)
            return error

    def _parse(self, body: dict[str, Any]) -> tuple[ScoringModel | None, ConfigError | None]:
        try:
            model = ScoringModel.from_body(body)
        except InvalidSpec as error:
            return None, ConfigError("InvalidSpec", str(error))
        source = model.spec.model
        if source.scheme == "hf" and not self.settings.allow_hf_download \
                and (source.pinned_commit is None or source.cache is None):
            return None, ConfigError("ModelSourceUnavailable", "this operator is configured without hf:// downloads"
                                     " (SCOREKEEPER_ALLOW_HF_DOWNLOAD=false): an hf:// model needs model.revision set"
                                     " to a 40-hex commit and a model.cache PVC that already holds it; or use a"
                                     " pvc:// or file:// model")
        return model, None

    async def _pin_revision(self, model: ScoringModel) -> tuple[ScoringModel | None, ConfigError | None]:
        """hf:// without a commit yet: ask the Hub once. The commit goes to status.model before anything is applied,
        so no later pass (another replica count, an operator restart) can ever ask again and get another one."""
        source = model.spec.model
        if source.scheme != "hf" or model.hf_commit is not None:
            return model, None
        try:
            commit = await resolve_revision(self.settings, source.hf_repo, source.revision)
        except Unresolvable as refused:
            metrics.HUB_RESOLUTIONS.labels("refused").inc()
            return None, ConfigError(refused.reason, refused.message)
        except HubUnavailable:
            metrics.HUB_RESOLUTIONS.labels("unavailable").inc()
            raise
        metrics.HUB_RESOLUTIONS.labels("resolved").inc()
        logger.info("%s/%s: %s@%s is commit %s", model.namespace, model.name, source.hf_repo,
                    source.revision or "default branch", commit)
        model = model.model_copy(update={"resolved_revision": commit})
        await self.api.patch_status(SCORING_MODELS, model.namespace, model.name, {"model": model.model_status()})
        return model, None

    async def _keda_api(self, model: ScoringModel) -> tuple[bool, ConfigError | None]:
        """Is KEDA's ScaledObject served, for a model that autoscales with KEDA? Without it nothing new is applied."""
        scaling = model.spec.autoscaling
        if not scaling.enabled or scaling.provider is not AutoscalerProvider.KEDA:
            return False, None
        if await self.api.serves(CHILD_KINDS["ScaledObject"]):
            return True, None
        return False, ConfigError(KEDA_UNAVAILABLE, "autoscaling.provider is KEDA, but keda.sh/v1alpha1 ScaledObjects"
                                  " are not served; install KEDA (checked again every minute)")

    def _schedule_followups(self, key: Key, pending: str | None, error: ConfigError | None,
                            deployment: dict[str, Any] | None) -> None:
        """Passes no watch event would start: a model waiting for an upgrade slot or for KEDA is looked at again
        later, and a finished upgrade lets the waiting models go."""
        timer = self._rechecks.pop(key, None)
        if timer is not None:
            timer.cancel()
        delay = RECHECK_SECONDS if pending else DISCOVERY_TTL_SECONDS if error and error.reason == KEDA_UNAVAILABLE \
            else None
        if delay is not None:
            self._rechecks[key] = asyncio.get_running_loop().call_later(delay, self.trigger, *key)
        if self.image_rollout.frees_a_slot(deployment):
            for waiting in sorted(self.image_rollout.waiting - {key}):
                self.trigger(*waiting)
        metrics.UPGRADES_WAITING.set(len(self.image_rollout.waiting))

    async def _converge(self, model: ScoringModel, rendered: Rendered) -> ConfigError | None:
        """Apply what is missing or drifted, delete optional children no longer wanted, leave foreign objects be."""
        live = {m["kind"]: await self.api.get(CHILD_KINDS[m["kind"]], model.namespace, model.name)
                for m in rendered.manifests}
        for kind, obj in live.items():
            if obj is not None and not owned_by(obj, model.uid):
                return ConfigError("ChildConflict", f"{kind} {model.namespace}/{model.name} exists and is not owned by"
                                   " this ScoringModel; rename the ScoringModel or remove that object")
        for manifest in rendered.manifests:
            current = live[manifest["kind"]]
            handover = current is not None and manifest["kind"] == "Deployment" \
                and "replicas" not in manifest["spec"] and applies_field(current, FIELD_MANAGER, ("spec", "replicas"))
            try:
                if handover:
                    await self._hand_over_replicas(current)  # then apply, to give up our ownership of replicas now
                if current is None or handover or not contains(current, manifest):
                    await self.api.apply(manifest)
            except RejectedError as error:
                return ConfigError("Rejected", f"the API rejected {manifest['kind']} {model.name}: {error.message}")
        wanted = {m["kind"] for m in rendered.manifests}
        for kind in OPTIONAL_KINDS:
            if kind in wanted or (kind in CUSTOM_KINDS and not await self.api.serves(CHILD_KINDS[kind])):
                continue
            stale = await self.api.get(CHILD_KINDS[kind], model.namespace, model.name)
            if stale is not None and owned_by(stale, model.uid):
                await self.api.delete(CHILD_KINDS[kind], model.namespace, model.name, stale["metadata"]["uid"])
        return None

    async def _hand_over_replicas(self, deployment: dict[str, Any]) -> None:
        """Autoscaling was just switched on: keep the live replica count until the HPA takes it over."""
        meta = deployment["metadata"]
        await self.api.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                              "spec": {"replicas": deployment["spec"].get("replicas", 1)}}, HANDOVER_FIELD_MANAGER)

    async def _write_status(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        previous = body.get("status") or {}
        if status == previous:
            return  # unchanged: no write, no event, no loop
        removed = {key: None for key in previous if key not in status}  # merge-patch deletes keys set to null
        meta = body["metadata"]
        try:
            await self.api.patch_status(SCORING_MODELS, meta["namespace"], meta["name"], {**removed, **status})
        except RejectedError as error:
            if error.status != 404:
                raise  # 404: deleted since we read it; nothing left to report on

    # Child events arrive through kopf's on.event handlers, which kopf never retries: retry here, with backoff,
    # and coalesce bursts (a rollout emits many pod events) into one extra pass.
    def trigger(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        if key in self._tasks:
            self._dirty.add(key)
        else:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key))

    async def _run(self, key: Key) -> None:
        attempt = 0
        try:
            while True:
                self._dirty.discard(key)
                try:
                    await self.reconcile(*key)
                    attempt = 0
                except Exception as error:  # transient API errors, and (like kopf) anything unexpected: back off
                    delay = self.settings.retry_delay(attempt)
                    attempt += 1
                    log = logger.warning if isinstance(error, TransientApiError) else logger.exception
                    log("reconciling %s/%s failed (%s); retrying in %.1fs", *key, error, delay)
                    await asyncio.sleep(delay)
                    continue
                if key not in self._dirty:
                    return
        finally:
            self._tasks.pop(key, None)

    async def close(self) -> None:
        for timer in self._rechecks.values():
            timer.cancel()
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self.api.close()
