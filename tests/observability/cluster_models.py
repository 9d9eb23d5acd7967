"""The pieces of a cluster the observability tests stand in for, each from what this repository ships:

- `ClusterModel`: a ScoringModel rendered by the operator (Service, Deployment, ServiceMonitor, worker arguments)
  and the worker configuration its pod would run: the rendered arguments and the rendered ConfigMap, parsed by the
  worker's own command line, with loopback ports (the operator's 9090 may be Prometheus's own) and a local model;
- `OperatorInCluster`: the operator's own metrics (its registry, fed through its reconcile instrumentation) behind the
  Service and ServiceMonitor the Helm chart renders;
- `DcgmExporter`: dcgm-exporter's GPU utilisation series for a worker pod, labelled as it labels them in a cluster
  (the one stand-in written by hand: dcgm-exporter needs a GPU).

Each gives `discover`'s targets and a ServiceMonitor for operator_scrape.scrape_job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from obs_harness import free_port
from operator_scrape import TargetGroup, discover
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, start_http_server
from scorekeeper_operator.render.manifests import Rendered, render
from scorekeeper_operator.spec import worker_contract
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings
from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.cli import parse_config

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_INTERVAL = "1s"  # set in the ScoringModel and the chart values: 10-20 s of load fill rate() windows
GIB = 1 << 30
RELEASE_LABELS = {"release": "kube-prometheus-stack"}  # what a default kube-prometheus-stack selects


@dataclass
class ClusterModel:
    name: str
    rendered: Rendered
    config: WorkerConfig
    pod: str

    @property
    def pod_template(self) -> dict[str, Any]:
        deployment = self.rendered.get("Deployment")
        assert deployment is not None
        template: dict[str, Any] = deployment["spec"]["template"]
        return template

    def manifest(self, kind: str) -> dict[str, Any]:
        found = self.rendered.get(kind)
        assert found is not None, f"{self.name}: the operator rendered no {kind}"
        return found

    def targets(self) -> list[TargetGroup]:
        """The Service's targets: its `http` and `metrics` ports at the worker's loopback ports."""
        addresses = {"http": f"127.0.0.1:{self.config.port}", "metrics": f"127.0.0.1:{self.config.metrics_port}"}
        return discover(self.manifest("Service"), self.pod_template, {self.pod: addresses})


def run_worker_process(model: ClusterModel, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real `scorekeeper-worker` with the pod's arguments (its ConfigMap's file for --config), on this machine's
    loopback ports, run to its end: what a pod's container does before Kubernetes restarts it."""
    config_file = model.config.termination_log.with_name(f"{model.name}-{worker_contract.CONFIG_FILE}")
    args = [str(config_file) if arg == worker_contract.CONFIG_PATH else arg for arg in model.rendered.worker_args]
    local = ["--host", model.config.host, "--port", str(model.config.port), "--metrics-port",
             str(model.config.metrics_port), "--termination-log", str(model.config.termination_log)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOREKEEPER_")}
    return subprocess.run([sys.executable, "-m", "scorekeeper_worker.cli", *args, *local], capture_output=True,
                          text=True, timeout=timeout, env=env)


def cluster_model(name: str, namespace: str, model: Path, workdir: Path, **overrides: Any) -> ClusterModel:
    """ScoringModel `name` (its model at `model`), rendered; its worker's configuration as its pod would parse it,
    then `overrides` (limits a test needs) and the loopback ports and paths of this machine."""
    body = {"apiVersion": "scorekeeper.dev/v1alpha1", "kind": "ScoringModel",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
            "spec": {"model": {"uri": f"file://{model}"},
                     "monitoring": {"interval": SCRAPE_INTERVAL, "labels": RELEASE_LABELS}}}
    rendered = render(ScoringModel.from_body(body), OperatorSettings(), service_monitor_api=True)
    configmap = rendered.get("ConfigMap")
    assert configmap is not None
    config_file = workdir / f"{name}-{worker_contract.CONFIG_FILE}"
    config_file.write_text(configmap["data"][worker_contract.CONFIG_FILE])
    args = [str(config_file) if arg == worker_contract.CONFIG_PATH else arg for arg in rendered.worker_args]
    config = parse_config(args, environ={})
    assert config.metrics_port == worker_contract.METRICS_PORT and config.host == "0.0.0.0"  # as rendered
    local = {"host": "127.0.0.1", "port": free_port(), "metrics_port": free_port(), "gc_freeze": False,
             "termination_log": workdir / f"{name}-termination-log"}
    config = WorkerConfig.model_validate(config.model_dump() | local | overrides)
    return ClusterModel(name, rendered, config, pod=f"{name}-{rendered.config_hash[:10]}-x{len(name)}z")


@functools.cache
def _chart_manifests(namespace: str) -> tuple[dict[str, Any], ...]:
    import helm_python

    values = {"serviceMonitor": {"enabled": True, "interval": SCRAPE_INTERVAL, "scrapeTimeout": SCRAPE_INTERVAL,
                                 "labels": RELEASE_LABELS}}
    templates = helm_python.Chart.load(ROOT / "charts" / "scorekeeper").render(values, name="scorekeeper",
                                                                                namespace=namespace)
    return tuple(doc for name, text in sorted(templates.items()) if name.endswith(".yaml")
                 for doc in yaml.safe_load_all(text) if doc)


@dataclass
class OperatorInCluster:
    """The operator's /metrics (the process-wide registry its module fills) on a loopback port, and the chart's
    Service and ServiceMonitor for it."""

    namespace: str
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        from scorekeeper_operator import metrics  # registers the operator's metrics in REGISTRY

        self.metrics = metrics
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=REGISTRY)

    def manifest(self, kind: str) -> dict[str, Any]:
        (found,) = [m for m in _chart_manifests(self.namespace) if m["kind"] == kind
                    and (kind != "Service" or m["metadata"]["name"].endswith("-metrics"))]
        return found

    def targets(self) -> list[TargetGroup]:
        template = self.manifest("Deployment")["spec"]["template"]
        pod = f"{self.manifest('Deployment')['metadata']['name']}-6c9f7d8b5d-q2w4e"
        return discover(self.manifest("Service"), template, {pod: {"metrics": f"127.0.0.1:{self.port}"}})

    def reconcile(self, *outcomes: str) -> None:
        """Reconcile passes through the operator's own instrumentation, ending as `outcomes` say: ok, config_error
        (a ScoringModel the operator cannot render), transient_error (the API answered 5xx), error (a bug)."""
        from scorekeeper_operator.k8s import TransientApiError
        from scorekeeper_operator.status.compute import ConfigError

        @self.metrics.instrumented
        async def one_pass(_: object, outcome: str) -> ConfigError | None:
            if outcome == "config_error":
                return ConfigError("InvalidSpec", "spec.scoring.maxBatchTokens: below the model's longest input")
            if outcome == "transient_error":
                raise TransientApiError(503, "ServiceUnavailable", "the API server is restarting")
            if outcome == "error":
                raise KeyError("status")
            return None

        async def run() -> None:
            for outcome in outcomes:
                with contextlib.suppress(TransientApiError, KeyError):  # what kopf would retry
                    await one_pass(None, outcome)

        asyncio.run(run())

    def stop(self) -> None:
        self.metrics.UPGRADES_WAITING.set(0)  # the process-wide registry outlives this test
        self.server.shutdown()
        self.server.server_close()


