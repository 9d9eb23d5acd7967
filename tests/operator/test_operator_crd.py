"""The CRD itself, and sample ScoringModels against its schema (jsonschema) and CEL rules (cel-python)."""

from __future__ import annotations

from typing import Any

import crd_tools
import kubernetes_validate
import pytest
from scorekeeper_operator.flags import RESERVED_FLAGS
from scorekeeper_operator.spec import ScoringModel

K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
EXPECT = "test.scorekeeper.dev/expect-"


VALID = crd_tools.valid_samples()
INVALID = crd_tools.invalid_samples()


def _id(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["name"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_is_a_valid_custom_resource_definition(version: str) -> None:
    kubernetes_validate.validate(crd_tools.load_crd(), version, strict=True)


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, schema)]
    for key, sub in schema.get("properties", {}).items():
        nodes += _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        nodes += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += _walk(schema["additionalProperties"], f"{path}{{}}")
    return nodes


def test_schema_is_structural() -> None:
    """The API rejects a non-structural schema: every node needs a type (or int-or-string / preserve-unknown)."""
    untyped = [path for path, node in _walk(crd_tools.version_schema())
               if "type" not in node and not node.get("x-kubernetes-int-or-string")
               and not node.get("x-kubernetes-preserve-unknown-fields")]
    assert untyped == []


def test_subresources_and_printer_columns() -> None:
    (version,) = crd_tools.load_crd()["spec"]["versions"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Model", "Ready", "Replicas", "Phase", "Age", "Reason", "Endpoint"]
    assert columns["Reason"]["priority"] == columns["Endpoint"]["priority"] == 1
    assert crd_tools.load_crd()["spec"]["names"]["shortNames"] == ["sm"]


def test_there_are_enough_samples() -> None:
    assert len(VALID) >= 10 and len(INVALID) >= 10


@pytest.mark.parametrize("doc", VALID, ids=_id)
def test_valid_sample_is_accepted_by_schema_cel_and_operator(doc: dict[str, Any]) -> None:
    defaulted = crd_tools.apply_defaults(crd_tools.version_schema(), doc)
    assert crd_tools.schema_errors(defaulted) == []
    assert crd_tools.cel_errors(defaulted) == []
    # What the API stores (defaulted) is also what the operator accepts.
    ScoringModel.from_body({**defaulted, "metadata": {**defaulted["metadata"], "namespace": "ml"}})


@pytest.mark.parametrize("doc", INVALID, ids=_id)
def test_invalid_sample_fails_for_the_intended_reason(doc: dict[str, Any]) -> None:
    annotations = doc["metadata"]["annotations"]
    defaulted = crd_tools.apply_defaults(crd_tools.version_schema(), doc)
    for layer, errors in (("schema", crd_tools.schema_errors(defaulted)), ("cel", crd_tools.cel_errors(defaulted))):
        expected = annotations.get(EXPECT + layer)
        if expected is None:
            assert errors == [], f"{layer} should accept it (the other layer is the intended reason)"
        else:
            assert errors, f"{layer} accepted it"
            assert any(expected in error for error in errors), errors
    with pytest.raises(ValueError, match="ScoringModel is invalid"):
        crd_tools.admit(doc)


def test_cel_rules_compile_and_cover_the_required_cross_field_rules() -> None:
    rules = crd_tools.rules()
    assert any("tokenBuckets[i - 1] < self.tokenBuckets[i]" in r for r in rules)
    assert any("b <= self.maxTokens" in r for r in rules)
    assert any("self.minReplicas <= self.maxReplicas" in r for r in rules)
    assert any("self.maxItemsPerRequest >= 1" in r for r in rules)


def test_strict_increase_rule_covers_every_allowed_bucket_count() -> None:
    """The rule enumerates indices 1..31 (CEL has no range); maxItems must not outgrow it."""
    schema = crd_tools.version_schema()["properties"]["spec"]["properties"]["cudaGraph"]
    assert schema["properties"]["tokenBuckets"]["maxItems"] == 32
    buckets = list(range(16, 16 * 33, 16))  # 32 increasing values, then swap the last two
    doc = {"metadata": {"name": "x"}, "spec": {"model": {"uri": "pvc://m"},
                                               "cudaGraph": {"tokenBuckets": buckets, "maxTokens": 1024}}}
    assert crd_tools.cel_errors(crd_tools.apply_defaults(crd_tools.version_schema(), doc)) == []
    buckets[-2], buckets[-1] = buckets[-1], buckets[-2]
    assert any("strictly increasing" in e for e in crd_tools.cel_errors(doc))


def test_cel_reserved_flags_are_the_operators() -> None:
    """One list in two places (CEL cannot import Python): keep them identical."""
    schema = crd_tools.version_schema()["properties"]["spec"]["properties"]["extraArgs"]
    rule = schema["x-kubernetes-validations"][0]["rule"]
    listed = rule.split("[", 1)[1].split("]", 1)[0]
    assert tuple(flag.strip().strip("'") for flag in listed.split(",")) == RESERVED_FLAGS
