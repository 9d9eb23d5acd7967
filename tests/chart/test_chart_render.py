"""The chart renders, for every values set, into the operator install the issue asks for; wrong values fail."""

from __future__ import annotations

import ast
import json
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python
import pytest
import yaml
from chart_render import CHART, NAMESPACE, REPO, VALUES, Rendered, merged_values, render, render_raw
from scorekeeper_operator.render import manifests as operator_render
from scorekeeper_operator.spec import settings
from scorekeeper_operator.spec.settings import OperatorSettings

OPERATOR_SOURCES = sorted((REPO / "operator" / "scorekeeper_operator").rglob("*.py"))
CHART_META: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())


def env_vars_read_by_operator() -> set[str]:
    """SCOREKEEPER_* names the operator's code reads (`….get("SCOREKEEPER_X")` calls), found in its AST."""
    names: set[str] = set()
    for source in OPERATOR_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("SCOREKEEPER_")):
                names.add(str(node.args[0].value))
    return names


def expected_image(image: dict[str, str]) -> str:
    if image.get("digest"):
        return f"{image['repository']}@{image['digest']}"
    return f"{image['repository']}:{image.get('tag') or CHART_META['appVersion']}"


# -- the chart as a whole ------------------------------------------------------------------------------------------
def test_helm_lint_is_clean_for_every_values_set(values_name: str) -> None:
    report = helm_python.lint(CHART, VALUES[values_name], strict=True, namespace=NAMESPACE, kube_version="v1.29.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 = warning, 3 = error
    assert not report["errors"] and not problems, problems or report["errors"]


def test_chart_versions_follow_the_project() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert CHART_META["appVersion"] == project["version"]
    assert CHART_META["kubeVersion"] == ">=1.29.0-0"


def test_object_names_are_unique(rendered: Rendered) -> None:
    keys = Counter((m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in rendered.manifests)
    assert not [key for key, count in keys.items() if count > 1]


def test_namespaced_objects_land_in_the_release_namespace(rendered: Rendered) -> None:
    for kind in ("Deployment", "ServiceAccount", "Service", "ServiceMonitor", "PrometheusRule"):
        for manifest in rendered.of_kind(kind):
            assert manifest["metadata"]["namespace"] == NAMESPACE, kind


def test_optional_objects_follow_their_flags(values_name: str, rendered: Rendered) -> None:
    values = merged_values(VALUES[values_name])
    kinds = Counter(m["kind"] for m in rendered.manifests)
    assert kinds["Deployment"] == 1
    assert kinds["CustomResourceDefinition"] == (1 if values["crds"]["install"] else 0)
    assert kinds["ServiceAccount"] == (1 if values["serviceAccount"]["create"] else 0)
    assert kinds["ClusterRoleBinding"] == (1 if values["rbac"]["create"] else 0)
    aggregated = 2 if values["rbac"]["create"] and values["rbac"]["aggregateToDefaultRoles"] else 0
    assert kinds["ClusterRole"] == kinds["ClusterRoleBinding"] + aggregated
    assert kinds["NetworkPolicy"] == (1 if values["networkPolicy"]["enabled"] else 0)
    namespaces = values["operator"]["watchNamespaces"] if values["rbac"]["create"] else []
    assert sorted(r["metadata"]["namespace"] for r in rendered.of_kind("Role")) == sorted(namespaces)
    assert sorted(r["metadata"]["namespace"] for r in rendered.of_kind("RoleBinding")) == sorted(namespaces)
    assert kinds["ServiceMonitor"] == kinds["Service"] == (1 if values["serviceMonitor"]["enabled"] else 0)
    assert kinds["PrometheusRule"] == (1 if values["prometheusRule"]["enabled"] else 0)
    assert kinds["ConfigMap"] == (1 if values["grafanaDashboard"]["enabled"] else 0)


def test_every_value_set_changes_the_rendering() -> None:
    """The non-default values set really reaches the templates (a guard against values nobody reads)."""
    default, full = render(VALUES["default"]), render(VALUES["full"])
    assert default.deployment != full.deployment
    assert full.container["image"] == expected_image(VALUES["full"]["image"])
    pod = full.deployment["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert pod["spec"][key] == VALUES["full"][key], key
    assert pod["metadata"]["labels"]["team"] == "ml-platform"
    assert pod["metadata"]["annotations"] == VALUES["full"]["podAnnotations"]
    assert full.container["resources"] == VALUES["full"]["resources"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60
    assert full.env["HTTPS_PROXY"] == "http://proxy.example.com:3128"


# -- the operator Deployment ---------------------------------------------------------------------------------------
def test_operator_runs_exactly_one_replica_replaced_with_recreate(rendered: Rendered) -> None:
    spec = rendered.deployment["spec"]
    assert spec["replicas"] == 1  # kopf runs standalone (no peering): two operators would fight
    assert spec["strategy"] == {"type": "Recreate"}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()


def test_liveness_probe_checks_the_endpoint_kopf_serves(rendered: Rendered) -> None:
    """The probe's port and path are the ones the operator is told to serve /healthz on."""
    served = urlsplit(rendered.env["SCOREKEEPER_LIVENESS_ENDPOINT"])
    probe = rendered.container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in rendered.container["ports"]}
    assert probe["path"] == served.path == "/healthz"
    assert ports[probe["port"]] == served.port
    assert served.hostname == "0.0.0.0"  # reachable by the kubelet, not just loopback
    assert "readinessProbe" not in rendered.container  # kopf's docs: readiness makes no sense for an operator


def test_operator_pod_is_hardened(rendered: Rendered) -> None:
    pod = rendered.deployment["spec"]["template"]["spec"]
    container = rendered.container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"]["drop"] == ["ALL"]
    assert not container["capabilities"].get("add")
    assert not container.get("privileged")
    mounts = {m["mountPath"]: m["name"] for m in rendered.container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the only writable path


def test_rendered_env_is_what_the_operator_parses(values_name: str, rendered: Rendered) -> None:
    """The operator's own settings loader reads the rendered env back into the values that were asked for."""
    values = merged_values(VALUES[values_name])
    parsed = OperatorSettings.from_env(rendered.env)
    assert parsed.worker_image == expected_image(values["workerImage"])
    assert parsed.namespaces == tuple(values["operator"]["watchNamespaces"])
    assert parsed.allow_hf_download is values["operator"]["allowHfDownload"]
    assert parsed.retry_base_seconds == values["operator"]["retry"]["baseSeconds"]
    assert parsed.retry_max_seconds == values["operator"]["retry"]["maxSeconds"]
    assert parsed.hf_endpoint == values["operator"]["huggingFace"]["endpoint"]
    assert parsed.max_concurrent_upgrades == values["operator"]["maxConcurrentUpgrades"]
    assert parsed.metrics_port == values["operator"]["metricsPort"]
    assert urlsplit(parsed.liveness_endpoint).port == values["operator"]["healthPort"]
    assert rendered.env["SCOREKEEPER_LOG_LEVEL"] == values["operator"]["logLevel"]


def test_chart_sets_only_environment_variables_the_operator_reads(rendered: Rendered) -> None:
    read = env_vars_read_by_operator()
    assert "SCOREKEEPER_WORKER_IMAGE" in read  # the AST scan itself works
    ours = {name for name in rendered.env if name.startswith("SCOREKEEPER_")}
    assert ours <= read, f"set by the chart but never read by the operator: {sorted(ours - read)}"


def test_default_images_agree_with_the_operator_defaults() -> None:
    rendered = render({})
    assert rendered.env["SCOREKEEPER_WORKER_IMAGE"] == settings.DEFAULT_WORKER_IMAGE
    assert rendered.container["image"] == settings.DEFAULT_WORKER_IMAGE.replace("-worker:", "-operator:")
    assert rendered.env["SCOREKEEPER_LIVENESS_ENDPOINT"] == settings.DEFAULT_LIVENESS_ENDPOINT


def test_operator_pod_is_not_mistaken_for_a_worker_child(rendered: Rendered) -> None:
    """The operator watches objects labelled like its children (a server-side selector); its own pod must not match."""
    labels = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    key, _, value = operator_render.MANAGED_SELECTOR.partition("=")
    assert labels.get(key) != value


def test_service_account_is_the_one_bound_and_used(values_name: str, rendered: Rendered) -> None:
    name = rendered.deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for account in rendered.of_kind("ServiceAccount"):
        assert account["metadata"]["name"] == name
    for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
        role_kind = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
        roles = {(r["metadata"]["name"], r["metadata"].get("namespace")) for r in rendered.of_kind(role_kind)}
        assert (binding["roleRef"]["name"], binding["metadata"].get("namespace")) in roles
    if values_name == "external":
        assert name == "preexisting"


def test_service_monitor_scrapes_the_port_the_operator_serves_metrics_on() -> None:
    """The operator is told (SCOREKEEPER_METRICS_PORT) to serve /metrics on the container port the Service targets and
    the ServiceMonitor scrapes; tests/operator/units/test_operator_main.py scrapes a real operator on that variable."""
    rendered = render(VALUES["full"])
    served = OperatorSettings.from_env(rendered.env).metrics_port
    service, monitor = rendered.one("Service"), rendered.one("ServiceMonitor")
    pod_labels = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in rendered.container["ports"]}
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert container_ports[port["targetPort"]] == served == 9191
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_operator_serves_metrics_by_default_and_can_be_told_not_to() -> None:
    default = render({})
    assert OperatorSettings.from_env(default.env).metrics_port == 9090
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in default.container["ports"]
    off = render({"operator": {"metricsPort": 0}})
    assert OperatorSettings.from_env(off.env).metrics_port == 0
    assert "metrics" not in {p["name"] for p in off.container["ports"]}
    with pytest.raises(helm_python.HelmError, match=r"serviceMonitor\.enabled needs operator\.metricsPort"):
        render_raw({"operator": {"metricsPort": 0}, "serviceMonitor": {"enabled": True}})


def test_the_hub_token_reaches_the_operator_only_from_its_secret() -> None:
    rendered = render(VALUES["full"])
    (token,) = [e for e in rendered.container["env"] if e["name"] == "SCOREKEEPER_HF_TOKEN"]
    assert token == {"name": "SCOREKEEPER_HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "hf"}}}
    assert "SCOREKEEPER_HF_TOKEN" not in render({}).env


def test_people_get_scoringmodels_through_the_default_roles_and_nothing_else() -> None:
    rendered = render({})
    aggregated = {r["metadata"]["name"].rsplit("-", 1)[1]: r for r in rendered.of_kind("ClusterRole")
                  if any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in r["metadata"]["labels"])}
    assert set(aggregated) == {"view", "edit"}
    labels = {name: {k.rsplit("-", 1)[1] for k, v in role["metadata"]["labels"].items()
                     if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"}
              for name, role in aggregated.items()}
    assert labels == {"view": {"view"}, "edit": {"edit", "admin"}}
    rules = {name: {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
                    for resource in rule["resources"] for verb in rule["verbs"]} for name, role in aggregated.items()}
    assert {group for grants in rules.values() for group, _, _ in grants} == {"scorekeeper.dev"}
    assert {verb for _, _, verb in rules["view"]} == {"get", "list", "watch"}
    assert {("scorekeeper.dev", "scoringmodels", verb) for verb in ("create", "patch", "delete")} <= rules["edit"]
    assert ("scorekeeper.dev", "scoringmodels/scale", "update") in rules["edit"]  # kubectl scale sm
    bound = {b["roleRef"]["name"] for b in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding")}
    assert not bound & {r["metadata"]["name"] for r in aggregated.values()}  # only through aggregation
    assert len(render({"rbac": {"aggregateToDefaultRoles": False}}).of_kind("ClusterRole")) == 1


def test_operator_network_policy_admits_only_prometheus_to_the_metrics_port() -> None:
    rendered = render(VALUES["full"])
    policy = rendered.one("NetworkPolicy")
    pod_labels = rendered.deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert "metrics" in {p["name"] for p in rendered.container["ports"]}


def test_grafana_dashboard_configmap_is_picked_up_by_the_sidecar() -> None:
    configmap = render(VALUES["full"]).one("ConfigMap")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert set(configmap["data"]) == {p.name for p in (CHART / "files" / "grafana").glob("*.json")}


# -- values.schema.json: wrong values fail at install --------------------------------------------------------------
@pytest.mark.parametrize("values", [
    {"imageTag": "0.2.0"},  # misspelled top-level key
    {"image": {"tag": 0.2}},  # number instead of string
    {"image": {"pullPolicy": "Sometimes"}},
    {"image": {"digest": "latest"}},
    {"workerImage": {"repository": ""}},
    {"operator": {"logLevel": "trace"}},
    {"operator": {"watchNamespaces": "ml"}},
    {"operator": {"watchNamespaces": ["ML_Team"]}},
    {"operator": {"watchNamespaces": ["ml", "ml"]}},
    {"operator": {"healthPort": "8080"}},
    {"operator": {"healthPort": 80}},
    {"operator": {"retry": {"baseSeconds": 0}}},
    {"operator": {"allowHfDownload": "false"}},
    {"operator": {"extraEnv": [{"name": "SCOREKEEPER_WORKER_IMAGE", "value": "x"}]}},
    {"operator": {"workerImage": "x"}},  # unknown nested key
    {"crds": {"install": "yes"}},
    {"serviceAccount": {"create": False}},  # an existing account must be named
    {"rbac": {"create": None, "cluster": True}},
    {"serviceMonitor": {"enabled": True, "interval": "30"}},
    {"serviceMonitor": {"port": 9191}},  # moved to operator.metricsPort
    {"operator": {"metricsPort": 80}},
    {"operator": {"maxConcurrentUpgrades": 0}},
    {"operator": {"huggingFace": {"endpoint": "huggingface.co"}}},
    {"operator": {"huggingFace": {"tokenSecret": {"name": "Hub_Token"}}}},
    {"rbac": {"aggregateToDefaultRoles": "yes"}},
    {"networkPolicy": {"enabled": True, "monitoringNamespace": "Monitoring"}},
    {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}},
    {"resources": {"limits": {"memory": ["1Gi"]}}},
    {"livenessProbe": {"periodSeconds": 0}},
], ids=lambda v: yaml.safe_dump(v, default_flow_style=True).strip())
def test_schema_rejects_wrong_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render_raw(values)


# -- values.yaml is documented field by field ----------------------------------------------------------------------
def schema_fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every chart-defined field (free-form maps such as labels or securityContext are one field)."""
    paths: list[str] = []
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.append(path)
        if sub.get("additionalProperties") is False:
            paths += schema_fields(sub, f"{path}.")
    return paths


def commented_keys(values_file: Path) -> dict[str, bool]:
    """Dotted key path → whether a comment line directly precedes it (block-style YAML, 2-space indents)."""
    found: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in values_file.read_text().splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "-")) and ":" in stripped:
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            key = stripped.split(":", 1)[0].strip('"')
            path = ".".join([k for _, k in stack] + [key])
            found[path] = previous.startswith("#")
            stack.append((indent, key))
        if stripped:
            previous = stripped
    return found


def test_every_value_is_documented_in_values_yaml() -> None:
    schema = render_schema()
    comments = commented_keys(CHART / "values.yaml")
    fields = [f for f in schema_fields(schema) if f != "global"]
    missing = [f for f in fields if f not in comments]
    undocumented = [f for f in fields if f in comments and not comments[f]]
    assert not missing, f"in values.schema.json but not in values.yaml: {missing}"
    assert not undocumented, f"values.yaml keys without a comment above them: {undocumented}"


def test_every_value_is_in_the_schema_and_described() -> None:
    schema, defaults = render_schema(), yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sub: dict[str, Any], path: str) -> None:
        for key, value in node.items():
            assert key in sub.get("properties", {}), f"{path}{key} is not in values.schema.json"
            prop = sub["properties"][key]
            assert prop.get("description"), f"{path}{key} has no description in values.schema.json"
            if isinstance(value, dict) and prop.get("additionalProperties") is False:
                walk(value, prop, f"{path}{key}.")

    walk(defaults, schema, "")


def test_every_value_is_in_the_deploy_docs() -> None:
    docs = (REPO / "docs" / "deploy.md").read_text()
    fields = [f for f in schema_fields(render_schema()) if f != "global"]
    leaves = [f for f in fields if not any(other.startswith(f"{f}.") for other in fields)]
    missing = [f for f in leaves if f"`{f}`" not in docs]
    assert not missing, f"docs/deploy.md does not document: {missing}"


def render_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema
