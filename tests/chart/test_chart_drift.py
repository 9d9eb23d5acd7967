"""One source of truth: the chart's files/ are byte-for-byte copies of the repository's sources, and what the chart
renders from them is the source, unchanged (plus the chart's own labels and annotations).

To update a copy after changing its source, run the `cp` command the failing test prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, REPO, VALUES, render

# (source in the repository, copy in the chart)
COPIES = [
    (REPO / "crds" / "scoringmodel.yaml", CHART / "files" / "crds" / "scoringmodel.yaml"),
    (REPO / "deploy" / "grafana" / "scorekeeper-dashboard.json",
     CHART / "files" / "grafana" / "scorekeeper-dashboard.json"),
    (REPO / "deploy" / "prometheus" / "scorekeeper-rules.yaml",
     CHART / "files" / "prometheus" / "scorekeeper-rules.yaml"),
]


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize(("source", "copy"), COPIES, ids=[_relative(s) for s, _ in COPIES])
def test_chart_copy_is_identical_to_its_source(source: Path, copy: Path) -> None:
    assert source.is_file(), f"{_relative(source)} is missing; the chart ships a copy of it"
    fix = f"cp {_relative(source)} {_relative(copy)}"
    assert copy.is_file(), f"the chart has no copy of {_relative(source)}; run: {fix}"
    assert copy.read_bytes() == source.read_bytes(), f"{_relative(copy)} differs from {_relative(source)}; run: {fix}"


@pytest.mark.parametrize("directory", ["crds", "grafana", "prometheus"])
def test_chart_files_are_only_copies(directory: str) -> None:
    """No file in the chart's files/ without a source (a renamed source would otherwise leave a stale copy)."""
    copies = {c for _, c in COPIES}
    stray = [p for p in (CHART / "files" / directory).iterdir() if p not in copies]
    assert not stray, f"no source for {stray}"


def _without_chart_metadata(manifest: dict[str, Any]) -> dict[str, Any]:
    stripped = json.loads(json.dumps(manifest))
    stripped["metadata"].pop("labels", None)
    stripped["metadata"].pop("annotations", None)
    return stripped


def test_rendered_crd_is_the_source_crd() -> None:
    source = yaml.safe_load(COPIES[0][0].read_text())
    rendered = render({}).one("CustomResourceDefinition")
    assert _without_chart_metadata(rendered) == _without_chart_metadata(source)
    # the source's own labels survive; the chart adds its release labels and the keep policy
    assert source["metadata"].get("labels", {}).items() <= rendered["metadata"]["labels"].items()
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert rendered["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crd_policy_values() -> None:
    full = render(VALUES["full"]).one("CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in full["metadata"]["annotations"]  # crds.keep=false
    assert full["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
    assert not render(VALUES["external"]).of_kind("CustomResourceDefinition")  # crds.install=false


def test_crd_is_not_also_in_helms_install_only_directory() -> None:
    """The CRD ships through templates (upgradable); a second copy in crds/ would be installed twice."""
    assert not (CHART / "crds").exists()


def test_rendered_dashboard_is_the_source_dashboard() -> None:
    configmap = render(VALUES["full"]).one("ConfigMap")
    source = COPIES[1][0]
    assert json.loads(configmap["data"][source.name]) == json.loads(source.read_text())


def test_rendered_rules_are_the_source_rules() -> None:
    source: dict[str, Any] = yaml.safe_load(COPIES[2][0].read_text())
    if source.get("kind") == "PrometheusRule":
        source = source["spec"]
    assert render(VALUES["full"]).one("PrometheusRule")["spec"] == {"groups": source["groups"]}
