"""What write access to a ScoringModel cannot do to its pods (issue 49): every field a CR author controls, set to
hostile values, either is refused by the operator's spec check or renders a pod that still meets the restricted
Pod Security profile and gets no GPU it did not request (pod_security.py); the knobs that could break those promises
are refused by the CRD (CEL) and the operator alike, with a message that names the field.

Two complete specs (a CPU model from the Hub with every optional field set, a GPU model) hold every field of the CRD
between them (checked against the schema); each field of each is then replaced by values chosen for its kind."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import crd_tools
import pytest
from pod_security import gpu_exposure, hardening_violations, restricted_violations
from render_cases import COMMIT, FULL_POD, model_from, pod_spec, render_all
from scorekeeper_operator.spec.model import InvalidSpec

Path = tuple[str | int, ...]
SCHEMA = crd_tools.version_schema()["properties"]["spec"]
SELECTOR = {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}]}
CPU_HUB: dict[str, Any] = {
    "model": {"uri": "hf://BAAI/bge-reranker-v2-m3", "revision": COMMIT, "cache": {"claimName": "hub-cache"},
              "downloadSizeLimit": "4Gi", "servedName": "bge", "dtype": "float32",
              "tokenSecretRef": {"name": "hf", "key": "token"}},
    "scoring": {"multiItem": {"enabled": True, "delimiterTokenId": 7, "maxItemsPerRequest": 64},
                "maxBatchTokens": 4096, "maxQueueTokens": 65536, "maxRequestTokens": 8192, "requestTimeoutSeconds": 30,
                "returnPooledHiddenStates": "forbidden", "promptTemplate": "qwen3-reranker",
                "labelTokens": [" yes", " no"], "quantization": "int8",
                "quantizationCertificate": {"minSpearman": 0.98, "maxScoreDelta": 0.1, "minTop10": 0.9,
                                            "minSpeedup": 1.0},
                "decisions": {"template": "Question: {question}\nAnswer:"}},
    "cudaGraph": {"enabled": False, "tokenBuckets": [256, 512], "maxTokens": 512, "maxSequences": 8},
    "compile": {"mode": "off", "budgetSeconds": 60, "cacheDir": "/var/cache/scorekeeper/inductor"},
    "resources": {"cpu": "2", "memory": "4Gi", "shmSize": "2Gi"},
    "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "metric": "queueDepth", "target": 8,
                    "provider": "KEDA", "prometheusAddress": "http://prometheus.monitoring.svc:9090",
                    "prometheusQuery": "sum(scorekeeper_queue_depth)"},
    "rollout": {"strategy": "RollingUpdate", "maxStartupSeconds": 600, "schedulingDeadlineSeconds": 120,
                "drainSeconds": 20, "preStopSeconds": 3},
    "scheduling": {"nodeSelector": {"pool": "cpu"},
                   "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule",
                                    "tolerationSeconds": 60}],
                   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In",
                                                                    "values": ["cpu"]}]}]}}},
                   "priorityClassName": "inference"},
    "image": "registry.example/worker:2",
    "extraArgs": ["--log-level", "debug"],
    "auth": {"apiKeySecretRef": {"name": "keys", "key": "keys"}},
    "monitoring": {"serviceMonitor": True, "interval": "15s", "labels": {"release": "kps"}},
    "pod": {**FULL_POD, "volumes": [*FULL_POD["volumes"], *({"name": kind.lower(), kind: {}} for kind in (
        "secret", "emptyDir", "persistentVolumeClaim", "downwardAPI", "csi"))],
        "volumeMounts": [*FULL_POD["volumeMounts"], {"name": "secret", "mountPath": "/etc/extra", "subPath": "a"}],
        "envFrom": [{"configMapRef": {"name": "scorer-env", "optional": True}}, *FULL_POD["envFrom"][1:]],
        "topologySpreadConstraints": [{**FULL_POD["topologySpreadConstraints"][1], "labelSelector": SELECTOR,
                                       "nodeTaintsPolicy": "Honor"}]},
    "networkPolicy": {"enabled": True, "monitoringNamespace": "monitoring", "from": [
        {"podSelector": SELECTOR, "namespaceSelector": SELECTOR}, {"ipBlock": {"cidr": "10.0.0.0/8",
                                                                               "except": ["10.1.0.0/16"]}}]},
}
GPU: dict[str, Any] = {"model": {"uri": "pvc://models/qwen3"}, "replicas": 2,
                       "resources": {"gpu": {"count": 1, "resourceName": "nvidia.com/gpu"}}, "pod": FULL_POD}
FULL_SPECS = {"cpu-hub": CPU_HUB, "gpu": GPU}

# What a hostile CR author would try, by the kind of field.
HOSTILE_STRINGS = ("unconfined", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "/", "0", "privileged")
HOSTILE_KEYS = {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined",
                "container.apparmor.security.beta.kubernetes.io/download-model": "unconfined",
                "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
                "container.seccomp.security.alpha.kubernetes.io/worker": "unconfined",
                "NVIDIA_VISIBLE_DEVICES": "all"}
HOSTILE_OBJECTS = ({"hostPath": {"path": "/"}}, {"securityContext": {"privileged": True}}, {"hostNetwork": True})


def schema_leaves(schema: dict[str, Any], path: Path = ()) -> Iterator[Path]:
    """Every field of the schema: lists as `[]`, maps of user keys as `{}`, open objects as leaves."""
    if "properties" in schema:
        for key, sub in schema["properties"].items():
            yield from schema_leaves(sub, (*path, key))
    elif schema.get("type") == "array":
        yield from schema_leaves(schema["items"], (*path, "[]"))
    else:
        yield (*path, "{}") if isinstance(schema.get("additionalProperties"), dict) else path


def doc_leaves(doc: Any, schema: dict[str, Any], path: Path = ()) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(concrete path, schema node) of every field set in `doc`."""
    if "properties" in schema and isinstance(doc, dict):
        for key, value in doc.items():
            yield from doc_leaves(value, schema["properties"][key], (*path, key))
    elif schema.get("type") == "array" and isinstance(doc, list):
        for index, item in enumerate(doc):
            yield from doc_leaves(item, schema["items"], (*path, index))
        yield path, schema  # the list itself: one more item
    else:
        yield path, schema


