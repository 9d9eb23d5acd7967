"""Pure: what is each worker pod doing? Serving, on its way (a wait), or failing (a failure with a specific reason).

Read from what kubelet, the scheduler and the cluster-autoscaler report: pod phase and conditions, container states
(with the worker's termination message), and the pod's Events, which carry what pod status cannot (a volume that
fails to mount or attach, a startup probe that ran out, a node being added). Waits are normal (scheduling, pulling,
loading, one restart); only failures make the model Degraded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from scorekeeper_operator.render.download import DOWNLOAD_CONTAINER
from scorekeeper_operator.status.events import PodEvents

WORKER_CONTAINER = "worker"
EXIT_MODEL_UNSERVABLE = 3  # 2 is a command-line error (argparse), 1 an unexpected crash
# Most severe first: the Degraded reason is the most severe failure found on any pod.
SEVERITY = ("ModelLoadFailed", "ModelDownloadFailed", "InvalidWorkerConfig", "WorkerCrashed", "OOMKilled",
            "StartupProbeTimeout", "CrashLoopBackOff", "ImagePullBackOff",
            "ErrImagePull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError",
            "RunContainerError", "MultiAttach", "FailedAttachVolume", "FailedMount", "UnexpectedAdmissionError",
            "Evicted", "PodFailed", "Unschedulable", "ProgressDeadlineExceeded")
_WAITING_FAILURES = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                               "CreateContainerError", "RunContainerError"})
_MESSAGE_LIMIT = 2048  # a termination message is at most 4096 bytes; keep the status readable


@dataclass(frozen=True)
class PodFailure:
    reason: str
    message: str
    pod: str
    container: str | None = None
    exit_code: int | None = None
    time: str | None = None

    @property
    def severity(self) -> int:
        return SEVERITY.index(self.reason) if self.reason in SEVERITY else len(SEVERITY)

    def as_status(self) -> dict[str, Any]:
        """The status.lastFailure shape (camelCase, absent rather than null)."""
        fields = asdict(self)
        fields["exitCode"] = fields.pop("exit_code")
        return {k: v for k, v in fields.items() if v is not None}

    def same_incident(self, other: dict[str, Any]) -> bool:
        mine = (self.reason, self.pod, self.container)
        return mine == (other.get("reason"), other.get("pod"), other.get("container"))


@dataclass(frozen=True)
class PodWait:
    """A pod on its way to serving: Scheduling, NodeProvisioning, ContainerCreating, Loading or Restarting."""

    reason: str
    message: str
    pod: str
    deadline_in: float | None = None  # seconds until this wait becomes a failure (Unschedulable)


@dataclass(frozen=True)
class PodState:
    name: str
    config_hash: str | None
    ready: bool
    terminal: bool  # phase Failed: evicted or refused by the kubelet; its replacement is another pod
    failure: PodFailure | None = None
    wait: PodWait | None = None
    # A terminal pod's failure explains missing capacity only until a replacement could have started: the seconds
    # left until then (None: the failure time is unknown, so it stays current).
    current_for: float | None = None


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def is_ready(pod: dict[str, Any]) -> bool:
    return _condition(pod, "Ready").get("status") == "True"


def _trim(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MESSAGE_LIMIT else message[:_MESSAGE_LIMIT - 1] + "…"


def _served_during(pod: dict[str, Any], run: dict[str, Any]) -> bool:
    """Did the pod turn Ready while this (terminated) container run lasted? Ready's lastTransitionTime moves only
    when Ready flips, so a flip after the run started means the run served, then went away."""
    flipped = _parse_time(_condition(pod, "Ready").get("lastTransitionTime"))
    started = _parse_time(run.get("startedAt"))
    return flipped is not None and started is not None and flipped > started


def _run_seconds(run: dict[str, Any]) -> float:
    started, finished = _parse_time(run.get("startedAt")), _parse_time(run.get("finishedAt"))
    return (finished - started).total_seconds() if started and finished else 0.0


def _exit_failure(run: dict[str, Any], podname: str, container: str) -> PodFailure:
    """A worker run that ended by itself before it was ready, named by its exit status."""
    exit_code, said = run["exitCode"], run.get("message") or ""
    if exit_code == EXIT_MODEL_UNSERVABLE:  # the worker's own verdict on the model: its termination message
        reason, text = "ModelLoadFailed", said or "the worker exited with code 3: the model cannot be served"
    elif exit_code == 2:
        reason, text = "InvalidWorkerConfig", f"the worker refused its configuration (exit code 2): {said}"
    else:
        reason, text = "WorkerCrashed", f"the worker exited with code {exit_code} before it was ready: {said}"
    return PodFailure(reason, _trim(text.rstrip(": ")), podname, container, exit_code, run.get("finishedAt"))


def _container_failure(pod: dict[str, Any], status: dict[str, Any], events: PodEvents,
                       startup_seconds: int) -> PodFailure | None:
    if status.get("ready"):
        return None  # it failed before but serves now: history (lastFailure), not a current failure
    name, podname = status.get("name"), pod["metadata"]["name"]
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    run = state.get("terminated") or (status.get("lastState") or {}).get("terminated") or {}
    exit_code, finished = run.get("exitCode"), run.get("finishedAt")
    restarts = status.get("restartCount", 0)
    served = bool(run) and _served_during(pod, run)
    # A run that served and was killed for memory is one restart; killed while loading (the model does not fit) or
    # again and again (a crash loop), it is the failure.
    if run.get("reason") == "OOMKilled" and (not served or waiting.get("reason") == "CrashLoopBackOff"):
        return PodFailure("OOMKilled", f"container {name} was killed for exceeding its memory limit"
                          f" (restarts: {restarts}); raise resources.memory", podname, name, exit_code, finished)
    if waiting.get("reason") in _WAITING_FAILURES:
        message = waiting.get("message") or waiting["reason"]
        if run:
            message += f"; last exit code {exit_code} ({run.get('reason', 'Error')})"
        return PodFailure(waiting["reason"], _trim(message), podname, name, exit_code, finished)
    if run and exit_code and not served:
        # The worker gave up by itself (api/termination.py: exit 3 when the model cannot be served); a kill is >= 128
        if name == WORKER_CONTAINER and exit_code < 128:
            return _exit_failure(run, podname, str(name))
        if name == DOWNLOAD_CONTAINER and exit_code < 128:  # its termination message names the cause
            said = run.get("message") or "see its log"
            return PodFailure("ModelDownloadFailed", _trim(f"the model download exited with code {exit_code}"
                                                           f" (restarts: {restarts}): {said}"), podname, name,
                              exit_code, finished)
        if name == WORKER_CONTAINER and (events.startup_probe_kill or _run_seconds(run) >= startup_seconds):
            return PodFailure("StartupProbeTimeout", f"model load and warm-up took longer than"
                              f" rollout.maxStartupSeconds ({startup_seconds}s) and kubelet restarted the worker"
                              f" (restarts: {restarts}); raise rollout.maxStartupSeconds", podname, name,
                              exit_code, finished)
    if waiting.get("reason") == "CrashLoopBackOff":
        message = waiting.get("message") or "CrashLoopBackOff"
        if run:
            message += f"; last exit code {exit_code} ({run.get('reason', 'Error')})"
            if run.get("message"):
                message += f": {run['message']}"
        return PodFailure("CrashLoopBackOff", _trim(message), podname, name, exit_code, finished)
    return None


def _failed_at(pod: dict[str, Any]) -> str | None:
    """When a pod in phase Failed failed: its conditions' last transitions (Ready turns False, DisruptionTarget turns
    True at an eviction), its containers' ends; else when it started. ISO 8601 in UTC sorts as text."""
    status = pod.get("status") or {}
    moments = [c.get("lastTransitionTime") for c in status.get("conditions") or []]
    moments += [((c.get("state") or {}).get("terminated") or {}).get("finishedAt")
                for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]]
    found = [m for m in moments if m]
    return max(found) if found else status.get("startTime")


