"""examples/: every file applies on its own (`kubectl apply -f examples/x.yaml` creates its namespace and whatever
else it references), says what it needs first, and uses the chart's default images; the hello world needs nothing
beyond `helm install`. (The ScoringModels themselves pass the CRD's admission and render restricted-profile pods:
test_operator_crd.py, test_operator_render.py, test_operator_pod_security.py.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import crd_tools
import kubernetes_validate
import pytest
from pod_security import restricted_violations
from render_cases import K8S_VERSIONS

EXAMPLES = sorted((crd_tools.ROOT / "examples").glob("*.yaml"))


def _ids(path: Path) -> str:
    return path.name


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids)
def test_an_example_is_self_contained(path: Path) -> None:
    docs = crd_tools.documents(path)
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    claims = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "PersistentVolumeClaim"}
    models = [d for d in docs if d["kind"] == "ScoringModel"]
    assert models and namespaces
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") in namespaces, f"{doc['kind']} outside the file's namespaces"
    for model in models:
        source = model["spec"]["model"]
        needed = [source["uri"].removeprefix("pvc://").split("/")[0]] if source["uri"].startswith("pvc://") else []
        needed += [source["cache"]["claimName"]] if "cache" in source else []
        for claim in needed:
            assert (model["metadata"]["namespace"], claim) in claims, f"PVC {claim} is not in {path.name}"
        assert not model["spec"].get("image"), "examples run the chart's default worker image"
        assert "tokenSecretRef" not in source  # a Secret the file cannot contain


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids)
def test_an_example_says_what_it_needs_first(path: Path) -> None:
    header = path.read_text().split("\napiVersion:", 1)[0]
    assert header.startswith("#") and "Prerequisites:" in header
    assert "scorekeeper chart installed" in header


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_examples_other_objects_are_valid_kubernetes(version: str) -> None:
    for doc in crd_tools.example_documents():
        if doc["kind"] != "ScoringModel":
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_hello_world_needs_nothing_but_the_chart() -> None:
    (model,) = [d for d in crd_tools.documents(crd_tools.ROOT / "examples" / "hello-world-cpu.yaml")
                if d["kind"] == "ScoringModel"]
    spec: dict[str, Any] = model["spec"]
    assert spec["model"]["uri"].startswith("file:///")  # in the image (tests/images/test_dockerfile.py checks where)
    assert spec.get("resources", {}).get("gpu", {}).get("count", 0) == 0
    assert not spec.get("autoscaling", {}).get("enabled") and not spec.get("networkPolicy", {}).get("enabled")


def _kubectl_run_pod(header: str) -> tuple[str, dict[str, Any]]:
    """The pod `kubectl run NAME --image=I [--overrides=JSON --override-type=strategic] --restart=Never -- ARGS`
    creates (kubectl's generator: one container named after the pod; its overrides merged by container name)."""
    lines = [line.removeprefix("#").removeprefix(" ") for line in header.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("kubectl") and " run " in line)
    text = ""
    for line in lines[start:]:
        text += line + "\n"
        try:
            words = shlex.split(text.replace("\\\n", " "))
        except ValueError:  # a quote still open
            continue
        if not text.rstrip().endswith("\\"):
            break
    namespace, name = words[words.index("-n") + 1], words[words.index("run") + 1]
    options = dict(w.removeprefix("--").split("=", 1) for w in words[:words.index("--")] if "=" in w)
    container = {"name": name, "image": options["image"], "args": words[words.index("--") + 1:]}
    pod: dict[str, Any] = {"metadata": {"name": name, "labels": {"run": name}},
                           "spec": {"containers": [container], "restartPolicy": options["restart"]}}
    if "overrides" in options:
        assert options.get("override-type") == "strategic"  # merge (the default) would replace the container list
        overrides = json.loads(options["overrides"])
        spec = overrides.get("spec", {})
        for patch in spec.pop("containers", []):
            next(c for c in pod["spec"]["containers"] if c["name"] == patch["name"]).update(patch)
        pod["spec"].update(spec)
    return namespace, pod


def test_a_test_client_an_example_suggests_is_admitted_by_the_examples_namespace() -> None:
    """Issue 25: reranker-hub-cpu's `kubectl run` client was refused by the example's own restricted namespace."""
    path = crd_tools.ROOT / "examples" / "reranker-hub-cpu.yaml"
    namespace, pod = _kubectl_run_pod(path.read_text().split("\napiVersion:", 1)[0])
    (declared,) = [d for d in crd_tools.documents(path) if d["kind"] == "Namespace"]
    assert declared["metadata"]["name"] == namespace
    assert declared["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert restricted_violations(pod["spec"], pod["metadata"]) == []
    assert pod["spec"]["containers"][0]["args"][:2] == ["curl", "-s"]  # the overrides kept the command


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids)
def test_an_examples_pods_fit_on_one_node_of_their_kind(path: Path) -> None:
    """Issue 25: the GPU example's spread rule needed two GPU nodes; a spread is a preference in an example."""
    for model in [d for d in crd_tools.documents(path) if d["kind"] == "ScoringModel"]:
        for constraint in model["spec"].get("pod", {}).get("topologySpreadConstraints", []):
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway", constraint


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids)
def test_a_shared_cache_names_its_storage_class(path: Path) -> None:
    """ReadWriteMany is not what a cluster's default class offers, and the class decides whether the pods' user may
    write the volume (fsGroup is usually not applied to ReadWriteMany volumes): the example names a placeholder and
    says how to make it writable."""
    text = path.read_text()
    for claim in [d for d in crd_tools.documents(path) if d["kind"] == "PersistentVolumeClaim"]:
        if "ReadWriteMany" in claim["spec"]["accessModes"]:
            assert claim["spec"].get("storageClassName"), claim["metadata"]["name"]
            assert "uid/gid 10001" in text and "fsGroup" in text
