"""Pure API-server semantics the emulator adds to KMock: JSON merge patch, server-side apply's removal of fields
a manager stopped applying, label selectors, the parsing of /api/v1/namespaces paths, and RBAC verbs of requests."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
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