def _terminal_failure(pod: dict[str, Any]) -> PodFailure:
    status, name = pod.get("status") or {}, pod["metadata"]["name"]
    reason = status.get("reason") or "Failed"
    message = _trim(status.get("message") or reason)
    if reason in ("Evicted", "UnexpectedAdmissionError"):
        return PodFailure(reason, message, name, time=_failed_at(pod))
    return PodFailure("PodFailed", f"{reason}: {message}", name, time=_failed_at(pod))


def waits_to_be_placed(pod: dict[str, Any]) -> bool:
    """The scheduler found no node for it (PodScheduled=False, Unschedulable)."""
    status = pod.get("status") or {}
    return _condition(pod, "PodScheduled").get("reason") == "Unschedulable" and status.get("phase") != "Failed" \
        and not is_ready(pod)


def placement_clock(pods: list[dict[str, Any]], before: dict[str, datetime], now: datetime) -> dict[str, datetime]:
    """When the operator first saw each pod that waits to be placed (kept from `before`, else `now`), by name. The
    scheduling deadline counts from there, on the operator's clock: the scheduler's timestamps come from another
    machine's clock (15 minutes ahead, a pod pending for 0 s was already past a 600 s deadline)."""
    return {pod["metadata"]["name"]: before.get(pod["metadata"]["name"], now) for pod in pods
            if waits_to_be_placed(pod)}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds // 60:.0f} min"


