"""Every rendered manifest is valid Kubernetes: `kubernetes-validate` in strict mode (unknown fields are errors) for
each Kubernetes minor version the chart supports, 1.29 to 1.34. The Prometheus Operator kinds have no bundled schema;
they are checked against the fields of monitoring.coreos.com/v1 this chart uses."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from chart_render import CHART, VALUES, Rendered, render

KUBERNETES_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "required": ["name", "namespace"],
             "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STRING_MAP,
                            "annotations": _STRING_MAP}}
_DURATION = {"type": "string", "pattern": "^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
                                          "(([0-9]+)ms)?$"}
# The subset of the Prometheus Operator's v1 CRD schemas (prometheus-operator pkg/apis/monitoring/v1) used here;
# additionalProperties is false only where this chart writes every field it may contain.
MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _METADATA,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                     "properties": {
                         "selector": {"type": "object", "required": ["matchLabels"],
                                      "properties": {"matchLabels": _STRING_MAP}},
                         "namespaceSelector": {"type": "object", "additionalProperties": False,
                                               "properties": {"any": {"type": "boolean"},
                                                              "matchNames": {"type": "array",
                                                                             "items": {"type": "string"}}}},
                         "endpoints": {"type": "array", "minItems": 1, "items": {
                             "type": "object", "additionalProperties": False, "required": ["port"],
                             "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                            "interval": _DURATION, "scrapeTimeout": _DURATION}}},
                     }},
        },
    },
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _METADATA,
            "spec": {"type": "object", "required": ["groups"], "additionalProperties": False, "properties": {
                "groups": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                        "limit": {"type": "integer"}, "partial_response_strategy": {"type": "string"},
                        "query_offset": _DURATION, "labels": _STRING_MAP,
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["expr"], "additionalProperties": False,
                            "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                            "properties": {
                                "record": {"type": "string"}, "alert": {"type": "string"},
                                "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                                "keep_firing_for": _DURATION, "labels": _STRING_MAP, "annotations": _STRING_MAP,
                            }}},
                    }}},
            }},
        },
    },
}


def validate(manifest: dict[str, Any], version: str) -> None:
    if manifest["kind"] in PROMETHEUS_OPERATOR_KINDS:
        jsonschema.validate(manifest, MONITORING_SCHEMAS[manifest["kind"]])
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


def _label(manifest: dict[str, Any]) -> str:
    return f"{manifest['kind']}/{manifest['metadata'].get('namespace', '')}/{manifest['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_kubernetes(rendered: Rendered, version: str) -> None:
    errors = []
    for manifest in rendered.manifests:
        try:
            validate(manifest, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            errors.append(f"{_label(manifest)}: {error.message} at {list(error.absolute_path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(f"{_label(manifest)}: {error.message}")  # a kind unknown to that Kubernetes version
    assert not errors, "\n".join(errors)


def test_every_kind_the_chart_can_render_was_validated() -> None:
    """The values sets together reach every template (an untested template would escape validation)."""
    kinds = {m["kind"] for name in VALUES for m in render(VALUES[name]).manifests}
    assert kinds == {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                     "Role", "RoleBinding", "Service", "ServiceMonitor", "ConfigMap", "PrometheusRule",
                     "NetworkPolicy"}
    templates = {f"{CHART.name}/templates/{path.name}" for path in (CHART / "templates").glob("*.yaml")}
    rendered_something = {t for name in VALUES for t, text in render(VALUES[name]).templates.items() if text.strip()}
    assert templates and templates <= rendered_something, templates - rendered_something


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["template"]["spec"]["containers"][0].update(livenessProbes={}),  # unknown field
    lambda d: d["spec"].update(replicas="1"),  # wrong type
    lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(readOnlyRootFileSystem=True),
], ids=["unknown-field", "wrong-type", "misspelled-security-field"])
def test_the_validator_is_strict(mutate: Any) -> None:
    """A negative control: the validation above would catch these mistakes."""
    broken = copy.deepcopy(render({}).deployment)
    mutate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_monitoring_schemas_are_strict() -> None:
    rule = copy.deepcopy(render(VALUES["full"]).one("PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["exprr"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule, KUBERNETES_VERSIONS[0])
    monitor = copy.deepcopy(render(VALUES["full"]).one("ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, KUBERNETES_VERSIONS[0])
