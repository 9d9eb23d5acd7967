"""Small pure pieces: drift detection, API paths and error classes, and the emulator's own API semantics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kmock_semantics import apply_list_map, drop_unapplied, matches_fields, matches_selector, merge_patch
from scorekeeper_operator.cache import WatchCache
from scorekeeper_operator.k8s import (
    CHILD_KINDS,
    SCORING_MODELS,
    ForbiddenError,
    RejectedError,
    TransientApiError,
    _error,
)
from scorekeeper_operator.render.drift import contains, left_out, owned_by

DESIRED: dict[str, Any] = {"metadata": {"name": "m", "labels": {"a": "1"}},
                           "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}}


def test_defaults_and_foreign_fields_are_not_drift() -> None:
    live = json.loads(json.dumps(DESIRED))
    live["metadata"].update(uid="u", resourceVersion="9", labels={"a": "1", "added-by": "someone"})
    live["spec"]["template"]["metadata"] = {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    live["status"] = {"replicas": 2}
    assert contains(live, DESIRED)


@pytest.mark.parametrize("change", [
    {"spec": {"replicas": 3}},
    {"metadata": {"labels": {"a": "2"}}},
    {"spec": {"template": {"spec": {"containers": [{"name": "w", "image": "other"}]}}}},
    {"spec": {"template": {"spec": {"containers": [{"name": "w", "image": "i"}, {"name": "sidecar"}]}}}},
])
def test_changed_or_extra_list_items_are_drift(change: dict[str, Any]) -> None:
    assert not contains(merge_patch(DESIRED, change), DESIRED)


def test_missing_fields_are_drift_and_ownership_is_by_uid() -> None:
    assert not contains({"metadata": DESIRED["metadata"]}, DESIRED)
    assert owned_by({"metadata": {"ownerReferences": [{"uid": "x"}, {"uid": "u"}]}}, "u")
    assert not owned_by({"metadata": {}}, "u")


def test_api_paths() -> None:
    expected = "/apis/scorekeeper.dev/v1alpha1/namespaces/ml/scoringmodels/m/status"
    assert SCORING_MODELS.path("ml", "m", "status") == expected
    assert CHILD_KINDS["Service"].path("ml") == "/api/v1/namespaces/ml/services"
    assert CHILD_KINDS["ServiceMonitor"].group_version_path == "/apis/monitoring.coreos.com/v1"


@pytest.mark.parametrize(("status", "kind"), [(400, RejectedError), (404, RejectedError), (422, RejectedError),
                                              (403, ForbiddenError), (409, TransientApiError),
                                              (429, TransientApiError), (500, TransientApiError),
                                              (503, TransientApiError)])
def test_api_errors_are_classified(status: int, kind: type[Exception]) -> None:
    error = _error(status, json.dumps({"reason": "Why", "message": "what happened"}).encode())
    assert type(error) is kind and error.message == "what happened" and error.reason == "Why"
    assert type(_error(status, b"<html>proxy error</html>")) is kind
    assert isinstance(error, TransientApiError) == (status not in (400, 404, 422))  # a 403 is retried too


def test_merge_patch_is_rfc7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None, "d": 3}, "l": [3]}) == {
        "a": {"c": 2, "d": 3}, "l": [3]}


def test_apply_drops_only_fields_the_manager_still_owns() -> None:
    obj = {"spec": {"replicas": 2, "paused": False, "template": {}}}
    drop_unapplied(obj, previous={"spec": {"replicas": 2, "paused": False}}, applied={"spec": {"paused": False}})
    assert obj == {"spec": {"paused": False, "template": {}}}
    scaled = {"spec": {"replicas": 5}}  # the HPA changed it since: it is the HPA's now
    drop_unapplied(scaled, previous={"spec": {"replicas": 2}}, applied={"spec": {}})
    assert scaled == {"spec": {"replicas": 5}}


def test_apply_merges_a_map_list_by_key() -> None:
    """ownerReferences under server-side apply: items merge by uid; the manager's own items it stops applying go,
    unless another applier co-owns them; other managers' items stay."""
    live = [{"uid": "restored", "controller": True}, {"uid": "mine-before"}, {"uid": "shared"}, {"uid": "kept"}]
    merged = apply_list_map(live, applied=[{"uid": "kept", "controller": True}, {"uid": "new"}],
                            previous=[{"uid": "mine-before"}, {"uid": "shared"}, {"uid": "kept"}],
                            co_owned=[[{"uid": "shared"}]])
    assert merged == [{"uid": "restored", "controller": True}, {"uid": "shared"}, {"uid": "kept", "controller": True},
                      {"uid": "new"}]


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True), ("app=x", True), ("app==x,tier=web", True), ("app!=x", False), ("app", True), ("!app", False),
    ("!missing", True), ("app in (y, x)", True), ("app notin (x)", False), ("tier=db", False),
    ("app.kubernetes.io/name=w", True),
])
def test_label_selectors(selector: str, expected: bool) -> None:
    assert matches_selector(selector, {"app": "x", "tier": "web", "app.kubernetes.io/name": "w"}) is expected


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True), ("involvedObject.uid=u1", True), ("involvedObject.uid==u2", False), ("type!=Normal", True),
    ("involvedObject.kind=Pod,type=Warning", True), ("involvedObject.kind=Pod,type=Normal", False),
    ("reason=", False), ("missing.path=", True),
])
def test_field_selectors(selector: str, expected: bool) -> None:
    event = {"type": "Warning", "reason": "FailedMount", "involvedObject": {"kind": "Pod", "uid": "u1"}}
    assert matches_fields(selector, event) is expected


