"""Pure: what a worker pod's Events say that its status cannot.

Volume mount and attach failures (kubelet's FailedMount, the attach-detach controller's FailedAttachVolume with its
"Multi-Attach error", e.g. a ReadWriteOnce claim shared by two replicas on different nodes), a startup probe that
ran out (kubelet's Killing), and whether the cluster-autoscaler is adding a node for an unschedulable pod
(TriggeredScaleUp; Karpenter's Nominated) or cannot (NotTriggerScaleUp, FailedScaleUp).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_VOLUME_REASONS = frozenset({"FailedMount", "FailedAttachVolume"})
# The cluster-autoscaler's TriggeredScaleUp; Karpenter's Nominated (the pod will go to a NodeClaim being launched).
_SCALE_UP = frozenset({"TriggeredScaleUp", "Nominated"})
_NO_SCALE_UP = frozenset({"NotTriggerScaleUp", "FailedScaleUp"})


@dataclass(frozen=True)
class PodEvents:
    volume: tuple[str, str] | None = None  # (MultiAttach | FailedAttachVolume | FailedMount, message), the newest
    startup_probe_kill: bool = False
    scale_up: str | None = None  # a node is being added for this pod (newer than any refusal)
    no_scale_up: str | None = None  # the cluster-autoscaler will not add one (newer than any scale-up)


def _when(event: dict[str, Any]) -> str:
    """The newest time the event was seen (ISO 8601 sorts as text)."""
    return str((event.get("series") or {}).get("lastObservedTime") or event.get("lastTimestamp")
               or event.get("eventTime") or event.get("firstTimestamp") or "")


def _volume_reason(event: dict[str, Any]) -> str:
    if event.get("reason") == "FailedAttachVolume" and "Multi-Attach" in (event.get("message") or ""):
        return "MultiAttach"
    return str(event["reason"])


def pod_events(events: Iterable[dict[str, Any]]) -> PodEvents:
    ordered = sorted(events, key=_when)
    volume = [e for e in ordered if e.get("reason") in _VOLUME_REASONS]
    autoscaler = [e for e in ordered if e.get("reason") in _SCALE_UP | _NO_SCALE_UP]
    newest = autoscaler[-1] if autoscaler else {}
    return PodEvents(
        volume=(_volume_reason(volume[-1]), str(volume[-1].get("message") or "")) if volume else None,
        startup_probe_kill=any(e.get("reason") == "Killing" and "startup probe" in (e.get("message") or "")
                               for e in ordered),
        scale_up=str(newest.get("message") or "") if newest.get("reason") in _SCALE_UP else None,
        no_scale_up=str(newest.get("message") or "") if newest.get("reason") in _NO_SCALE_UP else None,
    )
