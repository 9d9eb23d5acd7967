"""The recorded API calls (fixture `operator_api_calls`) cover what the operator needs, and nothing broader."""

from __future__ import annotations

from kmock_ext import ApiCall
from operator_scenario import rbac_rules
from render_cases import SETTINGS, model_from
from scorekeeper_operator.render.manifests import render


def test_the_scenario_records_every_kind_of_call(operator_api_calls: frozenset[ApiCall]) -> None:
    verbs = {(c.api_group, c.resource, c.subresource): set() for c in operator_api_calls}
    for call in operator_api_calls:
        verbs[call.api_group, call.resource, call.subresource].add(call.verb)
    assert verbs["scorekeeper.dev", "scoringmodels", ""] >= {"get", "list", "watch", "patch"}
    assert verbs["scorekeeper.dev", "scoringmodels", "status"] == {"patch"}
    # blockOwnerDeletion on the children: required where OwnerReferencesPermissionEnforcement is enabled (the
    # emulator records it for every write that sets such a reference; test_children_block_owner_deletion).
    assert verbs["scorekeeper.dev", "scoringmodels", "finalizers"] == {"update"}
    # Server-side apply of an absent object is authorized as `create`: the emulator records it as such.
    for group, plural in (("", "configmaps"), ("", "services"), ("apps", "deployments")):
        assert verbs[group, plural, ""] == {"get", "list", "watch", "patch", "create"}
    for group, plural in (("policy", "poddisruptionbudgets"), ("autoscaling", "horizontalpodautoscalers"),
                          ("monitoring.coreos.com", "servicemonitors"), ("networking.k8s.io", "networkpolicies"),
                          ("keda.sh", "scaledobjects")):
        assert verbs[group, plural, ""] == {"get", "list", "watch", "patch", "create", "delete"}
    assert verbs["", "pods", ""] >= {"list", "watch"}
    assert verbs["", "events", ""] == {"create", "list"}  # kopf's warnings; the Events of pods on their way
    assert verbs["apiextensions.k8s.io", "customresourcedefinitions", ""] == {"list", "watch"}


def test_children_block_owner_deletion() -> None:
    """Why the finalizers permission is needed: every child the operator renders blocks its owner's deletion until
    the garbage collector removed it (foreground deletion), which needs `update` on scoringmodels/finalizers."""
    rendered = render(model_from({"replicas": 3, "autoscaling": {"enabled": True}, "networkPolicy": {"enabled": True}}),
                      SETTINGS, service_monitor_api=True)
    assert len(rendered.manifests) == 7
    for manifest in rendered.manifests:
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["blockOwnerDeletion"] is True and owner["kind"] == "ScoringModel"


def test_nothing_broader_than_needed(operator_api_calls: frozenset[ApiCall]) -> None:
    touched = {c.resource for c in operator_api_calls}
    assert touched <= {"scoringmodels", "deployments", "services", "configmaps", "poddisruptionbudgets",
                       "horizontalpodautoscalers", "servicemonitors", "networkpolicies", "scaledobjects", "pods",
                       "events", "customresourcedefinitions"}
    # No PUT (only the implied finalizers permission), no bulk deletes.
    assert {(c.resource, c.subresource) for c in operator_api_calls if c.verb == "update"} == {
        ("scoringmodels", "finalizers")}
    assert not any(c.verb == "deletecollection" for c in operator_api_calls)
    assert not any(c.resource == "pods" and c.verb in ("create", "patch", "delete") for c in operator_api_calls)


def test_rbac_rules_are_one_rule_per_resource(operator_api_calls: frozenset[ApiCall]) -> None:
    rules = rbac_rules(operator_api_calls)
    status = next(r for r in rules if r["resources"] == ["scoringmodels/status"])
    assert status == {"apiGroups": ["scorekeeper.dev"], "resources": ["scoringmodels/status"], "verbs": ["patch"]}
    assert len(rules) == len({(r["apiGroups"][0], r["resources"][0]) for r in rules})
