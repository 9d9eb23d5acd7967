"""parse → render → apply → observe for one ScoringModel: one idempotent, level-based pass on fresh reads.

Every trigger (the ScoringModel changed, a child changed or vanished, a pod crashed, a timer) runs the same pass, so
the status is always written from the newest observation, whoever triggered it. Passes run in schedule.Scheduler's
per-model worker; each one logs a PassReport (what it read, what it wrote, when it runs again) at DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from scorekeeper_operator import metrics
from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.children import REFUSALS, Children, Converged
from scorekeeper_operator.hub import HubUnavailable, Unresolvable, resolve_revision
from scorekeeper_operator.k8s import (
    CHILD_KINDS,
    DISCOVERY_TTL_SECONDS,
    EVENTS,
    SCORING_MODELS,
    KubeApi,
    RejectedError,
)
from scorekeeper_operator.pacing import Pacer, stall_reason, template_hash
from scorekeeper_operator.render.manifests import (
    Rendered,
    autoscaler_name,
    desired_replicas,
    endpoint,
    event_about,
    render,
    selector_string,
)
from scorekeeper_operator.schedule import Key, Scheduler
from scorekeeper_operator.spec.model import AutoscalerProvider, InvalidSpec, ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_operator.status.compute import Assessment, ConfigError, Desired, compute_status
from scorekeeper_operator.status.pods import placement_clock

logger = logging.getLogger(__name__)
# What can heal without a spec edit (the foreign object is deleted, a quota raised, a policy changed, the Hub answers
# again): looked at again with backoff.
HEALABLE = frozenset({"ChildConflict", "HubUnavailable", *REFUSALS})
KEDA_UNAVAILABLE = "KedaUnavailable"  # healed by installing KEDA: looked at again once discovery may have changed


@dataclass
class PassReport:
    """One pass, for the log (and the tests): when it started, what it wrote, its error, when it runs again."""

    key: Key
    started: float = field(default_factory=time.monotonic)
    wrote: list[str] = field(default_factory=list)
    error: str | None = None
    gone: bool = False
    held: bool = False  # a spec edit came within the debounce window of the last one rendered: nothing rendered
    next_pass_in: float | None = None


def utc_now() -> datetime:
    return datetime.now(UTC)


def _scaling_and_startup(model: ScoringModel) -> dict[str, Any]:
    scaling = model.spec.autoscaling
    return {"min_replicas": scaling.min_replicas if scaling.enabled else None,
            "startup_seconds": model.spec.startup_seconds,
            "scheduling_deadline": float(model.spec.rollout.scheduling_deadline_seconds)}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def _degraded(status: dict[str, Any]) -> str:
    found = _condition(status, "Degraded")
    return str(found.get("reason", "")) if found.get("status") == "True" else ""


def running(deployment: dict[str, Any], rendered: Rendered) -> Rendered:
    """What a model waiting for a rollout slot runs: its live Deployment's configuration, for the status."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return Rendered(manifests=[], config_hash=template_hash(deployment) or "", worker_args=container.get("args", []),
                    worker_image=container.get("image", rendered.worker_image))


class Reconciler:
    def __init__(self, api: KubeApi, settings: OperatorSettings, clock: Callable[[], datetime] = utc_now) -> None:
        self.api, self.settings, self._clock = api, settings, clock
        self.scheduler: Scheduler[ConfigError | None] = Scheduler(self._pass, settings.retry_delay)
        self.cache = WatchCache()
        self.pacer = Pacer(settings.max_concurrent_upgrades, self.cache)
        self._fresh_until: dict[Key, float] = {}  # until when a model's passes may read the cache
        self._fresh_wanted: set[Key] = set()
        self._rendered: dict[Key, tuple[int, float]] = {}  # the last generation rendered, and when it was first
        # Commits this operator resolved, per object and source: a pass that reads the object before the status
        # patch of an earlier one (passes are no longer serialised with kopf's handlers) pins the same commit
        # without asking the Hub again.
        self._pinned: dict[Key, tuple[tuple[str, str, str | None], str]] = {}  # (uid, repo, revision), commit
        self._unplaced: dict[Key, dict[str, datetime]] = {}  # pods waiting to be placed → when first seen waiting

    async def reconcile(self, namespace: str, name: str) -> ConfigError | None:
        """A pass now, reading everything fresh (for the kopf handlers: create, resume). Returns the configuration
        error written to status, if any."""
        self._fresh_wanted.add((namespace, name))
        return await self.scheduler.run_soon((namespace, name))

    def edited(self, namespace: str, name: str) -> None:
        """The spec changed (the kopf update handler): a fresh pass now, unless another edit came within the debounce
        window; then one pass once the edits stop for that long, so a burst is rendered (and rolled out) once."""
        self._fresh_wanted.add((namespace, name))
        self.scheduler.edited((namespace, name), self.settings.debounce_seconds)

    def trigger(self, namespace: str, name: str) -> None:
        """A pass soon (for watch events on children), coalesced with any already due."""
        self.scheduler.trigger((namespace, name))

    def observe(self, plural: str, event_type: str | None, obj: dict[str, Any]) -> None:
        """A watch event on a child or a worker pod (handlers.py): keep the cache current. A Deployment's event may
        free a rollout slot (its rollout completed, or its model is gone): the next waiting model goes."""
        if event_type == "DELETED":
            self.cache.delete(plural, obj)
        else:
            self.cache.put(plural, obj)
        if plural == CHILD_KINDS["Deployment"].plural:
            if event_type != "DELETED":
                self.pacer.seen(obj)  # a paced rollout's progress counts once it is seen
            self._release_waiting()

    async def close(self) -> None:
        await self.scheduler.close()
        self.api.close()

    def _fresh(self, key: Key) -> bool:
        """Read from the API rather than the cache: on a spec change, after an error, and every resync period."""
        fresh = key in self._fresh_wanted or time.monotonic() >= self._fresh_until.pop(key, 0.0)
        self._fresh_wanted.discard(key)
        return fresh

    @metrics.instrumented
    async def _pass(self, key: Key) -> ConfigError | None:
        report = PassReport(key)
        namespace, name = key
        fresh = self._fresh(key)
        body = await self.api.get(SCORING_MODELS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            report.gone = True  # gone or going: ownerReferences let the garbage collector remove the children
            self.scheduler.retire(key)
            self.pacer.forget(key)
            self._tell_waiting()
            self.cache.forget_instance(namespace, name)
            self._rendered.pop(key, None)
            self._pinned.pop(key, None)
            self._unplaced.pop(key, None)
            self._release_waiting()
            logger.debug("pass %s/%s: the ScoringModel is gone", *key, extra={"pass_report": report})
            return None
        if self._settling(key, int(body["metadata"].get("generation") or 0)):
            if fresh:
                self._fresh_wanted.add(key)
            report.held = True
            logger.debug("pass %s/%s: a spec edit within %.1fs of the last one rendered: held", *key,
                         self.settings.debounce_seconds, extra={"pass_report": report})
            return None
        children = Children(self.api, self.cache, self.pacer, namespace, name, fresh)
        model, error = self._parse(body)
        if model is not None:
            model, error = await self._pin_revision(model, report)
        keda_api = False
        if model is not None:
            keda_api, error = await self._keda_api(model)
        rendered: Rendered | None = None
        converged = Converged(error)
        if model is not None and error is None:
            monitor_api = model.spec.monitoring.service_monitor \
                and await self.api.serves(CHILD_KINDS["ServiceMonitor"])
            rendered = render(model, self.settings, service_monitor_api=monitor_api, keda_api=keda_api)
            converged = await children.converge(model, rendered, report.wrote)
            error = converged.error
        if converged.held is None:  # it took a slot, needed none, or never got to the decision: it waits no more
            self.pacer.withdraw(key)
        pending: dict[str, str | None] = {}
        shown = rendered
        if rendered is not None and converged.held is not None:  # waiting: the status shows what runs
            shown = running(converged.held, rendered)
            pending = {"pending_config_hash": rendered.config_hash, "slot_wait": self.pacer.wait_note(),
                       "pending_image": rendered.worker_image if rendered.worker_image != shown.worker_image
                       else None}
        for kind in converged.adopted:
            if await self._post_event(body, "Normal", "Adopted", f"{kind} {namespace}/{name} carried this model's"
                                      " labels but named an older ScoringModel of this name as its owner: adopted"):
                report.wrote.append("event")
        desired = Desired(
            generation=int(body["metadata"].get("generation") or 0), selector=selector_string(name),
            endpoint=endpoint(name, namespace), rendered=shown if error is None else None, config_error=error,
            fixed_replicas=desired_replicas(model) if model is not None else None,
            model_source=model.model_status() if model is not None else (body.get("status") or {}).get("model"),
            **pending, **(_scaling_and_startup(model) if model is not None else {}))  # type: ignore[arg-type]
        observed, refused = await children.observe(autoscaler_name(model) if model is not None else None)
        if refused is not None:  # the re-check LISTs again (the cache would say nothing of the refusal)
            self._fresh_wanted.add(key)
        if refused is not None and error is None:  # a 403 on a LIST: in status like a refused write, re-checked
            error = refused
            desired = replace(desired, config_error=error)
        now = self._clock()
        self._unplaced[key] = placement_clock(observed.pods, self._unplaced.get(key, {}), now)
        observed = replace(observed, unplaced_since=self._unplaced[key])
        assessment = compute_status(desired, observed, body.get("status") or {}, now)
        if model is not None:
            self.pacer.report(key, observed.deployment, _degraded(assessment.status), stall_reason(assessment.status))
        self._tell_waiting()
        if await self._write_status(body, assessment.status):
            report.wrote.append("status")
            if error is not None and await self._announce(body, error):
                report.wrote.append("event")
        report.error = error.reason if error is not None else None
        self._schedule_next(key, error, assessment, report)
        self._fresh_until[key] = time.monotonic() + self.settings.resync_seconds
        self._release_waiting()
        logger.debug("pass %s/%s: wrote %s; next pass in %.1fs", *key, ", ".join(report.wrote) or "nothing",
                     report.next_pass_in, extra={"pass_report": report})
        return error

    def _settling(self, key: Key, generation: int) -> bool:
        """Debounce on the pass's side: a generation newer than the last one rendered, which was rendered less than
        the window ago, waits until the edits stop (kopf may not have delivered the edit yet: a pass for a child
        event must not render it either). Otherwise the generation counts as rendered from now on."""
        window, now = self.settings.debounce_seconds, time.monotonic()
        last = self._rendered.get(key)
        if last is not None and last[0] != generation and now - last[1] < window:
            self.scheduler.edited(key, window, settling=True)
            return True
        if last is None or last[0] != generation:
            self._rendered[key] = (generation, now)
        return False

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
        A Hub that does not answer is a condition too (HubUnavailable), looked at again with backoff."""
        source = model.spec.model
        if source.scheme != "hf" or model.hf_commit is not None:
            return model, None
        key, asked = (model.namespace, model.name), (model.uid, source.hf_repo, source.revision)
        known = self._pinned.get(key)
        try:
            commit = known[1] if known is not None and known[0] == asked else \
                await resolve_revision(self.settings, source.hf_repo, source.revision)
        except Unresolvable as refused:
            metrics.HUB_RESOLUTIONS.labels("refused").inc()
            return None, ConfigError(refused.reason, refused.message)
        except HubUnavailable as error:
            metrics.HUB_RESOLUTIONS.labels("unavailable").inc()
            return None, ConfigError("HubUnavailable", f"{error.message}; nothing is applied until the Hub answers"
                                     " (retried with backoff)")
        if self._pinned.get(key) != (asked, commit):
            self._pinned[key] = (asked, commit)
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

    def _schedule_next(self, key: Key, error: ConfigError | None, assessment: Assessment, report: PassReport) -> None:
        """The next timed pass: the earliest of the resync, a re-check of what heals without an event (a conflict,
        a refusal, the Hub answering again, KEDA getting installed), a deadline, Event polling. A model waiting for a
        rollout slot needs none: a Deployment event frees the slot (_release_waiting)."""
        delays = [self.settings.resync_seconds]
        if error is not None and error.reason in HEALABLE:
            delays.append(self.scheduler.backoff(key, "blocked"))
        else:
            self.scheduler.settle(key, "blocked")
        if error is not None and error.reason == KEDA_UNAVAILABLE:
            delays.append(DISCOVERY_TTL_SECONDS)  # the API discovery cache's lifetime: no sooner can KEDA show up
        if assessment.recheck_in is not None:
            delays.append(assessment.recheck_in + 1.0)  # just past the deadline
        if assessment.waiting:
            delays.append(self.settings.poll_seconds)
        report.next_pass_in = min(delays)
        self.scheduler.after(key, report.next_pass_in)

    def _tell_waiting(self) -> None:
        """When what the waiting models say about the wave changed (a holder got stuck, or stopped being): a pass
        each. Never while the holders move, so a wave costs each waiting model a write or two, not one per step."""
        if self.pacer.news():
            for waiting in self.pacer.waiting:
                self.scheduler.trigger(waiting)

    def _release_waiting(self) -> None:
        """Free rollout slots go to the models that have waited longest: one pass each, not one per waiting model."""
        for key in self.pacer.next_up() if self.pacer.waiting else ():
            self.scheduler.trigger(key)
        metrics.UPGRADES_WAITING.set(len(self.pacer.waiting))

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

    async def _announce(self, body: dict[str, Any], error: ConfigError) -> bool:
        """A Warning Event when a configuration error appears or changes (`kubectl describe` and event exporters show
        it), posted by the pass that wrote it to status: every path, kopf handler or retry, says so at once."""
        before = _condition(body.get("status") or {}, "ConfigValid")
        if (before.get("status"), before.get("reason"), before.get("message")) == ("False", error.reason,
                                                                                  error.message):
            return False
        return await self._post_event(body, "Warning", error.reason, error.message)

    async def _post_event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> bool:
        meta = body["metadata"]
        try:
            await self.api.create(EVENTS, meta["namespace"], event_about(meta, kind, reason, message, self._clock()))
        except Exception as failure:  # the status is written; an Event we cannot post is not worth a retry
            logger.warning("could not post the %s Event of %s/%s: %s", reason, meta["namespace"], meta["name"],
                           failure)
            return False
        return True
