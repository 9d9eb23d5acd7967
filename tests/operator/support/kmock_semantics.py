"""Pure API-server semantics the emulator adds to KMock: JSON merge patch, server-side apply's removal of fields
a manager stopped applying and its merge of map-type lists (ownerReferences by uid), the single-controller rule of
owner references, label selectors, the parsing of /api/v1/namespaces paths, and RBAC verbs of requests."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from decimal import ROUND_CEILING, Decimal
from typing import Any, NamedTuple

from kmock._internal import parsing, rendering


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _leaves(obj: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, obj


def _pop_path(obj: dict[str, Any], path: tuple[str, ...], expected: Any) -> None:
    """Remove a field our manager applied before, unless someone else has changed it since (then they own it)."""
    *parents, last = path
    for key in parents:
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
        if obj is None:
            return
    if isinstance(obj, dict) and obj.get(last) == expected:
        obj.pop(last)


def parse_path_with_namespaces(path: str) -> parsing.ParsedPath:
    """KMock parses /api/v1/namespaces[/NAME] as a namespace prefix (HTTP 500/404); parse it as the resource."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (3, 4):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _original_parse_path(path)


_original_parse_path = parsing.parse_path



def drop_unapplied(obj: dict[str, Any], *, previous: dict[str, Any], applied: dict[str, Any],
                   co_owned: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    """Server-side apply: fields this manager applied last time but not now are removed, unless another manager
    applies them too (co-ownership) or changed them since (then the field is theirs)."""
    now = {path for path, _ in _leaves(applied)}
    shared = {path for other in co_owned for path, _ in _leaves(other)}
    for path, value in _leaves(previous):
        if path and path not in now and path not in shared:
            _pop_path(obj, path, value)


def apply_list_map(live: list[dict[str, Any]] | None, *, applied: list[dict[str, Any]] | None,
                   previous: list[dict[str, Any]] | None, co_owned: list[list[dict[str, Any]]],
                   key: str = "uid") -> list[dict[str, Any]]:
    """Server-side apply of a list whose type is `map` (x-kubernetes-list-type: map, e.g. ownerReferences by uid):
    applied items merge into the live item with the same key; this manager's items from its last apply that it no
    longer applies go, unless another applier co-owns them; items other managers wrote (a restore, kubectl) stay."""
    mine_before = {item.get(key) for item in previous or []}
    shared = {item.get(key) for items in co_owned for item in items}
    pending = {item.get(key): item for item in applied or []}
    result = []
    for item in live or []:
        if item.get(key) in pending:
            result.append(merge_patch(item, pending.pop(item.get(key))))
        elif item.get(key) not in mine_before or item.get(key) in shared:
            result.append(item)
    return result + list(pending.values())


def owner_reference_error(obj: dict[str, Any]) -> str | None:
    """The API server's own check (apimachinery ValidateOwnerReferences): at most one controller reference."""
    controllers = [ref for ref in (obj.get("metadata") or {}).get("ownerReferences") or [] if ref.get("controller")]
    if len(controllers) < 2:
        return None
    names = " and ".join(f"{ref.get('kind')}/{ref.get('name')}" for ref in controllers[:2])
    return (f"{obj.get('kind') or 'object'} \"{obj['metadata'].get('name')}\" is invalid: metadata.ownerReferences:"
            f" Invalid value: Only one reference can have Controller set to true. Found \"true\" in references for"
            f" {names}")


def release_conflicts(other: dict[str, Any], applied: dict[str, Any]) -> None:
    """A forced apply takes conflicting fields (same path, different value) away from the other manager."""
    mine = dict(_leaves(applied))
    for path, value in list(_leaves(other)):
        if path and path in mine and mine[path] != value:
            _pop_path(other, path, value)


def fields_v1(applied: Any) -> dict[str, Any]:
    """The managedFields `fieldsV1` of an applied configuration (lists as leaves: an approximation)."""
    if not isinstance(applied, dict):
        return {}
    return {f"f:{key}": fields_v1(value) for key, value in applied.items()}


_REQUIREMENT = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<setop>in|notin)\s+\((?P<values>[^)]*)\))?)\s*(?:,|$)"
)


