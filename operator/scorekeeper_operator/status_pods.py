"""Pure: why are the worker pods not serving? Read from pod conditions and container states, as kubelet reports them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Most severe first: the Degraded reason is the most severe failure found on any pod.
SEVERITY = ("OOMKilled", "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
            "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "Unschedulable")
_WAITING_FAILURES = frozenset(SEVERITY) - {"OOMKilled", "Unschedulable"}


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


def _container_failure(pod: str, status: dict[str, Any]) -> PodFailure | None:
    if status.get("ready"):
        return None  # it failed before but serves now: history (lastFailure), not a current failure
    name = status.get("name")
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    if terminated.get("reason") == "OOMKilled":
        return PodFailure("OOMKilled", f"container {name} was killed for exceeding its memory limit"
                          f" (restarts: {status.get('restartCount', 0)}); raise resources.memory",
                          pod, name, exit_code, terminated.get("finishedAt"))
    if waiting.get("reason") in _WAITING_FAILURES:
        message = waiting.get("message") or waiting["reason"]
        if terminated:
            message += f"; last exit code {exit_code} ({terminated.get('reason', 'Error')})"
        return PodFailure(waiting["reason"], message, pod, name, exit_code, terminated.get("finishedAt"))
    return None


def pod_failures(pods: list[dict[str, Any]]) -> list[PodFailure]:
    """Current failures, most severe first. Pods on their way out (deletionTimestamp) do not count."""
    failures: list[PodFailure] = []
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name", "?")
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                    and condition.get("reason") == "Unschedulable":
                failures.append(PodFailure("Unschedulable", condition.get("message") or "no node fits the pod",
                                           name, time=condition.get("lastTransitionTime")))
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            if (failure := _container_failure(name, container)) is not None:
                failures.append(failure)
    return sorted(failures, key=lambda f: f.severity)


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


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
