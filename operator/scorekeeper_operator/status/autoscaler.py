"""Pure: the HorizontalPodAutoscaler's own conditions → the ScoringModel's `Autoscaling` condition.

An HPA that cannot read its metric (no Prometheus adapter, a wrong metric name) or cannot scale its target says so
only on itself (ScalingActive=False, AbleToScale=False); users look at the ScoringModel.
"""

from __future__ import annotations

from typing import Any

# AbleToScale=False with these reasons is the HPA waiting out its own stabilization windows: normal.
_BACKOFF_REASONS = frozenset({"BackoffBoth", "BackoffDownscale", "BackoffUpscale"})


def autoscaling_condition(hpa: dict[str, Any] | None) -> tuple[bool | None, str, str]:
    if hpa is None:
        return None, "AutoscalerMissing", "the HorizontalPodAutoscaler does not exist yet"
    status = hpa.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if not conditions:
        return None, "AwaitingAutoscaler", "the HorizontalPodAutoscaler has not reported yet"
    for kind in ("AbleToScale", "ScalingActive"):
        found = conditions.get(kind, {})
        if found.get("status") == "False" and found.get("reason") not in _BACKOFF_REASONS:
            reason = found.get("reason") or f"{kind}False"
            return False, reason, f"HorizontalPodAutoscaler {kind}=False ({reason}): {found.get('message', '')}"
    spec = hpa.get("spec") or {}
    counts = (f"{status.get('currentReplicas', 0)} replicas, desired {status.get('desiredReplicas', 0)}"
              f" (min {spec.get('minReplicas', 1)}, max {spec.get('maxReplicas', '?')})")
    limited = conditions.get("ScalingLimited", {})
    if limited.get("status") == "True":
        return True, "ScalingLimited", f"{counts}; {limited.get('message', '')}"
    return True, "ScalingActive", counts