def matches_selector(selector: str, labels: dict[str, str]) -> bool:
    """True when every comma-separated requirement holds; an empty selector matches everything."""
    position, selector = 0, selector.strip()
    while position < len(selector):
        match = _REQUIREMENT.match(selector, position)
        if match is None or match.end() == position:
            raise ValueError(f"unparsable label selector {selector!r} at {position}")
        position = match.end()
        if match["absent"]:
            ok = match["absent"] not in labels
        elif match["op"]:
            equal = labels.get(match["key"]) == match["value"]
            ok = (not equal) if match["op"] == "!=" else equal
        elif match["setop"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            inside = match["key"] in labels and labels[match["key"]] in values
            ok = inside if match["setop"] == "in" else not inside
        else:
            ok = match["key"] in labels
        if not ok:
            return False
    return True


def matches_fields(selector: str, obj: dict[str, Any]) -> bool:
    """Field selectors (`involvedObject.uid=x,type!=Normal`): dotted paths into the object, `=`, `==`, `!=`."""
    for requirement in filter(None, (part.strip() for part in selector.split(","))):
        path, op, value = re.fullmatch(r"([\w.]+)\s*(==|!=|=)\s*(.*)", requirement).groups()  # type: ignore[union-attr]
        found: Any = obj
        for key in path.split("."):
            found = found.get(key) if isinstance(found, dict) else None
        if (str(found if found is not None else "") == value) is (op == "!="):
            return False
    return True


class ApiCall(NamedTuple):
    method: str  # HTTP method
    api_group: str  # "" for the core group
    resource: str
    subresource: str  # "" when none
    verb: str  # the RBAC verb: get, list, watch, create, patch, update, delete, deletecollection


def api_call(request: rendering.Request) -> ApiCall:
    res = request.resource
    assert res is not None and res.plural is not None
    method = request.method.value
    if method == "GET":
        verb = "watch" if request.params.get("watch") in ("true", "1") else "get" if request.name else "list"
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method) or (
            "delete" if request.name else "deletecollection")
    return ApiCall(method, res.group or "", res.plural, request.subresource or "", verb)


_QUANTITY_PARTS = re.compile(r"^\+?([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][-+]?[0-9]+)?$")
_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def canonical_quantity(text: str) -> str:
    """What the API server reads back for a (non-negative) quantity: quantity.go's CanonicalizeBytes. The suffix
    kind is kept (binary, decimal, exponent); binary turns decimal below 1Ki or when fractional; nothing finer
    than 1n (rounded up); the largest suffix that keeps the number an integer."""
    match = _QUANTITY_PARTS.match(text)
    if match is None:
        raise ValueError(text)
    suffix = match[2] or ""
    binary, exponent_form = suffix.endswith("i"), suffix[:1] in ("e", "E") and len(suffix) > 1
    if binary:
        value = Decimal(match[1]) * 1024 ** ("KMGTPE".index(suffix[0]) + 1)
    else:
        value = Decimal(match[1]).scaleb(int(suffix[1:]) if exponent_form else _SI[suffix])
    value = value.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
    if value == 0:
        return "0"
    if binary and value >= 1024 and value == value.to_integral_value():
        amount, power = int(value), 0
        while amount % 1024 == 0:
            amount, power = amount // 1024, power + 1
        return f"{amount}{['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][power]}"
    _sign, digits, exponent = value.normalize().as_tuple()
    mantissa, exponent = int("".join(map(str, digits))), int(exponent)
    mantissa, exponent = mantissa * 10 ** (exponent % 3), exponent - exponent % 3
    if exponent_form:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    si_suffix = next(name for name, power in _SI.items() if power == exponent)
    return f"{mantissa}{si_suffix}"


def canonical_resources(obj: dict[str, Any], _old: dict[str, Any] | None = None) -> dict[str, Any]:
    """Admission for Deployments, Pods and HPAs: quantities read back canonical, as from a real API server."""
    obj = copy.deepcopy(obj)
    spec = obj.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") if obj.get("kind") != "Pod" and "template" in spec else spec
    for container in [*(pod_spec or {}).get("initContainers", []), *(pod_spec or {}).get("containers", [])]:
        for group in (container.get("resources") or {}).values():
            for name, value in group.items():
                group[name] = canonical_quantity(str(value))
    for volume in (pod_spec or {}).get("volumes", []):
        if (volume.get("emptyDir") or {}).get("sizeLimit") is not None:
            volume["emptyDir"]["sizeLimit"] = canonical_quantity(str(volume["emptyDir"]["sizeLimit"]))
    for metric in spec.get("metrics", []):
        target = (metric.get("pods") or {}).get("target") or {}
        if "averageValue" in target:
            target["averageValue"] = canonical_quantity(str(target["averageValue"]))
    return obj
