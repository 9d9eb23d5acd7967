"""The images under test (named by scripts/images.sh), and the pods the cluster would run them in: the operator's pod
as the chart renders it, and the hello world's worker pod as that operator renders it from the chart's settings."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from pod_container import PodContainer
from scorekeeper_operator.render.manifests import render
from scorekeeper_operator.spec.model import ScoringModel
from scorekeeper_operator.spec.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[3]
HELLO_WORLD = REPO / "examples" / "hello-world-cpu.yaml"


def image_under_test(kind: str) -> str:
    name = os.environ.get(f"SCOREKEEPER_SMOKE_{kind.upper()}_IMAGE")
    assert name, f"SCOREKEEPER_SMOKE_{kind.upper()}_IMAGE is unset: run these tests through `scripts/images.sh smoke`"
    return name


def _repository_and_tag(image: str) -> dict[str, str]:
    repository, _, tag = image.rpartition(":")
    return {"repository": repository, "tag": tag}


@pytest.fixture(scope="session")
def operator_pod() -> dict[str, Any]:
    """The operator's pod spec from the chart, installed with the images under test."""
    values = {"image": _repository_and_tag(image_under_test("operator")),
              "workerImage": _repository_and_tag(image_under_test("worker"))}
    templates = helm_python.Chart.load(REPO / "charts" / "scorekeeper").render(values, name="scorekeeper",
                                                                               namespace="scorekeeper-system")
    documents = [doc for name, text in templates.items() if name.endswith(".yaml") for doc in yaml.safe_load_all(text)]
    (deployment,) = [doc for doc in documents if doc and doc["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


@pytest.fixture(scope="session")
def hello_world() -> dict[str, Any]:
    body: dict[str, Any] = next(doc for doc in yaml.safe_load_all(HELLO_WORLD.read_text())
                                if doc and doc["kind"] == "ScoringModel")
    return body


@pytest.fixture(scope="session")
def worker_manifests(operator_pod: dict[str, Any], hello_world: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The hello world's children as the operator renders them, with the settings the chart gives it."""
    env = {var["name"]: var["value"] for var in operator_pod["containers"][0]["env"] if "value" in var}
    body = {**hello_world, "metadata": {**hello_world["metadata"], "uid": "smoke", "generation": 1}}
    rendered = render(ScoringModel.from_body(body), OperatorSettings.from_env(env), service_monitor_api=False)
    return {manifest["kind"]: manifest for manifest in rendered.manifests}


def wait_until_started(container: PodContainer) -> None:
    """Poll the startup probe, for at most what the kubelet allows it (period x failureThreshold)."""
    probe = container.container["startupProbe"]
    deadline = time.monotonic() + probe["periodSeconds"] * probe["failureThreshold"]
    while time.monotonic() < deadline:
        assert container.state()["Running"], f"the worker exited while starting:\n{container.logs()}"
        try:
            if container.probe("startupProbe") == 200:
                return
        except OSError:
            pass  # the port is published before the process listens on it
        time.sleep(0.2)
    raise AssertionError(f"not started within the startup probe's budget:\n{container.logs()}")


@pytest.fixture(scope="module")
def worker(worker_manifests: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[PodContainer]:
    """The hello world's worker container, running and past its startup probe."""
    pod = worker_manifests["Deployment"]["spec"]["template"]["spec"]
    configmap = worker_manifests["ConfigMap"]
    container = PodContainer.start(pod, pod["containers"][0], {configmap["metadata"]["name"]: configmap["data"]},
                                   tmp_path_factory.mktemp("worker-volumes"))
    try:
        wait_until_started(container)
        yield container
    finally:
        container.remove()
