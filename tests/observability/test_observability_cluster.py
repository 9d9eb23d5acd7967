"""What the Prometheus Operator's relabelling does to the workers' series, and the operator's and the GPU's alerts,
on the live cluster of observed_cluster.py (built once by conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from obs_harness import Prometheus, finite_values, load_dashboard, substitute, wait_for
from observed_cluster import NAMESPACE, Observed

pytestmark = pytest.mark.slow

WORKERS = ("main", "limits", "broken", "failing", "crashloop")


def _firing(prometheus: Prometheus, variant: str) -> set[tuple[str, str]]:
    alerts: list[dict[str, Any]] = prometheus.api("alerts")["alerts"]
    return {(a["labels"]["alertname"], a["labels"].get("job", "")) for a in alerts
            if a["labels"].get("variant") == variant and a["state"] == "firing"}


def test_each_worker_is_one_target_labelled_as_the_operator_labels_it(observed: Observed) -> None:
    """The Service's `http` port is discovered too and dropped by the endpoint's port; the `metrics` port's target
    gets the Operator's target labels, from the rendered Service, pod and container."""
    active = observed.prometheus.api("targets", state="active")["activeTargets"]
    for name in WORKERS:
        model = observed.models[name]
        (target,) = [t for t in active if t["labels"].get("service") == name]
        assert target["labels"] == {
            "namespace": NAMESPACE, "service": name, "job": name, "pod": model.pod, "container": "worker",
            "endpoint": "metrics", "instance": f"127.0.0.1:{model.config.metrics_port}",
            "app_kubernetes_io_name": "scorekeeper-worker"}  # the ServiceMonitor's targetLabels
        assert target["scrapeUrl"] == f"http://127.0.0.1:{model.config.metrics_port}/metrics"
        assert target["health"] == ("down" if name == "crashloop" else "up")


def test_the_workers_own_labels_survive_the_relabelling(observed: Observed) -> None:
    """With honor_labels as the rendered ServiceMonitor leaves it (false), a worker label that a target label also
    names would be renamed `exported_<label>` and every query on it would come back empty."""
    series = observed.prometheus.api("series", **{"match[]": '{__name__=~"scorekeeper_.+"}'})
    renamed = sorted({label for s in series for label in s if label.startswith("exported_")})
    assert renamed == []
    target_labels = {rule["target_label"] for job in observed.scrape_configs for rule in job["relabel_configs"]
                     if "target_label" in rule and not rule["target_label"].startswith("__")}
    worker_labels = {label for samples in observed.final.values() for _, labels in samples for label, _ in labels}
    assert target_labels >= {"namespace", "service", "pod", "container", "job", "endpoint"}
    assert not worker_labels & (target_labels | {"instance"})


def test_requests_by_route_show_the_worker_s_routes(observed: Observed) -> None:
    """The dashboard's 'Requests by route and status code' panel: the worker's routes and codes, not the port."""
    (panel,) = [p for p in _panels() if p["title"] == "Requests by route and status code"]
    expr = substitute(panel["targets"][0]["expr"], {"namespace": ".*", "job": "main", "pod": ".*",
                                                     "__rate_interval": observed.rate_interval()})
    shown = {(s["metric"]["route"], s["metric"]["code"]) for s in observed.prometheus.query(expr)}
    assert {("/v1/score", "200"), ("/v1/score", "400"), ("/v1/rerank", "200"), ("other", "404")} <= shown


def _panels() -> list[dict[str, Any]]:
    return [p for row in load_dashboard()["panels"] for p in [row, *row.get("panels", [])]]


def test_dcgm_exporter_series_join_the_worker_pod(observed: Observed) -> None:
    """dcgm-exporter's utilisation of the GPU the `main` pod uses, found through the pod it names."""
    (panel,) = [p for p in _panels() if p["title"] == "GPU utilisation"]
    (dcgm,) = [t["expr"] for t in panel["targets"] if "DCGM_FI_DEV_GPU_UTIL" in t["expr"]]
    result = observed.prometheus.query(substitute(dcgm, {"namespace": ".*", "job": "main", "pod": ".*"}))
    assert [(s["metric"]["pod"], float(s["value"][1])) for s in result] == [(observed.models["main"].pod, 0.37)]


def test_operator_alerts_fire_for_config_errors_reconcile_failures_and_waiting_upgrades(observed: Observed) -> None:
    wanted = {(name, "scorekeeper-metrics") for name in ("ScorekeeperOperatorConfigErrors",
                                                         "ScorekeeperOperatorReconcileFailures",
                                                         "ScorekeeperOperatorUpgradesWaiting")}
    try:
        wait_for("the operator's alerts to fire", lambda: _firing(observed.prometheus, "immediate") >= wanted, 20,
                 interval=0.5)
    except TimeoutError:
        pytest.fail(f"firing: {sorted(_firing(observed.prometheus, 'immediate'))}")


def test_gpu_memory_alert_fires_for_the_nearly_full_gpu_only(observed: Observed) -> None:
    try:
        wait_for("ScorekeeperGpuMemoryNearlyFull for `limits`", lambda: (
            "ScorekeeperGpuMemoryNearlyFull", "limits") in _firing(observed.prometheus, "immediate"), 20, interval=0.5)
    except TimeoutError:
        pytest.fail(f"firing: {sorted(_firing(observed.prometheus, 'immediate'))}")
    assert ("ScorekeeperGpuMemoryNearlyFull", "main") not in _firing(observed.prometheus, "immediate")
    values = finite_values(observed.prometheus.query('scorekeeper_gpu_memory_reserved_bytes{job="main"}'))
    assert values == [observed.gpus["main"].memory["reserved"]]


def test_the_pod_variable_lists_pods(observed: Observed) -> None:
    """label_values(scorekeeper_build_info{...}, pod): the workers' pod names, not the scrape address IP:9090."""
    query = next(v["query"]["query"] for v in load_dashboard()["templating"]["list"] if v["name"] == "pod")
    selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
    series = observed.prometheus.api("series", **{"match[]": substitute(selector, {"namespace": ".*", "job": ".*"})})
    assert {s["pod"] for s in series} == {observed.models[name].pod for name in observed.workers}
