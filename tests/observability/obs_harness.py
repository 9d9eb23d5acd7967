"""Helpers for the observability tests: the shipped dashboard and rules, a real Prometheus process, in-process workers,
and exact reading of the worker's /metrics text.

Also a small command: `python tests/observability/obs_harness.py` rewrites the Grafana sidecar ConfigMap
(deploy/grafana/dashboard-configmap.yaml) from the dashboard JSON; a test fails while the two disagree."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

if TYPE_CHECKING:
    from scorekeeper_worker.base.config import WorkerConfig
    from scorekeeper_worker.base.gpu_stats import GpuReader

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "scorekeeper-dashboard.json"
DASHBOARD_CONFIGMAP = ROOT / "deploy" / "grafana" / "dashboard-configmap.yaml"
RULES = ROOT / "deploy" / "prometheus" / "scorekeeper-rules.yaml"
CHART_FILES = ROOT / "charts" / "scorekeeper" / "files"
DOCS = ROOT / "docs" / "observability.md"

# What Grafana puts in for its built-in interval variables when the test evaluates a dashboard query. One minute
# covers ≥ 2 samples at the test's 1 s scrape interval; the live test widens $__rate_interval to hold its whole load
# (test_observability_prometheus.Observed.rate_interval), which takes longer than a minute on a loaded machine.
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_METRIC = re.compile(r"\bscorekeeper_[a-z0-9_]+\b")
# `<signal> <op> <number>` at the very end of an alert expression (see the rules file's header).
_THRESHOLD = re.compile(r"^(?P<signal>.*\S)\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>-?\d+(?:\.\d+)?(?:e-?\d+)?)\s*$", re.S)


# ------------------------------------------------------------------------------------------------ shipped artifacts


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref_id: str
    expr: str


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    return [PanelQuery(panel["title"], target.get("refId", ""), target["expr"])
            for panel in all_panels(dashboard) for target in panel.get("targets", [])]


def dashboard_variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """name → query for the dashboard's query variables (`label_values(...)`)."""
    found = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found[variable["name"]] = query["query"] if isinstance(query, dict) else query
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    """Resolve Grafana variables the way Grafana would before sending a query; any unknown variable is an error.
    `$1` is label_replace's first capture group, which Grafana leaves alone (no variable has a number's name)."""
    known = GRAFANA_INTERVALS | values

    def resolve(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name.isdigit():
            return match.group(0)
        if name not in known:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return known[name]

    return _VARIABLE.sub(resolve, expr)


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def load_rules_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return document


def rule_groups(document: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The `groups` a plain Prometheus loads: a PrometheusRule's spec.groups, or a rules file's groups."""
    document = document or load_rules_document()
    if document.get("kind") == "PrometheusRule":
        document = document["spec"]
    groups: list[dict[str, Any]] = document["groups"]
    return groups


def alert_rules(groups: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [rule for group in groups or rule_groups() for rule in group["rules"] if "alert" in rule]


@dataclass(frozen=True)
class Threshold:
    signal: str
    op: str
    value: float


def split_threshold(expr: str) -> Threshold:
    match = _THRESHOLD.match(expr.strip())
    if match is None:
        raise ValueError(f"alert expression is not `<signal> <op> <number>`: {expr!r}")
    return Threshold(match["signal"], match["op"], float(match["threshold"]))


def forced_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the alerts whose threshold every real value passes and with no `for`, labelled variant=forced:
    each must fire against live data, proving the whole expression (signal, comparison, labels, templates) works."""
    forced = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            split = split_threshold(rule["expr"])
            passing = "-1e12" if split.op.startswith(">") else "1e12"
            rules.append({**rule, "expr": f"{split.signal} {split.op} {passing}", "for": "0s",
                          "labels": {**rule.get("labels", {}), "variant": "forced"}})
        forced.append({"name": group["name"] + ".forced", "rules": rules})
    return forced


def immediate_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the alerts exactly as shipped but without `for`, labelled variant=immediate: what would fire once
    the `for` has passed, observable within a test."""
    return [{"name": group["name"] + ".immediate",
             "rules": [{**rule, "for": "0s", "labels": {**rule.get("labels", {}), "variant": "immediate"}}
                       for rule in group["rules"] if "alert" in rule]}
            for group in groups]


def render_dashboard_configmap(dashboard_text: str) -> str:
    """The Grafana sidecar ConfigMap (kube-prometheus-stack selects label grafana_dashboard: "1") holding the JSON."""
    body = "".join(f"    {line}\n" if line else "\n" for line in dashboard_text.rstrip("\n").split("\n"))
    return (
        "# Generated from scorekeeper-dashboard.json by `python tests/observability/obs_harness.py`; do not edit.\n"
        "# The Grafana sidecar (kube-prometheus-stack: sidecar.dashboards.enabled) loads ConfigMaps labelled\n"
        '# grafana_dashboard: "1" from the namespaces it watches: kubectl apply -n <that namespace> -f this file.\n'
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: scorekeeper-dashboard\n"
        "  labels:\n"
        '    grafana_dashboard: "1"\n'
        "    app.kubernetes.io/name: scorekeeper\n"
        "    app.kubernetes.io/component: monitoring\n"
        "  annotations:\n"
        "    # Used only when the sidecar's folderAnnotation is set to grafana_folder.\n"
        "    grafana_folder: Scorekeeper\n"
        "data:\n"
        "  scorekeeper-dashboard.json: |\n"
        f"{body}"
    )


# ------------------------------------------------------------------------------------------------ /metrics text


Sample = tuple[str, frozenset[tuple[str, str]]]


def parse_samples(text: str) -> dict[Sample, float]:
    """Exposition text → {(sample name, labels): value}, exactly as exported (no client-side renaming)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    """One sample's value; a series that was never created counts as 0 (a counter that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(url: str) -> dict[Sample, float]:
    response = httpx.get(url + "/metrics", timeout=10)
    response.raise_for_status()
    return parse_samples(response.text)


# ------------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class WorkerThread:
    """A real uvicorn server in a thread; unlike tests/conftest.RunningServer it does not insist on becoming ready,
    so a worker whose model fails to load can be scraped too. `gpu` feeds its GPU metrics (a CPU worker has none)."""

    def __init__(self, config: WorkerConfig, gpu: GpuReader | None = None) -> None:
        import uvicorn
        from scorekeeper_worker.api.server import create_app

        assert not config.gc_freeze  # in-process: gc.freeze() would freeze the test process (serving.py)
        self.port = config.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app = create_app(config)
        if gpu is not None:
            app.state.metrics.watch_gpu(gpu)
        # Where Prometheus scrapes: the metrics port when the worker has one (--metrics-port), else the API port.
        self.metrics_url = self.url if config.metrics_port is None else f"http://127.0.0.1:{config.metrics_port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, name=f"worker-{self.port}", daemon=True)
        self.thread.start()

    def wait_status(self, path: str, status: int, timeout: float = 120) -> None:
        wait_for(f"{self.url}{path} → {status}",
                 lambda: httpx.get(self.url + path, timeout=5).status_code == status, timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _die_with_parent() -> None:
    """Runs in the child before exec: Linux sends it SIGTERM when the test process dies, even if killed outright
    (e.g. by a timeout), so no Prometheus outlives its test."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class Prometheus:
    """The real `prometheus` binary on a loopback port with a temporary config and TSDB, scraping `scrape_configs`
    (operator_scrape.scrape_job: as the Prometheus Operator configures it for a ServiceMonitor)."""

    def __init__(self, binary: str, workdir: Path, scrape_configs: list[dict[str, Any]],
                 rule_files: list[Path]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            # 1 s scrapes and rule evaluations let 10-20 s of bounded load fill rate() windows and fire alerts.
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": scrape_configs,
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--storage.tsdb.path={workdir / 'data'}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self.log()}")
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200

        wait_for("prometheus /-/ready", ready, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: HTTP {response.status_code} {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the current time: its result vector (a scalar result becomes one label-less sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result if math.isfinite(float(sample["value"][1]))]


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def promtool_binary() -> str | None:
    return shutil.which("promtool")


if __name__ == "__main__":
    DASHBOARD_CONFIGMAP.write_text(render_dashboard_configmap(DASHBOARD.read_text()))
    print(f"wrote {DASHBOARD_CONFIGMAP.relative_to(ROOT)}")
