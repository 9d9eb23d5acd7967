"""The chart's RBAC is exactly what the operator uses: every API call the real operator makes is allowed, and nothing
is granted that no call needs (beyond the documented extras below).

The calls are not listed by hand. They come from running the real operator (kopf + our handlers) against the KMock
emulator through a scenario that walks every code path that touches the API
(tests/operator/support/operator_scenario.py):
 - cluster-wide (the chart's default): `record_operator_api_calls()`, the operator tests' own recorder;
 - namespaced (`operator.watchNamespaces`): the same scenario with the operator restricted to one namespace, read
   from the emulator's raw request log, which also tells which namespace each call was made in (Role or
   ClusterRole?) and its Content-Type (a server-side apply that creates an object is also authorized as `create`).
Discovery requests (/api, /apis/...) are not resources: every authenticated user may make them (system:discovery).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, NamedTuple

import pytest
from chart_render import Rendered, render
from harness import running_cluster, running_operator
from kmock_ext import HARNESS_HEADER, ApiCall
from operator_scenario import NAMESPACE, exercise, record_operator_api_calls

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# Granted although the scenario may not show the call, each with the reason. Keep this list short and justified.
DOCUMENTED_EXTRAS: dict[Grant, str] = {
    ("", "events", "create"): "kopf posts a Warning Event when a handler fails (settings.posting.level=WARNING); "
                              "the scenario provokes one, but a run where it does not must not fail on it",
}
# Not a request of its own: the admission plugin OwnerReferencesPermissionEnforcement (OpenShift, hardened clusters)
# checks `update` on the owner's finalizers for every write that sets an ownerReference with blockOwnerDeletion.
FINALIZERS = ("scorekeeper.dev", "scoringmodels/finalizers")


class Call(NamedTuple):
    """One API request as the authorizer sees it."""

    api_group: str
    resource: str  # "pods" or "scoringmodels/status"
    verbs: frozenset[str]  # every verb the API server checks for it
    namespace: str | None  # None: cluster-scoped or across all namespaces


SERVER_SIDE_APPLY = "application/apply-patch+yaml"


def verbs_for(method: str, *, named: bool, watch: bool, content_type: str = "") -> frozenset[str]:
    """HTTP method → RBAC verb(s). An apply PATCH creates the object when absent, and the API server then also
    authorizes it as `create` (k8s.io/apiserver patch handler), so server-side apply needs both."""
    if method == "GET":
        return frozenset({"watch" if watch else "get" if named else "list"})
    if method == "PATCH":
        return frozenset({"patch", "create"} if content_type.startswith(SERVER_SIDE_APPLY) else {"patch"})
    verb = {"POST": "create", "PUT": "update", "DELETE": "delete" if named else "deletecollection"}[method]
    return frozenset({verb})


def resource_name(resource: str, subresource: str) -> str:
    return f"{resource}/{subresource}" if subresource else resource


def grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    found: set[Grant] = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    found.add((group, resource, verb))
    return found


def needed(calls: Iterable[Call]) -> set[Grant]:
    return {(c.api_group, c.resource, verb) for c in calls for verb in c.verbs}


# -- cluster-wide (the default install), from the operator tests' recorder -----------------------------------------
@pytest.fixture(scope="module")
def cluster_wide_calls() -> list[Call]:
    recorded: frozenset[ApiCall] = record_operator_api_calls()
    return [Call(c.api_group, resource_name(c.resource, c.subresource), frozenset({c.verb}), None) for c in recorded]


def server_side_applied() -> set[tuple[str, str]]:
    """(apiGroup, plural) the operator writes with server-side apply: k8s.KubeApi.apply's CHILD_KINDS.
    The recorder's ApiCall does not carry the Content-Type; this reads it from the operator's code instead (and the
    namespaced test below checks the same thing on the wire)."""
    import inspect

    from scorekeeper_operator import k8s

    assert SERVER_SIDE_APPLY in inspect.getsource(k8s.KubeApi.apply)
    return {(ref.api_version.rpartition("/")[0], ref.plural) for ref in k8s.CHILD_KINDS.values()}


def with_apply_creates(calls: list[Call]) -> list[Call]:
    applied = server_side_applied()
    return [c._replace(verbs=c.verbs | {"create"}) if "patch" in c.verbs and (c.api_group, c.resource) in applied
            else c for c in calls]


def test_scenario_exercised_the_operator(cluster_wide_calls: list[Call]) -> None:
    """A guard against a silently broken recorder: the scenario reached writes, deletes and the status."""
    seen = needed(cluster_wide_calls)
    for grant in [("scorekeeper.dev", "scoringmodels", "watch"), ("scorekeeper.dev", "scoringmodels/status", "patch"),
                  ("apps", "deployments", "patch"), ("policy", "poddisruptionbudgets", "delete"),
                  ("", "pods", "list")]:
        assert grant in seen, grant


def test_cluster_role_allows_every_call_the_operator_makes(cluster_wide_calls: list[Call]) -> None:
    granted = grants(render({}).operator_cluster_role["rules"])
    missing = sorted(needed(with_apply_creates(cluster_wide_calls)) - granted)
    assert not missing, f"the operator makes calls the ClusterRole does not allow: {missing}"


def test_cluster_role_grants_nothing_the_operator_does_not_use(cluster_wide_calls: list[Call]) -> None:
    granted = grants(render({}).operator_cluster_role["rules"])
    unused = sorted(granted - needed(with_apply_creates(cluster_wide_calls)) - set(DOCUMENTED_EXTRAS))
    assert not unused, f"granted but never used by the operator (remove, or document in DOCUMENTED_EXTRAS): {unused}"


def test_documented_extras_are_granted() -> None:
    assert set(DOCUMENTED_EXTRAS) <= grants(render({}).operator_cluster_role["rules"])


def test_namespaces_are_not_granted_cluster_wide(cluster_wide_calls: list[Call]) -> None:
    """kopf lists namespaces only in namespaced mode; cluster-wide it needs no namespace access at all."""
    assert not any(c.resource == "namespaces" for c in cluster_wide_calls)
    assert not any(g[1] == "namespaces" for g in grants(render({}).operator_cluster_role["rules"]))


# -- namespaced (operator.watchNamespaces), from the raw request log -----------------------------------------------
async def _record_namespaced() -> list[Call]:
    async with running_cluster(service_monitor_api=True) as cluster:
        # kopf in namespaced mode serves only namespaces that exist (409: the harness made it already).
        response = await cluster.emulator.request(
            "POST", "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": NAMESPACE}}, headers={HARNESS_HEADER: "1"})
        assert response.status < 300 or response.status == 409, response.status
        async with running_operator(cluster, namespaces=(NAMESPACE,)):
            await exercise(cluster)
        calls = []
        for request in list(cluster.emulator):
            if (request.headers.get(HARNESS_HEADER) is not None or request.resource is None
                    or request.resource.plural is None):
                continue  # the test's own requests; discovery (/api, /apis/GROUP/VERSION)
            verbs = verbs_for(request.method.value, named=request.name is not None,
                              watch=request.params.get("watch") in ("true", "1"),
                              content_type=request.headers.get("Content-Type", ""))
            calls.append(Call(request.resource.group or "", resource_name(request.resource.plural,
                                                                          request.subresource or ""),
                              verbs, request.namespace))
            if blocks_owner_deletion(request.data):
                calls.append(Call(*FINALIZERS, frozenset({"update"}), request.namespace))
        return calls


def blocks_owner_deletion(body: Any) -> bool:
    refs = ((body or {}).get("metadata") or {}).get("ownerReferences") or [] if isinstance(body, dict) else []
    return any(ref.get("blockOwnerDeletion") for ref in refs)


def test_the_finalizers_permission_follows_from_what_the_operator_writes(namespaced_calls: list[Call],
                                                                         namespaced_install: Rendered) -> None:
    """Derived from the bodies the operator sent, not granted on faith: its children carry blockOwnerDeletion, so
    the Role must allow `update` on scoringmodels/finalizers (without it, creates fail where the plugin is on)."""
    assert any(c.resource == FINALIZERS[1] and c.namespace == NAMESPACE for c in namespaced_calls)
    (role,) = [r for r in namespaced_install.of_kind("Role") if r["metadata"]["namespace"] == NAMESPACE]
    assert (*FINALIZERS, "update") in grants(role["rules"])


@pytest.fixture(scope="module")
def namespaced_calls() -> list[Call]:
    return asyncio.run(_record_namespaced())


@pytest.fixture(scope="module")
def namespaced_install() -> Rendered:
    return render({"operator": {"watchNamespaces": [NAMESPACE]}})


def test_namespaced_operator_stays_in_its_namespace(namespaced_calls: list[Call]) -> None:
    cluster_level = {(c.api_group, c.resource) for c in namespaced_calls if c.namespace is None}
    assert cluster_level == {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
    assert {c.namespace for c in namespaced_calls} == {None, NAMESPACE}


def test_server_side_apply_is_what_the_code_says(namespaced_calls: list[Call]) -> None:
    on_the_wire = {(c.api_group, c.resource) for c in namespaced_calls if {"patch", "create"} <= c.verbs}
    assert on_the_wire == server_side_applied()


def test_namespaced_rbac_allows_every_call(namespaced_calls: list[Call], namespaced_install: Rendered) -> None:
    cluster_grants = grants(namespaced_install.operator_cluster_role["rules"])
    (role,) = [r for r in namespaced_install.of_kind("Role") if r["metadata"]["namespace"] == NAMESPACE]
    role_grants = grants(role["rules"])
    for call in namespaced_calls:
        usable = cluster_grants if call.namespace is None else cluster_grants | role_grants
        missing = {(call.api_group, call.resource, verb) for verb in call.verbs} - usable
        assert not missing, f"{call}: not allowed ({sorted(missing)})"


def test_namespaced_rbac_grants_nothing_unused(namespaced_calls: list[Call], namespaced_install: Rendered) -> None:
    cluster_needed = needed(c for c in namespaced_calls if c.namespace is None)
    namespace_needed = needed(c for c in namespaced_calls if c.namespace == NAMESPACE)
    cluster_grants = grants(namespaced_install.operator_cluster_role["rules"])
    assert cluster_grants == cluster_needed, "the ClusterRole must hold only kopf's cluster-scoped reads"
    for role in namespaced_install.of_kind("Role"):
        unused = grants(role["rules"]) - namespace_needed - set(DOCUMENTED_EXTRAS)
        assert not unused, f"Role in {role['metadata']['namespace']} grants unused {sorted(unused)}"
