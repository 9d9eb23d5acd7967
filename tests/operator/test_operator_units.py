"""Small pure pieces: drift detection, API paths and error classes, and the emulator's own API semantics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kmock_semantics import drop_unapplied, matches_fields, matches_selector, merge_patch
from scorekeeper_operator.k8s import CHILD_KINDS, SCORING_MODELS, RejectedError, TransientApiError, _error
from scorekeeper_operator.render.drift import contains, owned_by

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
                                              (403, TransientApiError), (409, TransientApiError),
                                              (429, TransientApiError), (500, TransientApiError),
                                              (503, TransientApiError)])
def test_api_errors_are_classified(status: int, kind: type[Exception]) -> None:
    error = _error(status, json.dumps({"reason": "Why", "message": "what happened"}).encode())
    assert type(error) is kind and error.message == "what happened" and error.reason == "Why"
    assert type(_error(status, b"<html>proxy error</html>")) is kind


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
