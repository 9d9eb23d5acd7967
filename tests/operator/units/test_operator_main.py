"""`scorekeeper-operator` as shipped: kopf options from the env, and the real console script serving /healthz and its
Prometheus /metrics."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from harness import NAMESPACE, Cluster, scoring_model
from prometheus_client.parser import text_string_to_metric_families
from scorekeeper_operator.main import NO_CLUSTER_EXIT_STATUS, run_options
from scorekeeper_operator.spec.settings import DEFAULT_LIVENESS_ENDPOINT, OperatorSettings


def test_all_namespaces_by_default_with_liveness_and_standalone() -> None:
    options = run_options(OperatorSettings.from_env({}))
    assert options == {"clusterwide": True, "namespaces": [], "liveness_endpoint": DEFAULT_LIVENESS_ENDPOINT,
                       "standalone": True}
    assert DEFAULT_LIVENESS_ENDPOINT == "http://0.0.0.0:8080/healthz"


def test_namespaces_from_the_environment() -> None:
    options = run_options(OperatorSettings.from_env({"SCOREKEEPER_NAMESPACE": "ml,search"}))
    assert (options["clusterwide"], options["namespaces"]) == (False, ["ml", "search"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("scorekeeper-operator")
    found = str(script) if script.exists() else shutil.which("scorekeeper-operator")
    return [found] if found else [sys.executable, "-m", "scorekeeper_operator.main"]


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_console_script_runs_kopf_with_liveness_and_metrics_endpoints(cluster: Cluster, tmp_path: Path) -> None:
    port, metrics_port = _free_port(), _free_port()
    env = {**os.environ, "SCOREKEEPER_LIVENESS_ENDPOINT": f"http://127.0.0.1:{port}/healthz",
           "SCOREKEEPER_METRICS_PORT": str(metrics_port)}
    log = tmp_path / "operator.log"
    with log.open("wb") as output:  # a file, not a pipe: a full pipe would block the operator
        process = subprocess.Popen(_console_script(), env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):  # the import of kopf + kubernetes takes a few seconds on a small CI box
                assert process.poll() is None, log.read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                        if response.status == 200:
                            assert "reconciler" in await response.json()  # our @kopf.on.probe
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("no /healthz")
        await cluster.create("scoringmodels", NAMESPACE, scoring_model())
        await cluster.wait_for(lambda: cluster.get("deployments", NAMESPACE, "reranker"), what="deployment")
        await cluster.create("scoringmodels", NAMESPACE, scoring_model("broken", extraArgs=["--served", "x"]))
        expected = {("scorekeeper_operator_reconciles_total", (("result", "ok"),)): 1,
                    ("scorekeeper_operator_reconciles_total", (("result", "config_error"),)): 1,
                    ("scorekeeper_operator_config_errors_total", (("reason", "InvalidSpec"),)): 1,
                    ("scorekeeper_operator_reconcile_duration_seconds_count", ()): 2}
        samples = await _scrape_until(metrics_port, lambda s: all(s.get(k, 0) >= v for k, v in expected.items()))
        assert ("process_resident_memory_bytes", ()) in samples  # the default collectors
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 20)
    assert process.returncode == 0, log.read_text()


def test_without_a_cluster_the_console_script_exits_with_one_clear_line(tmp_path: Path) -> None:
    """Outside a pod and with no kubeconfig, kopf would retry its login forever, a traceback a minute."""
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env.update(KUBECONFIG=str(tmp_path / "absent"), HOME=str(tmp_path))
    done = subprocess.run(_console_script(), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == NO_CLUSTER_EXIT_STATUS, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "not in a pod (KUBERNETES_SERVICE_HOST is unset)" in done.stderr
    assert f"KUBECONFIG={tmp_path / 'absent'}" in done.stderr


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape_until(port: int, done: Callable[[Samples], bool]) -> Samples:
    """GET /metrics until `done` holds (reconciles run asynchronously to the test's writes)."""
    samples: Samples = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                text = await response.text()
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples}
            if done(samples):
                return samples
            await asyncio.sleep(0.1)
    raise AssertionError(f"the operator's metrics never showed it: {samples}")
