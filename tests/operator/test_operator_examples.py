"""examples/: every file applies on its own (`kubectl apply -f examples/x.yaml` creates its namespace and whatever
else it references), says what it needs first, and uses the chart's default images; the hello world needs nothing
beyond `helm install`. (The ScoringModels themselves pass the CRD's admission and render restricted-profile pods:
test_operator_crd.py, test_operator_render.py, test_operator_pod_security.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import crd_tools
import kubernetes_validate
import pytest
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
    assert spec["model"]["uri"].startswith("file:///")  # in the image (tests/test_dockerfile.py checks where)
    assert spec.get("resources", {}).get("gpu", {}).get("count", 0) == 0
    assert not spec.get("autoscaling", {}).get("enabled") and not spec.get("networkPolicy", {}).get("enabled")