@dataclass
class ScriptedGpu:
    """A reader whose next values the test sets; counts its reads to show each scrape reads afresh."""

    device: str = "cuda:0"
    memory: dict[str, float] = field(default_factory=lambda: {"allocated": 0.0, "reserved": 0.0, "peak": 0.0,
                                                               "total": 80.0 * GIB})
    busy: float | None = 0.5  # None: NVML does not answer
    reads: int = 0

    def allocated(self) -> float:
        self.reads += 1
        return self.memory["allocated"]

    def reserved(self) -> float:
        return self.memory["reserved"]

    def peak(self) -> float:
        return self.memory["peak"]

    def total(self) -> float:
        return self.memory["total"]

    def utilization(self) -> float:
        assert self.busy is not None
        return self.busy

    def has_utilization(self) -> bool:
        return self.busy is not None


class DcgmExporter:
    """DCGM_FI_DEV_GPU_UTIL (percent) for one GPU used by a worker pod, as dcgm-exporter's Kubernetes mode labels it
    (gpu, UUID, device, modelName, Hostname, and the pod using it as namespace/pod/container); scraped through a
    ServiceMonitor with honorLabels false (the dcgm-exporter chart's default), so Prometheus renames the pod's
    labels to exported_namespace/exported_pod/exported_container."""

    NAMESPACE = "gpu-operator"

    def __init__(self, worker: ClusterModel, percent: float) -> None:
        self.registry = CollectorRegistry()
        util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", ["gpu", "UUID", "device", "modelName",
                     "Hostname", "container", "namespace", "pod"], registry=self.registry)
        container = worker.pod_template["spec"]["containers"][0]["name"]
        util.labels("0", "GPU-5fd4c2a1-0c1e-4b7e-9a51-2f0a3b8c9d10", "nvidia0", "NVIDIA H100 80GB HBM3", "gpu-node-1",
                    container, worker.manifest("Service")["metadata"]["namespace"], worker.pod).set(percent)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def service_monitor(self) -> dict[str, Any]:
        selector = {"app.kubernetes.io/name": "dcgm-exporter"}
        return {"metadata": {"name": "dcgm-exporter", "namespace": self.NAMESPACE},
                "spec": {"selector": {"matchLabels": selector}, "endpoints": [{"port": "metrics", "path": "/metrics",
                                                                                "interval": SCRAPE_INTERVAL}]}}

    def targets(self) -> list[TargetGroup]:
        labels = {"app.kubernetes.io/name": "dcgm-exporter"}
        service = {"metadata": {"name": "dcgm-exporter", "namespace": self.NAMESPACE, "labels": labels},
                   "spec": {"ports": [{"name": "metrics", "port": 9400, "targetPort": "metrics"}]}}
        template = {"metadata": {"labels": labels}, "spec": {"containers": [
            {"name": "exporter", "ports": [{"name": "metrics", "containerPort": 9400}]}]}}
        return discover(service, template, {"dcgm-exporter-7xk2p": {"metrics": f"127.0.0.1:{self.port}"}})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

