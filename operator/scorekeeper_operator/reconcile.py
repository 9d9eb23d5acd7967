"""parse → render → apply → observe for one ScoringModel: one idempotent, level-based pass on fresh reads.

Every trigger (the ScoringModel changed, a child changed or vanished, a pod crashed, a timer) runs the same pass, so
the status is always written from the newest observation, whoever triggered it. Passes run in schedule.Scheduler's
per-model worker; each one logs a PassReport (what it read, what it wrote, when it runs again) at DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scorekeeper_operator import metrics
from scorekeeper_operator.hub import HubUnavailable, Unresolvable, resolve_revision
from scorekeeper_operator.image_rollout import RECHECK_SECONDS, ImageRollout
from scorekeeper_operator.k8s import (
    CHILD_KINDS,
    DISCOVERY_TTL_SECONDS,
    EVENTS,
    FIELD_MANAGER,
    HANDOVER_FIELD_MANAGER,
    PODS,
    SCORING_MODELS,
    KubeApi,
    RejectedError,
)
from scorekeeper_operator.render.drift import applies_field, contains, owned_by
from scorekeeper_operator.render.manifests import (
    MANAGED_SELECTOR,
    OPTIONAL_KINDS,
    Rendered,
    autoscaler_name,
    desired_replicas,
    endpoint,
    render,
    selector_string,
)
from scorekeeper_operator.schedule import Key, Scheduler
from scorekeeper_operator.spec.model import AutoscalerProvider, InvalidSpec, ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_operator.status.compute import Assessment, ConfigError, Desired, Observed, compute_status
from scorekeeper_operator.status.pods import needs_events

logger = logging.getLogger(__name__)
# Conflicts and rejections can heal without a spec edit (the foreign object is deleted, a quota raised): look again.
HEALABLE = frozenset({"ChildConflict", "Rejected"})
KEDA_UNAVAILABLE = "KedaUnavailable"  # healed by installing KEDA: looked at again once discovery may have changed
# Children whose API exists only once an add-on (Prometheus Operator, KEDA) is installed.
CUSTOM_KINDS = ("ServiceMonitor", "ScaledObject")
EVENT_PODS_PER_PASS = 5  # Events are read per pod (by uid), for at most this many pods that are not ready


@dataclass
class PassReport:
    """One pass, for the log (and the tests): when it started, what it wrote, its error, when it runs again."""

    key: Key
    started: float = field(default_factory=time.monotonic)
    wrote: list[str] = field(default_factory=list)
    error: str | None = None
    gone: bool = False
    next_pass_in: float | None = None


def utc_now() -> datetime:
    return datetime.now(UTC)


def _scaling_and_startup(model: ScoringModel) -> dict[str, Any]:
    scaling = model.spec.autoscaling
    return {"min_replicas": scaling.min_replicas if scaling.enabled else None,
            "startup_seconds": model.spec.rollout.max_startup_seconds}


class Reconciler:
    def __init__(self, api: KubeApi, settings: OperatorSettings, clock: Callable[[], datetime] = utc_now) -> None:
        self.api, self.settings, self._clock = api, settings, clock
        self.scheduler: Scheduler[ConfigError | None] = Scheduler(self._pass, settings.retry_delay)
        self.image_rollout = ImageRollout(api, settings)

    async def reconcile(self, namespace: str, name: str) -> ConfigError | None:
        """A pass now (for the kopf handlers). Returns the configuration error written to status, if any."""
        return await self.scheduler.run_soon((namespace, name))

    def trigger(self, namespace: str, name: str) -> None:
        """A pass soon (for watch events on children), coalesced with any already due."""
        self.scheduler.trigger((namespace, name))

    async def close(self) -> None:
        await self.scheduler.close()
        self.api.close()

    @metrics.instrumented
    async def _pass(self, key: Key) -> ConfigError | None:
        report = PassReport(key)
        namespace, name = key
        body = await self.api.get(SCORING_MODELS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            report.gone = True  # gone or going: ownerReferences let the garbage collector remove the children
            self.scheduler.retire(key)
            self.image_rollout.waiting.discard(key)
            metrics.UPGRADES_WAITING.set(len(self.image_rollout.waiting))
            logger.debug("pass %s/%s: the ScoringModel is gone", *key, extra={"pass_report": report})
            return None
        model, error = self._parse(body)
        if model is not None:
            model, error = await self._pin_revision(model, report)
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
                error = await self._converge(model, rendered, report)
            pending = image.pending
        desired = Desired(
            generation=int(body["metadata"].get("generation") or 0), selector=selector_string(name),
            endpoint=endpoint(name, namespace), rendered=rendered if error is None else None, config_error=error,
            fixed_replicas=desired_replicas(model) if model is not None else None,
            model_source=model.model_status() if model is not None else (body.get("status") or {}).get("model"),
            pending_image=pending, **(_scaling_and_startup(model) if model is not None else {}))
        observed = await self._observe(key, autoscaler_name(model) if model is not None else None)
        assessment = compute_status(desired, observed, body.get("status") or {}, self._clock())
        if await self._write_status(body, assessment.status):
            report.wrote.append("status")
        report.error = error.reason if error is not None else None
        self._schedule_next(key, error, assessment, pending, report)
        self._release_waiting(key, observed.deployment)
        logger.debug("pass %s/%s: wrote %s; next pass in %.1fs", *key, ", ".join(report.wrote) or "nothing",
                     report.next_pass_in, extra={"pass_report": report})
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

    async def _pin_revision(self, model: ScoringModel,
                            report: PassReport) -> tuple[ScoringModel | None, ConfigError | None]:
        """hf:// without a commit yet: ask the Hub once. The commit goes to status.model before anything is applied,
        so no later pass (another replica count, an operator restart) can ever ask again and get another one.
        A Hub that does not answer raises HubUnavailable: the scheduler retries the pass with backoff."""
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
        report.wrote.append("status.model")
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

    async def _converge(self, model: ScoringModel, rendered: Rendered, report: PassReport) -> ConfigError | None:
        """Apply what is missing or drifted, delete optional children no longer wanted, leave foreign objects be."""
        live = {m["kind"]: await self.api.get(CHILD_KINDS[m["kind"]], model.namespace, model.name)
                for m in rendered.manifests}
        for kind, obj in live.items():
            if obj is not None and not owned_by(obj, model.uid):
                return ConfigError("ChildConflict", f"{kind} {model.namespace}/{model.name} exists and is not owned by"
                                   " this ScoringModel; rename the ScoringModel or remove that object (the operator"
                                   " looks again, with backoff)")
        for manifest in rendered.manifests:
            kind, current = manifest["kind"], live[manifest["kind"]]
            handover = current is not None and kind == "Deployment" \
                and "replicas" not in manifest["spec"] and applies_field(current, FIELD_MANAGER, ("spec", "replicas"))
            try:
                if handover:
                    await self._hand_over_replicas(current)  # then apply, to give up our ownership of replicas now
                if current is None or handover or not contains(current, manifest):
                    await self.api.apply(manifest)
                    report.wrote.append(f"apply {kind}")
            except RejectedError as error:
                return ConfigError("Rejected", f"the API rejected {kind} {model.name}: {error.message}")
        wanted = {m["kind"] for m in rendered.manifests}
        for kind in OPTIONAL_KINDS:
            if kind in wanted or (kind in CUSTOM_KINDS and not await self.api.serves(CHILD_KINDS[kind])):
                continue
            stale = await self.api.get(CHILD_KINDS[kind], model.namespace, model.name)
            if stale is not None and owned_by(stale, model.uid):
                await self.api.delete(CHILD_KINDS[kind], model.namespace, model.name, stale["metadata"]["uid"])
                report.wrote.append(f"delete {kind}")
        return None

    async def _observe(self, key: Key, autoscaler: str | None) -> Observed:
        """`autoscaler`: the name of the HPA that sets the replica count (ours, or KEDA's); None: no autoscaling."""
        namespace, name = key
        deployment = await self.api.get(CHILD_KINDS["Deployment"], namespace, name)
        pods = await self.api.list(PODS, namespace, label_selector=f"{selector_string(name)},{MANAGED_SELECTOR}")
        events: dict[str, list[dict[str, Any]]] = {}
        for pod in [p for p in pods if needs_events(p)][:EVENT_PODS_PER_PASS]:
            about = f"involvedObject.uid={pod['metadata']['uid']}"
            events[pod["metadata"]["name"]] = await self.api.list(EVENTS, namespace, field_selector=about)
        hpa = None if autoscaler is None \
            else await self.api.get(CHILD_KINDS["HorizontalPodAutoscaler"], namespace, autoscaler)
        return Observed(deployment, pods, events, hpa)

    def _schedule_next(self, key: Key, error: ConfigError | None, assessment: Assessment, pending: str | None,
                       report: PassReport) -> None:
        """The next timed pass: the earliest of the resync, a re-check of what heals without an event (a conflict,
        a rejection, KEDA getting installed, an upgrade slot freed by a deleted model), a deadline, Event polling."""
        delays = [self.settings.resync_seconds]
        if error is not None and error.reason in HEALABLE:
            delays.append(self.scheduler.backoff(key, "blocked"))
        else:
            self.scheduler.settle(key, "blocked")
        if error is not None and error.reason == KEDA_UNAVAILABLE:
            delays.append(DISCOVERY_TTL_SECONDS)  # the API discovery cache's lifetime: no sooner can KEDA show up
        if pending is not None:
            delays.append(RECHECK_SECONDS)
        if assessment.recheck_in is not None:
            delays.append(assessment.recheck_in + 1.0)  # just past the deadline
        if assessment.waiting:
            delays.append(self.settings.poll_seconds)
        report.next_pass_in = min(delays)
        self.scheduler.after(key, report.next_pass_in)

    def _release_waiting(self, key: Key, deployment: dict[str, Any] | None) -> None:
        """A model that finished rolling out the new default image frees its slot: the waiting models go now."""
        if self.image_rollout.frees_a_slot(deployment):
            for waiting in sorted(self.image_rollout.waiting - {key}):
                self.scheduler.trigger(waiting)
        metrics.UPGRADES_WAITING.set(len(self.image_rollout.waiting))

    async def _hand_over_replicas(self, deployment: dict[str, Any]) -> None:
        """Autoscaling was just switched on: keep the live replica count until the HPA takes it over."""
        meta = deployment["metadata"]
        await self.api.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                              "spec": {"replicas": deployment["spec"].get("replicas", 1)}}, HANDOVER_FIELD_MANAGER)

    async def _write_status(self, body: dict[str, Any], status: dict[str, Any]) -> bool:
        previous = body.get("status") or {}
        if status == previous:
            return False  # unchanged: no write, no event, no loop
        removed = {key: None for key in previous if key not in status}  # merge-patch deletes keys set to null
        meta = body["metadata"]
        try:
            await self.api.patch_status(SCORING_MODELS, meta["namespace"], meta["name"], {**removed, **status})
        except RejectedError as error:
            if error.status != 404:
                raise  # 404: deleted since we read it; nothing left to report on
            return False
        return True
