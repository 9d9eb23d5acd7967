"""What the API server does with a ScoringModel before storing it, done offline: structural defaulting, OpenAPI
schema validation (`jsonschema`) and the CRD's `x-kubernetes-validations` CEL rules (`cel-python`).

Not covered (needs a real API server): CEL cost budgets, Kubernetes-specific CEL libraries, pruning of unknown
fields, `x-kubernetes-*` list semantics, `format` checks.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "scoringmodel.yaml"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
# Sample annotations: test.scorekeeper.dev/expect-<layer> says which layer (schema, cel) refuses an invalid sample.
EXPECT = "test.scorekeeper.dev/expect-"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def example_documents() -> list[dict[str, Any]]:
    """Every document of examples/*.yaml (ScoringModels and their Namespaces, PVCs, ...)."""
    return [doc for path in sorted((ROOT / "examples").glob("*.yaml")) for doc in documents(path)]


def valid_samples() -> list[dict[str, Any]]:
    """tests/operator/samples/valid.yaml plus the ScoringModels of examples/*.yaml."""
    return [*documents(SAMPLES / "valid.yaml"), *(doc for doc in example_documents() if doc["kind"] == "ScoringModel")]


def invalid_samples() -> list[dict[str, Any]]:
    return documents(SAMPLES / "invalid.yaml")


@functools.cache
def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return crd


def version_schema() -> dict[str, Any]:
    (version,) = load_crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties from `default`, then recurse (so `default: {}` cascades)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def _as_json_schema(schema: Any) -> Any:
    """The schema as the API server applies it, in draft 7: `x-kubernetes-int-or-string` admits an integer or a string,
    nothing else (jsonschema would ignore the extension and admit anything, `cpu: 1.5` included, which the API
    refuses); OpenAPI 3.0's boolean `exclusiveMinimum` becomes draft 7's number."""
    if isinstance(schema, list):
        return [_as_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _as_json_schema(value) for key, value in schema.items()}
    if schema.get("x-kubernetes-int-or-string") and "type" not in schema:
        converted["type"] = ["integer", "string"]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(schema.get(bound), bool):  # OpenAPI 3.0's flag on the limit; draft 7 wants the number
            converted.pop(bound)
            if schema[bound]:
                converted[bound] = converted.pop(limit)
    return converted


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_as_json_schema(version_schema()))


def schema_errors(obj: dict[str, Any]) -> list[str]:
    validator = _validator()
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]


_ABSENT = object()


def _rule_sites(schema: dict[str, Any], value: Any, path: str,
                old: Any = _ABSENT) -> Iterator[tuple[str, dict[str, Any], Any, Any]]:
    """(path, rule, value, old value or _ABSENT) for every rule that applies; old values follow object fields only
    (list items are correlated by the API only for map-type lists, which this schema does not use)."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule, value, old
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                before = old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT
                yield from _rule_sites(sub, value[key], f"{path}.{key}" if path else key, before)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _rule_sites(schema["items"], item, f"{path}[{index}]")


@functools.cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Every failing (or erroring: the API treats both as invalid) rule as 'path: message'. Transition rules (those
    that read `oldSelf`) run only on an update where the old object has that field, as in the API server."""
    errors = []
    for path, rule, value, before in _rule_sites(version_schema(), obj, "", _ABSENT if old is None else old):
        activation = {"self": celpy.json_to_cel(value)}
        if "oldSelf" in rule["rule"]:
            if before is _ABSENT:
                continue
            activation["oldSelf"] = celpy.json_to_cel(before)
        try:
            result = _program(rule["rule"]).evaluate(activation)
            ok = result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result))
        except Exception as error:  # a CEL evaluation error rejects the object, as in the API server
            ok, rule = False, {**rule, "message": f"{rule.get('message', rule['rule'])} ({error})"}
        if not ok:
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    return errors


def rule_messages() -> set[str]:
    """The message of every CEL rule in the CRD."""
    return {rule.get("message", rule["rule"]) for _, rule, _, _ in _rule_sites(version_schema(), _everything_present(),
                                                                              "")}


def _everything_present() -> dict[str, Any]:
    """An object reaching every rule site (used to enumerate the rules)."""
    return apply_defaults(version_schema(), {"metadata": {"name": "x"}, "spec": {
        "model": {"uri": "hf://a/b"}, "extraArgs": [],
        "pod": {"env": [], "volumes": [{"name": "v", "emptyDir": {}}], "labels": {}, "annotations": {}},
        "networkPolicy": {"enabled": True, "from": [{"podSelector": {}}]}}})


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """Default, then validate, like the API server on create and update (`old`: the stored object, for transition
    rules); raises ValueError with every message."""
    defaulted = apply_defaults(version_schema(), obj)
    errors = schema_errors(defaulted) or cel_errors(defaulted, old)  # the API runs CEL only on schema-valid objects
    if errors:
        raise ValueError("ScoringModel is invalid: " + "; ".join(errors))
    return defaulted
