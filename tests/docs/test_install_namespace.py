"""The guides install the chart into one namespace: a reader who follows the README and then docs/deploy.md (or the
chart's NOTES) must not end up with the operator in `scorekeeper` and the upgrade command aimed at
`scorekeeper-system`."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "scorekeeper-system"
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "charts" / "scorekeeper" / "README.md"]
# A helm command on the chart, and the namespace it names (-n X, --namespace X or --namespace=X).
HELM = re.compile(r"helm (?:install|upgrade|uninstall|status|get)\b[^\n]*")
NAMED = re.compile(r"(?:-n|--namespace)[ =]([a-z0-9-]+)")


def helm_namespaces(text: str) -> list[str]:
    return [named for command in HELM.findall(text) if "kube-prometheus-stack" not in command
            for named in NAMED.findall(command)]


def test_the_namespace_finder_reads_every_spelling() -> None:
    text = ("helm install scorekeeper charts/scorekeeper -n scorekeeper --create-namespace\n"
            "`helm upgrade scorekeeper charts/scorekeeper --namespace=other --reuse-values`\n"
            "helm uninstall scorekeeper --namespace third\n")
    assert helm_namespaces(text) == ["scorekeeper", "other", "third"]


def test_every_guide_installs_the_chart_into_one_namespace() -> None:
    found = {f"{path.relative_to(REPO)}: {named}" for path in GUIDES if path.is_file()
             for named in helm_namespaces(path.read_text()) if named != NAMESPACE}
    assert found == set()
    assert any(helm_namespaces(path.read_text()) for path in GUIDES if path.is_file())  # the finder sees them