def _scheduling(pod: dict[str, Any], events: PodEvents, now: datetime, deadline: float, since: datetime,
                failed_before: bool) -> PodFailure | PodWait:
    scheduled = _condition(pod, "PodScheduled")
    name, message = pod["metadata"]["name"], scheduled.get("message") or "no node fits the pod"
    waited = max(0.0, (now - since).total_seconds())
    if events.no_scale_up is not None:
        return PodFailure("Unschedulable", _trim(f"{message}; the cluster-autoscaler cannot add a node:"
                                                 f" {events.no_scale_up}"), name, time=scheduled.get(
                                                     "lastTransitionTime"))
    if events.scale_up is not None:  # no deadline of ours: GPU nodes take long, and the autoscaler says if it fails
        return PodWait("NodeProvisioning", _trim(f"a node is being added: {events.scale_up}"), name)
    if waited >= deadline or failed_before:  # failed_before: past its deadline before this operator started
        said = f"for {_duration(waited)}" if waited >= deadline else "past its scheduling deadline"
        return PodFailure("Unschedulable", _trim(f"{message} ({said})"), name,
                          time=scheduled.get("lastTransitionTime"))
    return PodWait("Scheduling", _trim(message), name, deadline - waited)


def pod_state(pod: dict[str, Any], events: PodEvents, config_hash_key: str, *, now: datetime,
              startup_seconds: int, scheduling_deadline: float, unplaced_since: datetime | None = None,
              failed_before: bool = False) -> PodState:
    """`unplaced_since`: when the operator first saw it wait to be placed (None: now); `failed_before`: the previous
    status already named it Unschedulable (an operator restart does not turn that back into a wait)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    config_hash = (meta.get("annotations") or {}).get(config_hash_key)
    state = PodState(meta["name"], config_hash, ready=is_ready(pod), terminal=status.get("phase") == "Failed")
    if state.terminal:
        failure = _terminal_failure(pod)
        failed_at = _parse_time(failure.time)
        # A replacement may take the scheduling deadline to be placed and the startup budget to load: until then
        # the failure explains missing capacity; after that it is history (an eviction yesterday is not today's).
        current_for = None if failed_at is None \
            else startup_seconds + scheduling_deadline - (now - failed_at).total_seconds()
        return replace(state, failure=failure, current_for=current_for)
    if state.ready:
        return state
    if _condition(pod, "PodScheduled").get("reason") == "Unschedulable":
        outcome = _scheduling(pod, events, now, scheduling_deadline, unplaced_since or now, failed_before)
        return replace(state, failure=outcome) if isinstance(outcome, PodFailure) else replace(state, wait=outcome)
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    failures = [f for c in containers if (f := _container_failure(pod, c, events, startup_seconds)) is not None]
    if failures:
        return replace(state, failure=min(failures, key=lambda f: f.severity))
    started = any(set(c.get("state") or {}) - {"waiting"} or c.get("lastState") for c in containers)
    if not started and events.volume is not None:  # volumes block a pod before any container starts
        reason, message = events.volume
        return replace(state, failure=PodFailure(reason, _trim(message), state.name))
    restarts = sum(c.get("restartCount", 0) for c in containers)
    if restarts:
        return replace(state, wait=PodWait("Restarting", f"restarted {restarts} times; loading again", state.name))
    if started:
        return replace(state, wait=PodWait("Loading", "loading and warming up the model", state.name))
    return replace(state, wait=PodWait("ContainerCreating", "pulling the image and mounting volumes", state.name))


def needs_events(pod: dict[str, Any]) -> bool:
    """Pods whose Events can tell more than their status: unscheduled, not yet started, or restarted."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") == "Failed" or is_ready(pod):
        return False
    containers = status.get("containerStatuses") or []
    return status.get("phase") == "Pending" or any(c.get("restartCount") for c in containers)


def last_failure(current: list[PodFailure], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The failure to remember: the worst current one, or the previous record while nothing fails.

    The same incident keeps its first record, so an unchanged failure does not rewrite the status on every event.
    """
    if not current:
        return previous
    worst = current[0]
    if previous and worst.same_incident(previous):
        return previous
    return worst.as_status()
