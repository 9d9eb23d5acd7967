"""The CRD itself, and sample ScoringModels against its schema (jsonschema) and CEL rules (cel-python)."""

from __future__ import annotations

from typing import Any

import crd_tools
import kubernetes_validate
import pytest
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.worker_contract import RESERVED_FLAGS

K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]


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
        expected = annotations.get(crd_tools.EXPECT + layer)
        if expected is None:
            assert errors == [], f"{layer} should accept it (the other layer is the intended reason)"
        else:
            assert errors, f"{layer} accepted it"
            assert any(expected in error for error in errors), errors
    with pytest.raises(ValueError, match="ScoringModel is invalid"):
        crd_tools.admit(doc)


def _doc(name: str = "x", **spec: Any) -> dict[str, Any]:
    body = {"metadata": {"name": name}, "spec": {"model": {"uri": "pvc://models/m"}, **spec}}
    defaulted: dict[str, Any] = crd_tools.apply_defaults(crd_tools.version_schema(), body)
    return defaulted


# Each cross-field rule at its boundary: (object, the rule message it must trip, or None where it must pass).
BOUNDARIES: list[tuple[str, dict[str, Any], str | None]] = [
    ("name-dns1035", _doc("9-lives"), "metadata.name must be a DNS-1035 label"),
    ("name-63", _doc("a" * 63), None),
    ("name-64", _doc("a" * 64), "metadata.name must be a DNS-1035 label"),
    ("revision-pvc", _doc(model={"uri": "pvc://m", "revision": "main"}), "model.revision applies only to hf://"),
    ("revision-hf", _doc(model={"uri": "hf://a/b", "revision": "main"}), None),
    ("token-pvc", _doc(model={"uri": "pvc://m", "tokenSecretRef": {"name": "s"}}),
     "model.tokenSecretRef applies only to hf://"),
    ("items-0", _doc(scoring={"multiItem": {"maxItemsPerRequest": 0}}), "maxItemsPerRequest must be at least 1"),
    ("delimiter-off", _doc(scoring={"multiItem": {"delimiterTokenId": 7}}), "delimiterTokenId requires"),
    ("delimiter-on", _doc(scoring={"multiItem": {"enabled": True, "delimiterTokenId": 7}}), None),
    ("buckets-equal", _doc(cudaGraph={"tokenBuckets": [256, 256]}), "must be strictly increasing"),
    ("buckets-at-max", _doc(cudaGraph={"tokenBuckets": [256, 8192], "maxTokens": 8192}), None),
    ("buckets-over-max", _doc(cudaGraph={"tokenBuckets": [256, 8193], "maxTokens": 8192}), "must not exceed"),
    ("replicas-equal", _doc(autoscaling={"minReplicas": 3, "maxReplicas": 3}), None),
    ("replicas-crossed", _doc(autoscaling={"minReplicas": 4, "maxReplicas": 3}), "must not exceed autoscaling"),
    ("reserved-flag", _doc(extraArgs=["--port=9"]), "must not repeat a flag"),
    ("reserved-prefix-ok", _doc(extraArgs=["--portable"]), None),
    ("cache-pvc", _doc(model={"uri": "pvc://m", "cache": {"claimName": "c"}}), "model.cache and model.download"),
    ("size-pvc", _doc(model={"uri": "pvc://m", "downloadSizeLimit": "1Gi"}), "model.cache and model.download"),
    ("cache-hf", _doc(model={"uri": "hf://a/b", "cache": {"claimName": "c"}, "downloadSizeLimit": "1Gi"}), None),
    ("gpu-1", _doc(resources={"gpu": {"count": 1}}), None),
    ("gpu-2", _doc(resources={"gpu": {"count": 2}}), "resources.gpu.count must be 0 or 1"),
    ("keda-no-address", _doc(autoscaling={"provider": "KEDA"}), "KEDA needs autoscaling.prometheusAddress"),
    ("keda-address", _doc(autoscaling={"provider": "KEDA", "prometheusAddress": "http://p:9090"}), None),
    ("hpa-query", _doc(autoscaling={"prometheusQuery": "sum(up)"}), "apply only to provider KEDA"),
    ("env-reserved", _doc(pod={"env": [{"name": "HF_HOME", "value": "/x"}]}), "pod.env must not set"),
    ("env-worker-setting", _doc(pod={"env": [{"name": "SCOREKEEPER_X", "value": "1"}]}), "pod.env must not set"),
    ("env-ok", _doc(pod={"env": [{"name": "HF_HOME_EXTRA", "value": "1"}]}), None),
    ("volume-two-sources", _doc(pod={"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]}),
     "needs exactly one of"),
    ("volume-no-source", _doc(pod={"volumes": [{"name": "v"}]}), "needs exactly one of"),
    ("volume-name", _doc(pod={"volumes": [{"name": "tmp", "emptyDir": {}}]}), "must not reuse the operator's volume"),
    ("label-reserved", _doc(pod={"labels": {"app.kubernetes.io/instance": "y"}}), "pod.labels must not set"),
    ("label-ok", _doc(pod={"labels": {"app.kubernetes.io/version": "1"}}), None),
    ("annotation-reserved", _doc(pod={"annotations": {"scorekeeper.dev/x": "1"}}), "pod.annotations must not set"),
    ("env-nvidia", _doc(pod={"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
     "pod.env must not set NVIDIA_* variables"),
    ("env-nvidia-suffix-ok", _doc(pod={"env": [{"name": "MY_NVIDIA_NOTE", "value": "x"}]}), None),
    ("apparmor-unconfined", _doc(pod={"annotations": {"container.apparmor.security.beta.kubernetes.io/worker":
                                                      "unconfined"}}), "AppArmor and seccomp profiles"),
    ("seccomp-unconfined", _doc(pod={"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}),
     "AppArmor and seccomp profiles"),
    ("apparmor-default", _doc(pod={"annotations": {"container.apparmor.security.beta.kubernetes.io/worker":
                                                   "runtime/default"}}), None),
    ("seccomp-localhost", _doc(pod={"annotations": {"container.seccomp.security.alpha.kubernetes.io/worker":
                                                    "localhost/scorer"}}), None),
    ("peer-empty", _doc(networkPolicy={"enabled": True, "from": [{}]}), "need podSelector, namespaceSelector"),
    ("peer-ip-and-selector", _doc(networkPolicy={"enabled": True, "from": [
        {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}), "ipBlock cannot be combined"),
    ("peer-ip", _doc(networkPolicy={"enabled": True, "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}), None),
    ("template-builtin", _doc(scoring={"promptTemplate": "qwen3-reranker"}), None),
    ("template-text", _doc(scoring={"promptTemplate": "Q: {query}\nD: {item}\nA:"}), None),
    ("template-unknown-name", _doc(scoring={"promptTemplate": "qwen9-reranker"}), "a built-in template"),
    ("template-no-query", _doc(scoring={"promptTemplate": "D: {item}"}), "a built-in template"),
    ("certificate-none", _doc(scoring={"quantizationCertificate": {"minTop10": 0.5}}), "applies only to scoring.quan"),
    ("certificate-int8", _doc(scoring={"quantization": "int8", "quantizationCertificate": {"minTop10": 0.5}}), None),
    ("int8-gpu", _doc(scoring={"quantization": "int8"}, resources={"gpu": {"count": 1}}), "int8 runs the model on CPU"),
    ("int8-cpu", _doc(scoring={"quantization": "int8"}, resources={"cpu": "2"}), None),
    ("none-gpu", _doc(resources={"gpu": {"count": 1}}), None),
]


@pytest.mark.parametrize(("doc", "expected"), [(d, e) for _, d, e in BOUNDARIES], ids=[i for i, _, _ in BOUNDARIES])
def test_cel_rules_hold_at_their_boundaries(doc: dict[str, Any], expected: str | None) -> None:
    errors = crd_tools.cel_errors(doc)
    if expected is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expected in errors[0], errors


def test_every_cel_rule_is_tried_by_a_boundary_case() -> None:
    """A rule added without a case here (or a case that no longer trips its rule) fails this test."""
    messages = crd_tools.rule_messages()
    tripped = {m for m in messages for _, doc, expected in BOUNDARIES
               if expected and expected in m and any(expected in e for e in crd_tools.cel_errors(doc))}
    transition = {m for m in messages if "autoscaling is enabled" in m}  # test_operator_scale.py
    assert messages - transition == tripped


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
