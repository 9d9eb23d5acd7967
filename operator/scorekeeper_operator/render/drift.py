"""Pure: does the live object already contain everything we would apply? Then applying again is pointless.

The API adds defaults and other managers' fields (clusterIP, `kubectl rollout restart`'s annotation, status), so the
test is containment, not equality: every field we render must be present with our value; extra fields are fine,
except those we applied before and no longer render (a label dropped from monitoring.labels): only an apply without
them removes them, so their presence is drift too (`left_out`, read from our entry in managedFields).
Quantities are compared by value: the API stores `0.5` as `500m` and `1.5Gi` as `1536Mi`.
"""

from __future__ import annotations

from typing import Any

from scorekeeper_operator.spec.quantity import same_quantity

# Where our manifests carry quantities: container requests/limits (maps of them), emptyDir sizeLimit, HPA targets.
_QUANTITY_MAPS = frozenset({"requests", "limits"})
_QUANTITY_FIELDS = frozenset({"sizeLimit", "averageValue"})


def contains(live: Any, desired: Any, key: str = "", parent: str = "") -> bool:
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v, k, key) for k, v in desired.items())
    if isinstance(desired, list):
        # Our lists (containers, ports, env, volumes) are complete: same length, element-wise containment.
        return isinstance(live, list) and len(live) == len(desired) \
            and all(contains(item, want, key, parent) for item, want in zip(live, desired, strict=True))
    if parent in _QUANTITY_MAPS or key in _QUANTITY_FIELDS:
        return same_quantity(live, desired)
    return bool(live == desired)


def applies_field(obj: dict[str, Any], manager: str, path: tuple[str, ...]) -> bool:
    """Does `manager` own this field through server-side apply (per metadata.managedFields)?"""
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        fields = entry.get("fieldsV1") or {}
        for key in path:
            fields = fields.get(f"f:{key}") if isinstance(fields, dict) else None
        if fields is not None:
            return True
    return False


def _extra_fields(owned: dict[str, Any], desired: Any) -> bool:
    """Does the fieldsV1 set `owned` name a map key that `desired` lacks? Only `f:` (map) keys are followed: list
    entries (`k:`, `v:`, `i:`) are compared element-wise by `contains`, since our lists are complete."""
    for key, sub in owned.items():
        if not key.startswith("f:"):
            continue
        if not isinstance(desired, dict) or key[2:] not in desired:
            return True
        if isinstance(sub, dict) and isinstance(desired[key[2:]], dict) and _extra_fields(sub, desired[key[2:]]):
            return True
    return False


def left_out(obj: dict[str, Any], desired: dict[str, Any], manager: str) -> bool:
    """Does `manager` still own, through server-side apply, a field that `desired` no longer has?"""
    return any(_extra_fields(entry.get("fieldsV1") or {}, desired)
               for entry in obj.get("metadata", {}).get("managedFields") or []
               if entry.get("manager") == manager and entry.get("operation") == "Apply")


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])
