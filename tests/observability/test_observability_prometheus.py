"""A real Prometheus scrapes real workers, as the Prometheus Operator configures it for the ServiceMonitors the
operator renders, under bounded load (conftest.py `observed`); the shipped dashboard and alert rules are evaluated on
what it collected, and the worker's counters must move by exactly what the requests imply. The relabelling itself
and the operator's and GPU series: test_observability_cluster.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from obs_harness import (
    Prometheus,
    Sample,
    alert_rules,
    dashboard_queries,
    dashboard_variables,
    finite_values,
    load_dashboard,
    metric_names,
    scrape,
    split_threshold,
    substitute,
    value,
    wait_for,
)
from obs_load import OVERFLOW_REJECTIONS, Sent
from observed_cluster import Observed

pytestmark = pytest.mark.slow

FLOAT32_BYTES = 4
ALL = {"namespace": ".*", "job": ".*", "pod": ".*"}  # Grafana's "All" (the variables' allValue)


def _delta(after: dict[Sample, float], before: dict[Sample, float], name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


# ------------------------------------------------------------------------------------------------ exact counters


def test_counters_move_by_exactly_what_the_requests_imply(observed: Observed) -> None:
    before, after = observed.before, observed.after
    total = Sent()
    for part in (observed.phase_a, observed.phase_b):
        total.score_ok += part.score_ok
        total.pooled_requests += part.pooled_requests
        total.pooled_items += part.pooled_items
        total.prompt_tokens += part.prompt_tokens
        for mode in ("single_item", "multi_item"):
            total.items[mode] += part.items[mode]
            total.requests[mode] += part.requests[mode]
    a = observed.phase_a
    element = FLOAT32_BYTES
    expected = {
        # Hidden-state copy: bytes = items × hidden size × element size (float32 model).
        ("scorekeeper_hidden_state_copy_bytes_total", ()): total.pooled_items * observed.hidden_size * element,
        ("scorekeeper_hidden_state_copy_vectors_total", ()): total.pooled_items,
        ("scorekeeper_hidden_state_requests_total", ()): total.pooled_requests,
        ("scorekeeper_items_scored_total", (("mode", "single_item"),)): total.items["single_item"],
        ("scorekeeper_items_scored_total", (("mode", "multi_item"),)): total.items["multi_item"],
        ("scorekeeper_score_requests_total", (("mode", "single_item"),)): total.requests["single_item"],
        ("scorekeeper_score_requests_total", (("mode", "multi_item"),)): total.requests["multi_item"],
        ("scorekeeper_prompt_tokens_total", ()): total.prompt_tokens,
        ("scorekeeper_requests_total", (("route", "/v1/score"), ("code", "200"))): total.score_ok,
        ("scorekeeper_requests_total", (("route", "/v1/rerank"), ("code", "200"))): a.rerank_ok,
        ("scorekeeper_requests_total", (("route", "/v1/score"), ("code", "400"))): a.bad,
        # Unknown paths share one label value, so scanners cannot create unbounded series.
        ("scorekeeper_requests_total", (("route", "other"), ("code", "404"))): a.unknown_path,
        ("scorekeeper_stage_duration_seconds_count", (("stage", "tokenize"),)): total.requests["single_item"]
        + total.requests["multi_item"],
        ("scorekeeper_stage_duration_seconds_count", (("stage", "queue"),)): total.requests["single_item"]
        + total.requests["multi_item"],
        ("scorekeeper_stage_duration_seconds_count", (("stage", "serialize"),)): total.score_ok,
        ("scorekeeper_stage_duration_seconds_count", (("stage", "end_to_end"),)): total.score_ok + a.rerank_ok
        + a.bad,
        ("scorekeeper_padding_tokens_total", ()): 0,  # packed eager batches never pad
        ("scorekeeper_rejected_requests_total", (("reason", "queue_full"),)): 0,
        ("scorekeeper_rejected_requests_total", (("reason", "body_too_large"),)): 0,
    }
    actual = {key: _delta(after, before, key[0], **dict(key[1])) for key in expected}
    assert actual == {key: float(v) for key, v in expected.items()}
    assert total.pooled_items > 0 and total.items["multi_item"] > 0  # the load exercised both
    # The copy is real work even on CPU (tensor → Python floats), so its time is never a constant.
    assert _delta(after, before, "scorekeeper_hidden_state_copy_seconds_sum") > 0
    for gauge in ("scorekeeper_inflight_requests", "scorekeeper_queue_depth", "scorekeeper_queue_tokens"):
        assert value(after, gauge) == 0, f"{gauge} must return to 0 at rest"


def test_sequential_requests_give_exact_batch_counters(observed: Observed) -> None:
    """Phase A sent one request at a time, each small enough for one batch: one batch per scored request."""
    a, before, after = observed.phase_a, observed.before, observed.after_a
    batches = a.scored
    expected = {
        "scorekeeper_batch_requests_count": batches,
        "scorekeeper_batch_requests_sum": batches,
        "scorekeeper_batch_sequences_sum": a.sequences,
        "scorekeeper_batch_tokens_sum": a.prompt_tokens,  # packed: the model ran exactly the prompt tokens
        "scorekeeper_hidden_state_copy_seconds_count": a.pooled_requests,  # one copy per batch with pooled rows
        "scorekeeper_model_thread_cpu_share_count": batches,  # every CPU forward's on-CPU share
    }
    actual = {name: _delta(after, before, name) for name in expected}
    assert 0 < _delta(after, before, "scorekeeper_model_thread_cpu_share_sum") <= batches  # shares are in (0, 1]
    actual |= {f"{stage} count": _delta(after, before, "scorekeeper_stage_duration_seconds_count", stage=stage)
               for stage in ("forward", "scoring")}
    actual["eager runs"] = _delta(after, before, "scorekeeper_cuda_graph_runs_total", path="eager", bucket="none")
    expected_all = {**{k: float(v) for k, v in expected.items()}, "forward count": float(batches),
                    "scoring count": float(batches), "eager runs": float(batches)}
    assert actual == expected_all


def test_rejections_are_counted_exactly(observed: Observed) -> None:
    before, after = observed.limits_before, observed.limits_after
    assert observed.rejected_429 == OVERFLOW_REJECTIONS
    assert _delta(after, before, "scorekeeper_rejected_requests_total", reason="queue_full") == observed.rejected_429
    assert _delta(after, before, "scorekeeper_requests_total", route="/v1/score", code="429") \
        == observed.rejected_429
    assert _delta(after, before, "scorekeeper_rejected_requests_total", reason="body_too_large") == 1
    assert _delta(after, before, "scorekeeper_requests_total", route="/v1/score", code="413") == 1
    assert value(after, "scorekeeper_max_queue_tokens") == 16
    assert value(after, "scorekeeper_max_batch_tokens") == 16


def test_start_up_and_readiness_metrics(observed: Observed) -> None:
    main, broken = observed.final["main"], observed.final["broken"]
    assert value(main, "scorekeeper_ready") == 1
    assert value(main, "scorekeeper_model_load_seconds") > 0
    assert value(main, "scorekeeper_warmup_seconds") > 0
    # The operator passes the ScoringModel's name as --served-name.
    assert value(main, "scorekeeper_model_info", model="main", kind="classifier", dtype="float32",
                 device="cpu") == 1
    assert any(name == "scorekeeper_build_info" for name, _ in main)
    # A worker whose model failed to load is never ready, and refuses work with 503.
    assert value(broken, "scorekeeper_ready") == 0
    assert value(broken, "scorekeeper_requests_total", route="/v1/score", code="503") == observed.broken_503


def test_prometheus_holds_the_worker_values(observed: Observed) -> None:
    """What Prometheus scraped equals what the worker exports (the pipeline adds or loses nothing)."""
    final = observed.final["main"]
    for name, labels in [("scorekeeper_hidden_state_copy_bytes_total", {}), ("scorekeeper_prompt_tokens_total", {}),
                         ("scorekeeper_items_scored_total", {"mode": "single_item"}),
                         ("scorekeeper_items_scored_total", {"mode": "multi_item"})]:
        selector = ", ".join(['job="main"', *(f'{k}="{v}"' for k, v in labels.items())])
        result = observed.prometheus.query(f"{name}{{{selector}}}")
        assert [float(s["value"][1]) for s in result] == [value(final, name, **labels)], name
    targets = observed.prometheus.api("targets")["activeTargets"]
    assert sorted((t["labels"]["job"], t["health"]) for t in targets) == [
        ("broken", "up"), ("crashloop", "down"), ("dcgm-exporter", "up"), ("failing", "up"), ("limits", "up"),
        ("main", "up"), ("scorekeeper-metrics", "up")]  # the workers, the operator (the chart's Service), dcgm


# ------------------------------------------------------------------------------------------------ dashboard


@pytest.mark.parametrize("selection", ["all", "main"])
def test_every_dashboard_query_returns_data(observed: Observed, selection: str) -> None:
    """Every panel query, with Grafana's variables resolved, returns at least one finite value: for all workers,
    and for the healthy `main` worker alone (panels must not depend on another worker's errors to show data)."""
    values = {**ALL, "__rate_interval": observed.rate_interval()} | ({} if selection == "all" else {"job": "main"})
    empty = []
    queries = dashboard_queries(load_dashboard())
    assert len(queries) >= 30
    for query in queries:
        expr = substitute(query.expr, values)
        result = observed.prometheus.query(expr)
        if not finite_values(result):
            empty.append(f"{query.panel} [{query.ref_id}]: {expr} → {result}")
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_dashboard_metric_is_exported(observed: Observed) -> None:
    exported = {name for samples in observed.final.values() for name, _ in samples}
    exported |= {name for name, _ in scrape(f"http://127.0.0.1:{observed.operator.port}")}
    named = {name for query in dashboard_queries(load_dashboard()) for name in metric_names(query.expr)}
    named |= {name for expr in dashboard_variables(load_dashboard()).values() for name in metric_names(expr)}
    assert named, "the dashboard names no scorekeeper metric"
    assert named <= exported, f"named by the dashboard but not exported: {sorted(named - exported)}"


def test_dashboard_variables_resolve(observed: Observed) -> None:
    """label_values(metric{selector}, label) is Grafana's; the series API answers the same question."""

    for name, query in dashboard_variables(load_dashboard()).items():
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"${name}: unsupported variable query {query!r}"
        series = observed.prometheus.api("series", **{"match[]": substitute(match[1], ALL)})
        found = {s[match[2]] for s in series if match[2] in s}
        assert found, f"${name}: {query} found no values"
    jobs = {s["job"] for s in observed.prometheus.api("series", **{"match[]": "scorekeeper_build_info"})}
    assert jobs == {"main", "limits", "broken", "failing"}


# ------------------------------------------------------------------------------------------------ alert rules


def test_every_alert_signal_returns_data(observed: Observed) -> None:
    """The part before the threshold is what the alert watches: it must evaluate to real values on live data."""
    empty = []
    for rule in alert_rules():
        split = split_threshold(rule["expr"])
        if not finite_values(observed.prometheus.query(split.signal)):
            empty.append(f"{rule['alert']}: {split.signal}")
        observed.prometheus.query(rule["expr"])  # the full expression is valid PromQL (firing or not)
    assert not empty, "alert signals without data:\n" + "\n".join(empty)


def _alerts(prometheus: Prometheus) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = prometheus.api("alerts")["alerts"]
    return alerts


def test_rules_load_and_evaluate_cleanly(observed: Observed) -> None:
    groups = observed.prometheus.api("rules")["groups"]
    names = {rule["name"] for group in groups for rule in group["rules"]}
    assert {rule["alert"] for rule in alert_rules()} <= names
    unhealthy = [(rule["name"], rule.get("lastError")) for group in groups for rule in group["rules"]
                 if rule["health"] != "ok"]
    assert not unhealthy


def test_forced_alerts_fire_on_live_data(observed: Observed) -> None:
    """With thresholds every value passes and no `for`, every alert fires: expression, labels and annotation
    templates all work end to end (a NaN or empty signal would never fire)."""
    wanted = {rule["alert"] for rule in alert_rules()}

    def firing() -> set[str]:
        return {a["labels"]["alertname"] for a in _alerts(observed.prometheus)
                if a["labels"].get("variant") == "forced" and a["state"] == "firing"}

    try:
        wait_for("every forced alert to fire", lambda: firing() >= wanted, 20, interval=0.5)
    except TimeoutError:
        pytest.fail(f"never fired: {sorted(wanted - firing())}")
    for alert in _alerts(observed.prometheus):
        assert alert["labels"].get("severity") in ("warning", "critical")
        assert "{{" not in alert["annotations"]["summary"], alert["annotations"]["summary"]


def test_real_thresholds_catch_the_unhealthy_workers_only(observed: Observed) -> None:
    """With the shipped thresholds: the broken worker trips not-ready and 5xx, the overloaded one trips 429
    rejections and (its GPU nearly full) GPU memory, the failing one 5xx, the one that exits crash-looping, the
    operator its three alerts, and the healthy `main` worker trips nothing (pending, since every alert has a
    `for`)."""
    operator = {("scorekeeper-metrics", f"ScorekeeperOperator{name}")
                for name in ("ConfigErrors", "ReconcileFailures", "UpgradesWaiting")}
    expected = {("broken", "ScorekeeperWorkerNotReady"), ("broken", "ScorekeeperHigh5xxRate"),
                ("limits", "ScorekeeperQueueFullRejections"), ("limits", "ScorekeeperGpuMemoryNearlyFull"),
                ("failing", "ScorekeeperHigh5xxRate"), ("crashloop", "ScorekeeperWorkerCrashLooping"), *operator}

    def active() -> set[tuple[str, str]]:
        return {(a["labels"]["job"], a["labels"]["alertname"]) for a in _alerts(observed.prometheus)
                if "variant" not in a["labels"]}

    try:
        wait_for("the real alerts to go pending", lambda: active() >= expected, 20, interval=0.5)
    except TimeoutError:
        pytest.fail(f"active: {sorted(active())}, expected at least {sorted(expected)}")
    # The healthy worker's requests queue only behind each other; on a machine loaded by other work that wait can
    # pass 1 s, and then the queue-wait alert is right to go pending. Any other alert on it is a false alarm.
    justified = {"ScorekeeperHighQueueWait"} if _queue_wait_p99_over_1s(observed.final["main"]) else set()
    assert not {alert for job, alert in active() if job == "main"} - justified, sorted(active())


def _queue_wait_p99_over_1s(samples: dict[Sample, float]) -> bool:
    """histogram_quantile(0.99, queue wait) > 1 s, as the alert computes it, over all of the worker's requests."""
    total = value(samples, "scorekeeper_stage_duration_seconds_bucket", stage="queue", le="+Inf")
    within = value(samples, "scorekeeper_stage_duration_seconds_bucket", stage="queue", le="1.0")
    return within < 0.99 * total


def test_internal_errors_are_counted_and_fire_the_5xx_alert(observed: Observed) -> None:
    """A 500 is counted in scorekeeper_requests_total like any answer, so ScorekeeperHigh5xxRate, as shipped (its
    `for` aside), fires for the failing worker; and Prometheus scraped that worker on its metrics port."""
    failing = observed.final["failing"]
    assert value(failing, "scorekeeper_requests_total", route="/v1/score", code="500") == observed.failing_500
    assert value(failing, "scorekeeper_ready") == 1  # a failing forward pass does not make the worker unready

    def firing() -> set[str]:
        return {a["labels"]["job"] for a in _alerts(observed.prometheus)
                if a["labels"]["alertname"] == "ScorekeeperHigh5xxRate" and a["state"] == "firing"
                and a["labels"].get("variant") == "immediate"}

    try:
        wait_for("ScorekeeperHigh5xxRate to fire for the failing worker", lambda: "failing" in firing(), 20,
                 interval=0.5)
    except TimeoutError:
        pytest.fail(f"ScorekeeperHigh5xxRate fired for {sorted(firing())} only")
    assert "main" not in firing()
