"""A real Prometheus scraping real workers exactly as the Prometheus Operator has it scrape what the operator
renders, after bounded load (`observe`; conftest.py's `observed` builds it once for the live modules,
test_observability_prometheus.py and test_observability_cluster.py).

In namespace obs-test, five ScoringModels rendered by the operator, four served by an in-process worker started from
their rendered arguments and ConfigMap (operator_scrape, cluster_models):
- `main`: a tiny Qwen3 classifier (hidden size 32, float32) taking sequential, then concurrent, single-item,
  multi-item, pooled-hidden-state, rerank, invalid and unknown-path requests; its GPU metrics come from a scripted
  reader with room to spare, and dcgm-exporter reports its pod's GPU;
- `limits`: the same model with the smallest batch/queue/body limits, so one large request deterministically fills
  the queue (429s) and a 5 kB body is refused (413); its scripted GPU is nearly full;
- `broken`: a model directory that does not exist, so the worker is never ready and answers 503 (in-process it stays
  up; the real process refuses to start);
- `failing`: the same model as `main`, whose forward passes all fail (as a CUDA error would), so it answers 500;
- `crashloop`: no model at its path, run as the real worker process, which refuses to start: its target is down, as a
  pod's is between restarts.
And the operator's own metrics behind the chart's ServiceMonitor, after reconcile passes that end in configuration
errors, API errors and a bug, with models waiting for an upgrade slot.

Needs the `prometheus` binary (Debian package `prometheus`); skipped, saying so, only when it is missing.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import obs_load
import yaml
from cluster_models import (
    GIB,
    ClusterModel,
    DcgmExporter,
    OperatorInCluster,
    ScriptedGpu,
    cluster_model,
    run_worker_process,
)
from obs_harness import (
    Prometheus,
    Sample,
    WorkerThread,
    forced_groups,
    immediate_groups,
    rule_groups,
    scrape,
    wait_for,
)
from operator_scrape import scrape_job
from scorekeeper_worker.api.termination import EXIT_LOAD_FAILED

NAMESPACE = "obs-test"
OPERATOR_NAMESPACE = "scorekeeper-system"
WAITING_UPGRADES = 2


@dataclass
class Observed:
    prometheus: Prometheus
    workers: dict[str, WorkerThread]
    models: dict[str, ClusterModel]
    operator: OperatorInCluster
    gpus: dict[str, ScriptedGpu]
    scrape_configs: list[dict[str, object]]
    hidden_size: int
    phase_a: obs_load.Sent  # sequential: one request per batch, so batch-level counters are exact too
    phase_b: obs_load.Sent  # concurrent: batches mix requests
    before: dict[Sample, float]  # main worker, after warm-up, before any test request
    after_a: dict[Sample, float]
    after: dict[Sample, float]
    limits_before: dict[Sample, float]
    limits_after: dict[Sample, float]
    rejected_429: int
    broken_503: int
    failing_500: int
    final: dict[str, dict[Sample, float]]  # every worker, after Prometheus caught up
    load_started: float  # time.monotonic() when the first test request was sent

    def rate_interval(self) -> str:
        """Grafana's $__rate_interval for evaluating panels now: long enough to hold the whole load however slowly
        the machine ran it (a fixed 1m misses the `main` worker's load when a loaded machine takes longer)."""
        return f"{math.ceil(time.monotonic() - self.load_started) + 60}s"


def _rules(workdir: Path) -> list[Path]:
    """The shipped rule groups, their `forced` copies (thresholds every value passes) and `immediate` copies (as
    shipped, without `for`)."""
    groups = rule_groups()
    files = []
    for name, variant in (("shipped", groups), ("forced", forced_groups(groups)),
                          ("immediate", immediate_groups(groups))):
        files.append(workdir / f"scorekeeper-{name}.rules.yml")
        files[-1].write_text(yaml.safe_dump({"groups": variant}, sort_keys=False))
    return files


def _send_until_counted(prometheus: Prometheus, worker: WorkerThread, job: str, code: int) -> int:
    """Three failing requests. rate() ignores the first value of a new series, so the first one creates the series
    and is scraped before more follow: then the ratios have data, as they would for a worker failing a while."""
    for i in range(3):
        assert httpx.post(worker.url + "/v1/score", json={"query": "q", "items": ["x"]},
                          timeout=10).status_code == code
        if i == 0:
            wait_for(f"the first {code} of {job} to be scraped", lambda: bool(prometheus.query(
                f'scorekeeper_requests_total{{job="{job}", route="/v1/score", code="{code}"}}')), 10)
    return 3


def _operator_passes(prometheus: Prometheus, operator: OperatorInCluster) -> None:
    """A ScoringModel stuck at ConfigValid=False (a config error every pass), API errors and a bug, and models
    waiting for an upgrade slot; the first config error is scraped before the rest (its series is new)."""
    wait_for("a first scrape of the operator", lambda: bool(prometheus.query(
        'scorekeeper_operator_reconciles_total{result="config_error"}')), 30)  # its increases count from here
    operator.reconcile("ok", "ok", "config_error")
    wait_for("the operator's first config error to be scraped", lambda: bool(prometheus.query(
        "scorekeeper_operator_config_errors_total")), 10)
    operator.reconcile("config_error", "transient_error", "error", "config_error", "error", "ok")
    operator.metrics.UPGRADES_WAITING.set(WAITING_UPGRADES)


def observe(binary: str, model: Path, workdir: Path) -> Iterator[Observed]:
    """The cluster, its load, and what Prometheus holds once it caught up; stopped when the generator closes."""
    hidden_size = json.loads((model / "config.json").read_text())["hidden_size"]
    models = {
        "main": cluster_model("main", NAMESPACE, model, workdir),
        "limits": cluster_model("limits", NAMESPACE, model, workdir, max_batch_tokens=16, max_queue_tokens=16,
                                max_request_bytes=4096),
        "broken": cluster_model("broken", NAMESPACE, workdir / "no-such-model", workdir),
        "failing": cluster_model("failing", NAMESPACE, model, workdir),
        "crashloop": cluster_model("crashloop", NAMESPACE, workdir / "no-such-model", workdir),
    }
    gpus = {"main": ScriptedGpu(memory={"allocated": 6 * GIB, "reserved": 8 * GIB, "peak": 7 * GIB,
                                        "total": 80 * GIB}, busy=0.42),
            "limits": ScriptedGpu(memory={"allocated": 70 * GIB, "reserved": 79 * GIB, "peak": 78 * GIB,
                                          "total": 80 * GIB}, busy=None)}
    workers = {name: WorkerThread(m.config, gpus.get(name)) for name, m in models.items() if name != "crashloop"}
    # The real process, as its pod runs it: refused at once (status 3), so its metrics port never answers.
    crashed = run_worker_process(models["crashloop"])
    assert crashed.returncode == EXIT_LOAD_FAILED, crashed.stderr[-3000:]
    operator = OperatorInCluster(OPERATOR_NAMESPACE)
    dcgm = DcgmExporter(models["main"], percent=37.0)
    prometheus: Prometheus | None = None
    try:
        targets = [t for m in models.values() for t in m.targets()] + operator.targets() + dcgm.targets()
        monitors = [m.manifest("ServiceMonitor") for m in models.values()]
        monitors += [operator.manifest("ServiceMonitor"), dcgm.service_monitor()]
        scrape_configs = [scrape_job(monitor, 0, targets, workdir) for monitor in monitors]
        prometheus = Prometheus(binary, workdir, scrape_configs, _rules(workdir))
        prometheus.wait_ready()
        for name in ("main", "limits", "failing"):
            workers[name].wait_status("/ready", 200)
        workers["broken"].wait_status("/health", 503)  # the load failure is recorded

        def fail_the_batch(*_: object) -> None:
            raise RuntimeError("forced failure inside the forward pass")

        workers["failing"].app.state.service.scheduler.executor.fault = fail_the_batch
        # Load starts only once every target has been scraped, so rate() sees the counters before they move.
        wait_for("a first scrape of every worker",
                 lambda: len([s for s in prometheus.query("scorekeeper_ready") if s["metric"]]) == len(workers), 30)

        main, limits = workers["main"], workers["limits"]
        before = scrape(main.metrics_url)
        load_started = time.monotonic()
        phase_a = obs_load.sequential(main)
        after_a = scrape(main.metrics_url)
        phase_b = obs_load.concurrent(main)
        after = scrape(main.metrics_url)
        limits_before = scrape(limits.metrics_url)
        body = b'{"query": "q", "items": ["' + b"x" * 5000 + b'"]}'  # over --max-request-bytes=4096
        assert httpx.post(limits.url + "/v1/score", content=body, timeout=10,
                          headers={"content-type": "application/json"}).status_code == 413
        rejected = obs_load.overflow(limits)
        limits_after = scrape(limits.metrics_url)
        broken_503 = _send_until_counted(prometheus, workers["broken"], "broken", 503)
        failing_500 = _send_until_counted(prometheus, workers["failing"], "failing", 500)
        _operator_passes(prometheus, operator)

        # Wait until Prometheus holds the final values of what the load moved (the metrics port's own scrapes are
        # not requests to the API, so nothing moves them any more).
        def caught_up() -> bool:
            for job, worker in workers.items():
                direct = sum(v for (name, _), v in scrape(worker.metrics_url).items()
                             if name == "scorekeeper_requests_total")
                seen = prometheus.query(f'sum(scorekeeper_requests_total{{job="{job}"}})')
                if not seen or float(seen[0]["value"][1]) != direct:
                    return False
            return bool(prometheus.query(f"scorekeeper_operator_image_upgrades_waiting == {WAITING_UPGRADES}"))

        wait_for("Prometheus to scrape the final counter values", caught_up, 30, interval=0.25)
        final = {job: scrape(worker.metrics_url) for job, worker in workers.items()}
        yield Observed(prometheus, workers, models, operator, gpus, scrape_configs, hidden_size, phase_a, phase_b,
                       before, after_a, after, limits_before, limits_after, rejected, broken_503, failing_500, final,
                       load_started)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for worker in workers.values():
            worker.stop()
        operator.stop()
        dcgm.stop()
