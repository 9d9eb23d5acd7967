"""Resource quantities: Kubernetes' own grammar in the CRD and the operator, and value comparison against drift.

The tables come from k8s.io/apimachinery/pkg/api/resource/quantity_test.go (TestQuantityParse, its `invalid` list,
TestQuantityParseEmit, TestQuantityString), so the grammar is checked against the reference implementation's cases.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import crd_tools
import pytest
from harness import scoring_model
from kmock_semantics import canonical_quantity
from scorekeeper_operator.render.drift import contains
from scorekeeper_operator.spec.model import InvalidSpec, ScoringModel
from scorekeeper_operator.spec.quantity import QUANTITY_PATTERN, parse_quantity, quantity_bytes, same_quantity

# (input, mantissa, exponent) from TestQuantityParse: the value is mantissa * 10**exponent (rounded up to 1n).
PARSED = [
    ("0", 0, 0), ("0n", 0, 0), ("0Ki", 0, 0), ("0k", 0, 0), ("0Gi", 0, 0), ("1", 1, 0),
    ("1Ki", 1024, 0), ("7Mi", 7 * 1024**2, 0), ("6Gi", 6 * 1024**3, 0), ("3Ei", 3 * 1024**6, 0),
    ("5n", 5, -9), ("4u", 4, -6), ("3m", 3, -3), ("8k", 8, 3), ("50k", 5, 4), ("7M", 7, 6), ("6G", 6, 9),
    ("300T", 3, 14), ("2P", 2, 15), ("1E", 1, 18), ("1E-3", 1, -3), ("1e3", 1, 3), ("1E18", 1, 18),
    ("100.035k", 100035, 0), ("0.0005k", 5, -1), ("0.5", 5, -1), ("0.50000", 5, -1), ("0.5e-2", 5, -3),
    ("10.035M", 10035, 3), ("1.3E+6", 13, 5), ("1.53E12", 153, 10), ("8.1k", 81, 2), ("1.01E", 101, 16),
    ("3.001n", 4, -9), ("1.1E-9", 2, -9), ("0.0000000005", 1, -9), ("0.00000012345", 124, -9),
    ("100.035Ki", 10243584, -2), ("0.5Mi", 512 * 1024, 0), ("0.05Gi", 536870912, -1),
    ("0.000000000001Ki", 2, -9), (".001", 1, -3), (".0001k", 100, -3), ("1.", 1, 0), ("1.G", 1, 9),
    ("+1.5Gi", 1536 * 1024**2, 0),
]
# quantity_test.go's `invalid`, plus the probes of issue 15 (`K` is not a suffix) and what requests cannot be.
INVALID = ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 ",
           "1K", "16KB", "1Gb", "1e", "-1", "-500m", "", ".", "1_000", "NaN", "Infinity"]


@pytest.mark.parametrize(("text", "mantissa", "exponent"), PARSED)
def test_valid_quantities_parse_to_the_reference_value(text: str, mantissa: int, exponent: int) -> None:
    assert parse_quantity(text) == Decimal(mantissa).scaleb(exponent)


@pytest.mark.parametrize("text", [t for t, _, _ in PARSED])
def test_the_crd_and_the_operator_accept_every_valid_quantity(text: str) -> None:
    body = scoring_model(resources={"cpu": text, "memory": text})
    assert crd_tools.schema_errors(crd_tools.apply_defaults(crd_tools.version_schema(), body)) == []
    ScoringModel.from_body({**body, "metadata": {**body["metadata"], "uid": "u"}})


@pytest.mark.parametrize("text", INVALID)
def test_the_crd_and_the_operator_reject_what_kubernetes_rejects(text: str) -> None:
    for field in ("cpu", "memory"):
        body = scoring_model(resources={field: text})
        errors = crd_tools.schema_errors(crd_tools.apply_defaults(crd_tools.version_schema(), body))
        assert any(f"resources.{field}" in error for error in errors), (field, errors)
        with pytest.raises(InvalidSpec, match=f"spec.resources.{field}"):
            ScoringModel.from_body(body)
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_the_crd_pattern_is_the_operators() -> None:
    spec = crd_tools.version_schema()["properties"]["spec"]["properties"]
    resources, source = spec["resources"]["properties"], spec["model"]["properties"]
    assert resources["cpu"]["pattern"] == resources["memory"]["pattern"] == QUANTITY_PATTERN
    assert source["downloadSizeLimit"]["pattern"] == QUANTITY_PATTERN  # one grammar for every quantity


@pytest.mark.parametrize(("text", "size"), [("20Gi", 20 * 2**30), ("1.5G", 1_500_000_000), ("2e3", 2000),
                                            ("512", 512), ("1Ki", 1024), ("1k", 1000), ("1500m", 2)])
def test_bytes_are_whole_and_rounded_up(text: str, size: int) -> None:
    assert quantity_bytes(text) == size


# (written, what the API server reads back) from TestQuantityParseEmit and TestQuantityString's alternates.
CANONICAL = [("1024Mi", "1Gi"), ("1000M", "1G"), (".001Ki", "1024m"), (".000001Ki", "1024u"),
             (".000000000001Ki", "2n"), ("307200Ki", "300Mi"), ("5000m", "5"), ("0.5", "500m"),
             ("0.001T", "1G"), ("1000u", "1m"), ("1.08", "1080m"), ("1080000000n", "1080m"), ("1025", "1025"),
             (".001e12", "1e9"), ("0.001e0", "1e-3"), ("1000e-12", "1e-9"), ("1.5Gi", "1536Mi"), ("2000", "2k"),
             ("1Gi", "1Gi"), ("1500", "1500"), ("0", "0")]


@pytest.mark.parametrize(("written", "stored"), CANONICAL)
def test_the_emulator_stores_quantities_canonically_like_the_api_server(written: str, stored: str) -> None:
    assert canonical_quantity(written) == stored  # the emulator's model of the API server, checked upstream's cases


@pytest.mark.parametrize(("written", "stored"), CANONICAL)
def test_canonical_forms_are_the_same_quantity(written: str, stored: str) -> None:
    assert same_quantity(written, stored) and same_quantity(stored, written)


@pytest.mark.parametrize(("left", "right"), [("1Gi", "1G"), ("1k", "1Ki"), ("500m", "5"), ("1Gi", None),
                                             ("1K", "1k")])
def test_different_values_or_non_quantities_differ(left: Any, right: Any) -> None:
    assert not same_quantity(left, right)


def test_non_canonical_requests_are_not_drift_but_other_changes_are() -> None:
    desired = {"spec": {"containers": [{"name": "w", "resources": {"requests": {"cpu": "0.5", "memory": "1.5Gi"},
                                                                   "limits": {"memory": "1.5Gi"}}}],
                        "volumes": [{"name": "shm", "emptyDir": {"sizeLimit": "1024Mi"}}]},
               "metadata": {"labels": {"size": "1000"}}}
    live = {"spec": {"containers": [{"name": "w", "resources": {"requests": {"cpu": "500m", "memory": "1536Mi"},
                                                                "limits": {"memory": "1536Mi"}}}],
                     "volumes": [{"name": "shm", "emptyDir": {"sizeLimit": "1Gi"}}]},
            "metadata": {"labels": {"size": "1000"}}}
    assert contains(live, desired)
    live["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "600m"
    assert not contains(live, desired)
    live["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    live["metadata"]["labels"]["size"] = "1k"  # a label is a string, not a quantity: this is a change
    assert not contains(live, desired)


@pytest.mark.parametrize(("written", "stored"), [(1.5, "1.5"), (2, "2"), (2.5e9, "2500000000.0"), ("500m", "500m")])
def test_a_quantity_written_as_a_yaml_number_is_accepted_like_a_deployments(written: Any, stored: str) -> None:
    """Issue 25: `cpu: 1.5` unquoted, which int-or-string refuses at a real API server."""
    body = scoring_model(resources={"cpu": written, "memory": written})
    defaulted = crd_tools.apply_defaults(crd_tools.version_schema(), body)
    assert crd_tools.schema_errors(defaulted) == []
    resources = ScoringModel.from_body(body).spec.resources
    assert (resources.cpu, resources.memory) == (stored, stored)
    assert canonical_quantity(stored) == canonical_quantity(str(written))


@pytest.mark.parametrize(("written", "at_the_api"), [(-1, True), (True, False), ({"value": "1"}, False)])
def test_what_is_not_a_quantity_is_refused(written: Any, at_the_api: bool) -> None:
    """The CRD gives up its type to admit numbers: its minimum refuses negatives; other shapes get through the API
    and the operator refuses them (ConfigValid=False), naming the field."""
    body = scoring_model(resources={"cpu": written})
    errors = crd_tools.schema_errors(crd_tools.apply_defaults(crd_tools.version_schema(), body))
    assert bool(errors) is at_the_api
    with pytest.raises(InvalidSpec, match=r"spec\.resources\.cpu"):
        ScoringModel.from_body(body)
