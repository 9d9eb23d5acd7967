"""Static checks of the shipped observability artifacts: the Grafana dashboard and its sidecar ConfigMap, the
PrometheusRule (promtool), the chart's copies, and docs/observability.md covering every metric, panel and alert.
The live checks (a real Prometheus scraping real workers) are in test_observability_prometheus.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from obs_harness import (
    CHART_FILES,
    DASHBOARD,
    DASHBOARD_CONFIGMAP,
    DOCS,
    RULES,
    alert_rules,
    all_panels,
    dashboard_queries,
    dashboard_variables,
    load_dashboard,
    load_rules_document,
    metric_names,
    promtool_binary,
    render_dashboard_configmap,
    rule_groups,
    split_threshold,
    substitute,
)
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from scorekeeper_worker.base.metrics import WorkerMetrics

DUMMY = {"namespace": "ns", "job": "job", "pod": "pod"}
WORKER_VARIABLES = ("$namespace", "$job", "$pod")  # the ScoringModels the dashboard shows


def _families(registry: CollectorRegistry, prefix: str) -> set[str]:
    text = generate_latest(registry).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    # prometheus-client adds a `<counter>_created` timestamp gauge to each counter and histogram: not ours to document.
    return {name for name in names if name.startswith(prefix) and not name.endswith("_created")}


def exported_metric_names() -> set[str]:
    """Every metric family the worker exports, as named in the exposition text (`# TYPE` lines)."""
    return _families(WorkerMetrics().registry, "scorekeeper_")


def operator_metric_names() -> set[str]:
    """The operator's own (its module registers them in the process-wide registry)."""
    import scorekeeper_operator.metrics  # noqa: F401

    return _families(REGISTRY, "scorekeeper_operator_")


# ------------------------------------------------------------------------------------------------ dashboard


def test_dashboard_is_grafana_json_for_the_sidecar() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "scorekeeper" and dashboard["title"] == "Scorekeeper"
    assert "id" not in dashboard or dashboard["id"] is None  # a fixed id would clash across Grafana instances
    panels = list(all_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    # A sidecar-loaded dashboard cannot be given a datasource at import time (no __inputs): every query goes through
    # the $datasource variable so it works with any Prometheus datasource name.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']}: say what the panel shows"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_layout_has_no_overlapping_panels() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(load_dashboard()):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_dashboard_queries_use_only_known_variables_and_metrics() -> None:
    exported = exported_metric_names() | operator_metric_names()
    # sample names a family exports: histograms add _bucket/_sum/_count; Info metrics already end in _info
    samples = exported | {f"{name}{suffix}" for name in exported for suffix in ("_bucket", "_sum", "_count")}
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    for query in queries:
        substitute(query.expr, DUMMY)  # raises on an unknown variable
        named = metric_names(query.expr)
        assert named, f"{query.panel}: names no scorekeeper metric"
        assert named <= samples, f"{query.panel}: {sorted(named - samples)} are not exported"
        # every query of worker series honours the dashboard's selection; the operator is not a ScoringModel
        operator_only = all(name.startswith("scorekeeper_operator_") for name in named)
        for variable in WORKER_VARIABLES:
            assert (variable in query.expr) != operator_only, f"{query.panel} [{query.ref_id}] and {variable}"
    for expr in dashboard_variables(dashboard).values():
        assert metric_names(expr) <= samples


def test_dashboard_configmap_is_generated_from_the_dashboard() -> None:
    text = DASHBOARD.read_text()
    assert DASHBOARD_CONFIGMAP.read_text() == render_dashboard_configmap(text), \
        "regenerate: python tests/observability/obs_harness.py"
    configmap = yaml.safe_load(DASHBOARD_CONFIGMAP.read_text())
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {DASHBOARD.name: text}


# ------------------------------------------------------------------------------------------------ rules


def test_rules_are_a_prometheus_rule_with_documented_alerts() -> None:
    document = load_rules_document()
    assert document["apiVersion"] == "monitoring.coreos.com/v1" and document["kind"] == "PrometheusRule"
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    assert {"ScorekeeperWorkerNotReady", "ScorekeeperHigh5xxRate", "ScorekeeperHighQueueWait",
            "ScorekeeperHiddenStateCopyOverhead"} <= set(names)
    for rule in alert_rules():
        split_threshold(rule["expr"])  # `<signal> <op> <number>`, so the test can evaluate the signal alone
        assert rule.get("for"), f"{rule['alert']}: a `for` keeps one bad scrape from paging"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert f"docs/observability.md#{rule['alert'].lower()}" in rule["annotations"]["description"]


def test_promtool_accepts_the_rule_groups(tmp_path: Path) -> None:
    promtool = promtool_binary()
    if promtool is None:
        pytest.skip("`promtool` is missing (apt-get install -y prometheus): the rules were NOT checked by promtool")
    rules = tmp_path / "scorekeeper.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


# ------------------------------------------------------------------------------------------------ chart and docs


@pytest.mark.parametrize("source", [DASHBOARD, RULES], ids=lambda p: p.name)
def test_chart_copies_are_identical(source: Path) -> None:
    copy = CHART_FILES / source.parent.name / source.name
    if not CHART_FILES.is_dir():
        pytest.skip("no Helm chart files in this checkout")
    assert copy.read_bytes() == source.read_bytes(), f"run: cp {source} {copy}"


def test_docs_cover_every_metric_alert_and_panel() -> None:
    docs = DOCS.read_text()
    documented_metrics = set(re.findall(r"`(scorekeeper_[a-z0-9_]+)", docs))
    exported = exported_metric_names() | operator_metric_names()
    assert not exported - documented_metrics, f"undocumented metrics: {sorted(exported - documented_metrics)}"
    samples = exported | {f"{name}{suffix}" for name in exported for suffix in ("_bucket", "_sum", "_count")}
    assert documented_metrics <= samples, f"documented but not exported: {sorted(documented_metrics - samples)}"
    headings = {line.lstrip("#").strip() for line in docs.splitlines() if line.startswith("#")}
    missing_alerts = {rule["alert"] for rule in alert_rules()} - headings
    assert not missing_alerts, f"alerts without a section (their runbook anchor): {sorted(missing_alerts)}"
    titles = {panel["title"] for panel in all_panels(load_dashboard())}
    missing_panels = {title for title in titles if title not in docs}
    assert not missing_panels, f"panels the docs do not describe: {sorted(missing_panels)}"
    for probe in ("/health", "/ready", "livenessProbe", "readinessProbe", "startupProbe"):
        assert probe in docs


@pytest.mark.parametrize("example", sorted((DASHBOARD.parents[2] / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_scraped_by_a_default_kube_prometheus_stack(example: Path) -> None:
    """Its Prometheus selects ServiceMonitors labelled with its release (docs/observability.md, What
    kube-prometheus-stack selects): the README's own hello world must reach Grafana."""
    from render_cases import render_all, sample_model  # the operator's render of a stored ScoringModel

    bodies = [doc for doc in yaml.safe_load_all(example.read_text()) if doc and doc["kind"] == "ScoringModel"]
    assert bodies
    for body in bodies:
        monitor = render_all(sample_model(body)).get("ServiceMonitor")
        assert monitor is not None, f"{example.name}: {body['metadata']['name']} renders no ServiceMonitor"
        assert monitor["metadata"]["labels"].get("release") == "kube-prometheus-stack", example.name