def _managed(manager: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": "Apply", "apiVersion": "v1", "fieldsV1": fields}


def test_a_field_we_applied_and_no_longer_render_is_drift() -> None:
    """Containment would miss it: the live object still contains all we render, plus what we stopped rendering."""
    live = {"metadata": {"labels": {"a": "1", "team": "x"}, "managedFields": [
        _managed("scorekeeper-operator", {"f:metadata": {"f:labels": {".": {}, "f:a": {}, "f:team": {}}},
                                          "f:spec": {"f:containers": {'k:{"name":"w"}': {"f:image": {}}}}}),
        _managed("kubectl", {"f:metadata": {"f:labels": {"f:other": {}}}})]}}
    desired = {"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "w", "image": "i"}]}}
    assert contains(live, {"metadata": {"labels": {"a": "1"}}}) and left_out(live, desired, "scorekeeper-operator")
    assert not left_out(live, {**desired, "metadata": {"labels": {"a": "1", "team": "x"}}}, "scorekeeper-operator")
    assert not left_out(live, desired, "kubectl-client-side-apply")  # another manager's fields are theirs


def _object(name: str, version: int, instance: str = "m", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": str(version),
                         "labels": {"app.kubernetes.io/instance": instance}}, **extra}


def test_the_watch_cache_keeps_the_newest_version_and_no_ghosts() -> None:
    cache = WatchCache()
    cache.put("pods", _object("a", 5, phase="new"))
    cache.put("pods", _object("a", 4, phase="stale"))  # a late event from before our own write
    assert cache.get("pods", "ml", "a")["phase"] == "new"  # type: ignore[index]
    cache.delete("pods", _object("a", 6))
    cache.put("pods", _object("a", 5, phase="revived?"))  # an old event after the deletion
    assert cache.get("pods", "ml", "a") is None
    cache.put("pods", _object("b", 7))
    cache.put("pods", _object("c", 8, instance="other"))
    assert [p["metadata"]["name"] for p in cache.of_instance("pods", "ml", "m")] == ["b"]
    cache.replace_instance("pods", "ml", "m", [_object("d", 9)])  # a fresh LIST: b is gone
    assert [p["metadata"]["name"] for p in cache.of_instance("pods", "ml", "m")] == ["d"]
    cache.put("pods", _object("d", 10, instance="moved"))  # relabelled: no longer this model's
    assert cache.of_instance("pods", "ml", "m") == []
    cache.forget_instance("ml", "other")
    assert cache.all("pods") == [cache.get("pods", "ml", "d")]


def test_an_event_at_the_deleted_version_does_not_bring_the_object_back() -> None:
    """A DELETED event carries the object's last state: the emulator keeps its resourceVersion (the API server gives
    the deletion a newer one). An event or a write answer of that same version, handled after the deletion, is the
    object before it was deleted. Revived, it kept a deleted Deployment from being re-created until the next resync
    (test_a_deleted_child_comes_back[deployments]: 10 of 150 runs under `stress --cpu 2`)."""
    cache = WatchCache()
    cache.put("deployments", _object("d", 7))
    cache.delete("deployments", _object("d", 7))
    cache.put("deployments", _object("d", 7))
    assert cache.get("deployments", "ml", "d") is None
    cache.replace_instance("deployments", "ml", "m", [_object("d", 7)])
    assert cache.get("deployments", "ml", "d") is None
    cache.put("deployments", _object("d", 11))  # re-created
    assert cache.get("deployments", "ml", "d")["metadata"]["resourceVersion"] == "11"  # type: ignore[index]


def test_a_list_answered_after_a_newer_watch_event_does_not_bring_back_the_older_object() -> None:
    """A pass LISTs a model's pods while the pod's status is patched: the watch event (version 8, Pending) lands in
    the cache before the LIST's answer (version 7, no status). Replaced blindly, the cache held the stale pod until
    the next resync and no pass looked at the pending pod's Events (seen in CI under load)."""
    cache = WatchCache()
    cache.put("pods", _object("p", 8, status={"phase": "Pending"}))
    cache.replace_instance("pods", "ml", "m", [_object("p", 7)])
    assert cache.get("pods", "ml", "p")["status"] == {"phase": "Pending"}  # type: ignore[index]
    cache.replace_instance("pods", "ml", "m", [_object("p", 9, status={"phase": "Running"})])
    assert cache.get("pods", "ml", "p")["status"] == {"phase": "Running"}  # type: ignore[index]