def general(path: Path, schema: dict[str, Any]) -> Path:
    """The schema's name of a concrete path (items as `[]`, a map of user keys ending in `{}`)."""
    named = tuple("[]" if isinstance(part, int) else part for part in path)
    return (*named, "{}") if isinstance(schema.get("additionalProperties"), dict) else named


def hostile(value: Any, schema: dict[str, Any]) -> list[Any]:
    if "enum" in schema:
        return list(schema["enum"])
    if schema.get("type") == "boolean":
        return [True, False]
    if schema.get("type") == "array":
        return [[*value, text] for text in HOSTILE_STRINGS] if schema["items"].get("type") == "string" else []
    if isinstance(schema.get("additionalProperties"), dict):
        return [{**value, key: text} for key, text in HOSTILE_KEYS.items()]
    if schema.get("x-kubernetes-preserve-unknown-fields") and isinstance(value, dict):
        return [{**value, **fragment} for fragment in HOSTILE_OBJECTS]
    return list(HOSTILE_STRINGS) if schema.get("type") == "string" else []


def with_value(spec: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(spec)
    target: Any = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


def broken_promises(spec: dict[str, Any]) -> list[str] | None:
    """None when the operator refuses the spec; else what the rendered pod breaks (empty: nothing)."""
    try:
        source = spec["model"]  # an hf:// revision as the operator sees it once resolved (status.model)
        model = model_from(spec, status={"model": {"uri": source["uri"], "revision": source.get("revision"),
                                                   "resolvedRevision": COMMIT}})
    except InvalidSpec:
        return None
    rendered = render_all(model)
    pod, meta = pod_spec(rendered), rendered.get("Deployment")["spec"]["template"]["metadata"]
    return restricted_violations(pod, meta) + hardening_violations(pod) + gpu_exposure(pod)


def test_the_full_specs_hold_every_field_of_the_crd_and_are_valid() -> None:
    covered = {general(path, schema) for spec in FULL_SPECS.values() for path, schema in doc_leaves(spec, SCHEMA)}
    assert set(schema_leaves(SCHEMA)) - covered == set()
    for spec in FULL_SPECS.values():
        body = crd_tools.admit({"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel",
                                "metadata": {"name": "full"}, "spec": spec})
        assert broken_promises(body["spec"]) == []


def test_no_field_a_cr_author_sets_breaks_the_pods_promises() -> None:
    tried, broken = 0, []
    for name, spec in FULL_SPECS.items():
        for path, schema in doc_leaves(spec, SCHEMA):
            current: Any = spec
            for part in path:
                current = current[part]
            for value in hostile(current, schema):
                tried += 1
                found = broken_promises(with_value(spec, path, value)) if path else None
                if found:
                    broken.append(f"{name} {'.'.join(map(str, path))}={value!r}: {found}")
    assert tried > 500 and broken == []


REFUSED = [
    ("annotations", {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}, "pod.annotations"),
    ("annotations", {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}, "pod.annotations"),
    ("env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "pod.env"),
    ("env", [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}], "pod.env"),
]


@pytest.mark.parametrize(("knob", "value", "field"), REFUSED, ids=[str(v) for _, v, _ in REFUSED])
def test_knobs_that_would_break_a_promise_are_refused_by_the_crd_and_the_operator(knob: str, value: Any,
                                                                                  field: str) -> None:
    spec = {"model": {"uri": "pvc://models/x"}, "pod": {knob: value}}
    body = crd_tools.apply_defaults(crd_tools.version_schema(), {
        "apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel", "metadata": {"name": "m"}, "spec": spec})
    errors = crd_tools.cel_errors(body)
    assert len(errors) == 1 and errors[0].startswith(f"spec.{field}: {field} "), errors
    with pytest.raises(InvalidSpec, match=rf"spec\.pod: {field} "):
        model_from(spec)


@pytest.mark.parametrize("value", ["runtime/default", "localhost/scorer-profile"])
def test_apparmor_and_seccomp_profiles_within_the_profile_are_allowed(value: str) -> None:
    annotations = {"container.apparmor.security.beta.kubernetes.io/worker": value,
                   "seccomp.security.alpha.kubernetes.io/pod": value}
    spec = {"model": {"uri": "pvc://models/x"}, "pod": {"annotations": annotations}}
    body = crd_tools.apply_defaults(crd_tools.version_schema(), {
        "apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel", "metadata": {"name": "m"}, "spec": spec})
    assert crd_tools.cel_errors(body) == []
    assert broken_promises(spec) == []


def test_a_pod_without_a_gpu_sees_none_whatever_its_image_or_runtime_class_says() -> None:
    """The worker image (a CUDA base) sets NVIDIA_VISIBLE_DEVICES=all: on a node whose default runtime, or the pod's
    runtimeClassName, is NVIDIA's, every container that requests no GPU would see them all. The operator sets `void`
    on those containers (the pod's env wins over the image's and over envFrom); a GPU container's is the device
    plugin's to set."""
    cpu = pod_spec(render_all(model_from(CPU_HUB)))
    for container in [*cpu["initContainers"], *cpu["containers"]]:
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"], container["name"]
    gpu = pod_spec(render_all(model_from(GPU)))["containers"][0]
    assert not [e for e in gpu["env"] if e["name"].startswith("NVIDIA_")]
    assert gpu_exposure(cpu) == gpu_exposure(pod_spec(render_all(model_from(GPU)))) == []
